"""Every CLI option that more than one command takes, declared once.

The global options (`--json`, `-i/--inventory`, `--home`, `-v`) are attached by the lazy
registry (cli/lazy.py) to the root and to every command and group, so they are accepted before
and after the subcommand alike; whichever level gives one, its value lands in the one
`Globals` of the run (the last one given wins, `-v` adds up). Commands never declare them.

This module is imported on every start-up (`pairctl --version` included): typer only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperOption

if TYPE_CHECKING:  # typer >= 0.29 vendors click as typer._click; only types name it (see cli/lazy.py)
    from typer._click.core import Context, Parameter

DEFAULT_INVENTORY = "lab"

# --evidence of the receipts commands (cli/receipts_cmd.py, cli/receipts_prune.py)
EVIDENCE_OPT = typer.Option(
    None,
    "--evidence",
    metavar="DIR",
    envvar="PAIRCTL_EVIDENCE",
    help="Evidence store directory (default: <home>/evidence).",
)


@dataclass
class Globals:
    """The global options of one run, gathered from every level of the command line.

    `document` is the command's JSON output, held until the run ends so that `--json` always
    prints exactly one document (on failure it carries the `error` object, cli/__init__.py)."""

    home: Path | None = None
    inventory: str | None = None
    config: Path | None = None  # --config: the first layer of the config search path (PAIRCTL_CONFIG)
    json_output: bool = False
    verbosity: int = 0
    context: object = None  # the run's cli.context.Ctx, once built (that module imports this one)
    document: Any = None
    has_document: bool = False
    ran: bool = False  # a command body started (not only --help or a usage error)

    @property
    def inventory_ref(self) -> str:
        return self.inventory or os.environ.get("PAIRCTL_INVENTORY") or DEFAULT_INVENTORY


def _remember(ctx: Context, param: Parameter, value: Any) -> None:
    """Store a global option given at any level into the run's Globals (defaults never override)."""
    g = ctx.find_root().obj
    if not isinstance(g, Globals) or not value:
        return
    if param.name == "verbose":
        g.verbosity += int(value)
    elif param.name in _SET:
        setattr(g, param.name, _SET[param.name](value))


_SET: dict[str, Any] = {"json_output": lambda _: True, "home": Path, "inventory": str, "config": Path}


def _global_options(
    json_output: bool = typer.Option(
        False,
        "--json",
        help="Machine output: exactly one JSON document on stdout, on success and on failure.",
    ),
    inventory: str | None = typer.Option(
        None,
        "--inventory",
        "-i",
        metavar="NAME|PATH",
        help="Inventory name (on the config search path) or YAML path; default $PAIRCTL_INVENTORY or 'lab'.",
    ),
    home: Path | None = typer.Option(
        None,
        "--home",
        metavar="DIR",
        help="pairctl's state directory; default $PAIRCTL_HOME or the user state directory.",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        metavar="DIR",
        help="Operator config directory, searched first (then ./pairctl/ upwards, the user config dir, the "
        "bundled defaults); default $PAIRCTL_CONFIG.",
    ),
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        show_default=False,
        help="More log output on stderr (repeat for debug).",
    ),
) -> None:
    """Template whose parameters become the global options (never run)."""


class _Uncoerced(TyperOption):
    """A global option whose value is used as click parsed it (str, bool, count).

    typer 0.29 coerces every parameter through a pydantic TypeAdapter, and the root's options
    (these, --version, --help, completion) are processed before a subcommand's `--help`: skipping
    it keeps pydantic out of `pairctl COMMAND --help` (start-up budget). Only for
    options whose parsed value is already what the callback wants (flags, counts, plain text)."""

    def process_value(self, ctx: Any, value: Any) -> Any:
        return self.callback(ctx, self, value) if self.callback is not None else value


@cache
def global_params() -> tuple[Any, ...]:
    """The global options as click parameters, built by typer from `_global_options`: each one
    only lands in the run's Globals (`_remember`), never in a command's arguments."""
    t = typer.Typer(add_completion=False)
    t.command()(_global_options)
    params = typer.main.get_command(t).params
    for p in params:
        p.callback, p.expose_value = _remember, False
    return tuple(uncoerced(p) for p in params)


def uncoerced(param: Any) -> Any:
    """The same option, its parsed value used as is (see _Uncoerced); other parameters unchanged."""
    if isinstance(param, TyperOption) and not isinstance(param, _Uncoerced):
        param.__class__ = _Uncoerced
    return param


# Options several commands share: one declaration each.
PAIR = typer.Option(..., "--pair", metavar="PAIR", help="Pair name from the inventory.")
PAIRS = typer.Option(None, "--pair", metavar="PAIR", help="Pair name from the inventory (repeatable).")
ALL_PAIRS = typer.Option(False, "--all", help="Every pair of the inventory.")
PROFILE = typer.Option(None, "--profile", metavar="NAME|PATH", help="Route profile (default: the pair's).")
CHECKS = typer.Option(
    None, "--checks", metavar="NAME[,NAME]", help="Run only these acceptance checks (repeatable or comma-separated)."
)
SKIP_CHECKS = typer.Option(
    None, "--skip", metavar="NAME[,NAME]", help="Skip these checks (repeatable or comma-separated)."
)
NATIVE = typer.Option(None, "--native", metavar="ID", help="Package id for the native host (llama-server).")
RPC = typer.Option(None, "--rpc", metavar="ID", help="Package id for the RPC host (ggml-rpc-server).")
PACKAGES = typer.Option(
    None,
    "--packages",
    metavar="NATIVE_ID RPC_ID",
    help="Both package ids at once (same as --native ID --rpc ID); an id never starts with '-'.",
)

# Rollouts (deploy --rev, rollback over several pairs): orchestrator/ops/rollout.py.
CANARY = typer.Option(
    None, "--canary", metavar="PAIR", help="Run this pair alone first (its own wave); stop if it fails."
)
SERIAL = typer.Option(1, "--serial", min=1, metavar="N", help="Pairs per wave (a wave's pairs run in parallel).")
MAX_FAIL = typer.Option(1, "--max-fail", min=1, metavar="K", help="Start no more pairs after K failures.")
PAUSE = typer.Option(0.0, "--pause", min=0.0, metavar="S", help="Seconds to wait between waves.")
WAVES = typer.Option(
    0,
    "--waves",
    metavar="N",
    help="Run N waves, then pause (exit 0, the rest 'paused'); the same command again continues (Argo's "
    "pause and promote: pairs already done are skipped). Default: every wave.",
)


def parallel(default: int, what: str) -> Any:
    return typer.Option(default, "--parallel", min=1, metavar="N", help=f"{what} at once.")


def names(values: list[str] | None) -> list[str]:
    """Repeatable, comma-separated names (`--checks a,b --checks c`) as one list."""
    return [n.strip() for v in values or [] for n in v.split(",") if n.strip()]


def check_names(values: list[str] | None, flag: str = "--checks") -> list[str]:
    """`names` of acceptance checks; an unknown one is a usage error (exit 2) naming the known ones."""
    from orchestrator.checks.suite import CHECKS  # start-up: only a command that runs checks gets here

    got = names(values)
    unknown = [n for n in got if n not in CHECKS]
    if unknown:
        raise typer.BadParameter(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(CHECKS)}", param_hint=flag)
    return got


def package_ids(
    native: str | None, rpc: str | None, packages: tuple[str, str] | None, *, flag: str = "--packages"
) -> tuple[str, str]:
    """NATIVE_ID, RPC_ID from `--native ID --rpc ID` or `--packages A B`, refusing anything that
    looks like an option: click hands `--packages nat1 --dry-run` the text `--dry-run` as an id."""
    if packages is not None and (native is not None or rpc is not None):
        raise typer.BadParameter(
            f"give either {flag} NATIVE_ID RPC_ID or --native ID --rpc ID, not both", param_hint=flag
        )
    ids = tuple(packages) if packages is not None else (native, rpc)
    missing = [n for n, v in zip(("--native", "--rpc"), ids, strict=True) if not v]
    if missing:
        raise typer.BadParameter(
            f"missing {' and '.join(missing)} (or {flag} NATIVE_ID RPC_ID)", param_hint="/".join(missing)
        )
    refuse_option_like(ids, flag)
    return str(ids[0]), str(ids[1])


def refuse_option_like(ids: tuple[str | None, ...], flag: str) -> None:
    """A value that starts with '-' was an option swallowed by a two-value flag: refuse it."""
    for v in ids:
        if v is not None and v.startswith("-"):
            raise typer.BadParameter(
                f"{v!r} is not a package id (ids never start with '-'); give one id per flag (--native ID --rpc ID)",
                param_hint=flag,
            )
