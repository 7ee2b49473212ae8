"""The `pairctl` console script: typer apps, thin.

Each command parses, builds a context, calls one function. Only `main()` turns exceptions into
exit codes and messages, so no traceback ever reaches a user.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from orchestrator import __version__, log
from orchestrator.cli.context import Ctx, set_config_dir
from orchestrator.errors import ExitCode, PairctlError
from orchestrator.paths import Home

EXIT_CODES_HELP = "\n\n".join(f"{c.value:>3}  {c.name.lower()}" for c in ExitCode)

app = typer.Typer(
    name="pairctl",
    help=(
        "Build, deploy, accept, qualify and roll back matched llama.cpp native/RPC GPU pairs.\n\n"
        "State (packages, receipts, lab) lives under PAIRCTL_HOME (or --home).\n\n"
        f"Exit codes:\n\n{EXIT_CODES_HELP}"
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pairctl {__version__}")
        raise typer.Exit()


_CONFIG = typer.Option(None, "--config", envvar="PAIRCTL_CONFIG", help=(
    "Operator config directory, searched first (then ./pairctl/ upwards, the user config dir, the bundled defaults)."))


@app.callback()
def _root(
    ctx: typer.Context,
    home: Optional[Path] = typer.Option(None, "--home", envvar="PAIRCTL_HOME", help="pairctl's state directory."),
    inventory: str = typer.Option(
        "lab", "--inventory", "-i", envvar="PAIRCTL_INVENTORY", help="Inventory name (manifests/inventories) or YAML path."
    ),
    json_output: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (repeat for debug)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    config: Path | None = _CONFIG,
) -> None:
    h = Home.resolve(home)
    os.environ["PAIRCTL_HOME"] = str(h.root)  # children (lab sshd, schedules) see the same home
    config_dir = set_config_dir(config)
    log.configure(log_file=h.logs / "pairctl.jsonl", verbosity=verbose)
    ctx.obj = Ctx(home=h, inventory_ref=inventory, json_output=json_output, verbosity=verbose, config_dir=config_dir)


def _register() -> None:
    """Import command modules lazily at start-up (not at package import)."""
    from orchestrator.cli import commands  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    _register()
    try:
        rv = app(args=argv, standalone_mode=False)
    except PairctlError as exc:
        typer.echo(f"pairctl: error: {exc}", err=True)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        typer.echo("pairctl: interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("pairctl: aborted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:  # usage errors (typer bundles its own click) and anything unexpected
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            sys.exit(code)
        typer.echo(f"pairctl: internal error: {type(exc).__name__}: {exc}", err=True)
        typer.echo(f"(details in {Home.resolve().logs / 'pairctl.jsonl'})", err=True)
        try:
            log.get_logger().exception("internal error")
        except Exception:
            pass
        sys.exit(int(ExitCode.FAILURE))
    sys.exit(int(rv) if isinstance(rv, int) else 0)
