"""What every command gets: the state home, the inventory, output mode, a console.

Built once per run from the global options (cli/options.py: Globals) and passed down (httpie's
Environment idea), so tests drive the real CLI with their own home and inventory.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from orchestrator import terminal
from orchestrator.cli.options import Globals
from orchestrator.paths import Home

if TYPE_CHECKING:  # typer >= 0.29 vendors click as typer._click; only types name it (see cli/lazy.py)
    from rich.console import Console
    from typer._click.core import Context

    from orchestrator.config.inventory import Inventory
    from orchestrator.evidence.store import EvidenceStore

# Without a TTY (logs, CI, pipes) nothing is cut to 80 columns: tables take the width their
# content needs (rich only measures up to this).
_UNBOUNDED_WIDTH = 100_000


def make_console() -> Console:
    """Tables for people on a TTY; the same content, never truncated, everywhere else."""
    # start-up: every command module imports this one, and `COMMAND --help` needs no rich
    # (orchestrator.terminal imports rich only when a console is made)
    if sys.stdout.isatty():
        return terminal.console(highlight=False, soft_wrap=True)
    return terminal.console(highlight=False, soft_wrap=True, width=_UNBOUNDED_WIDTH)


def first_line(text: str | None) -> str:
    """A table cell shows a multi-line reason's first line; `receipts show` keeps all of it."""
    lines = (text or "").strip().splitlines()
    if not lines:
        return ""
    return lines[0] + (" …" if len(lines) > 1 else "")


@dataclass
class Ctx:
    home: Home
    inventory_ref: str
    json_output: bool = False
    verbosity: int = 0
    console: Console = field(default_factory=make_console)
    run: Globals | None = None
    _inventory: Inventory | None = None
    config_dir: Path | None = None  # --config / PAIRCTL_CONFIG: the first layer of the config search path

    @classmethod
    def from_globals(cls, g: Globals) -> Ctx:
        # start-up: structlog is loaded when a command runs, never for `--help`
        from orchestrator import log

        home = Home.resolve(g.home)
        os.environ["PAIRCTL_HOME"] = str(home.root)  # children (lab sshd, schedules) see the same home
        config_dir = set_config_dir(g.config)
        log.configure(log_file=home.logs / "pairctl.jsonl", verbosity=g.verbosity)
        return cls(home, g.inventory_ref, g.json_output, g.verbosity, run=g, config_dir=config_dir)

    @property
    def interactive(self) -> bool:
        return self.console.is_terminal

    def inventory(self) -> Inventory:
        if self._inventory is None:
            # start-up: the config stack is loaded by the commands that read an inventory
            from orchestrator.config.inventory import load_inventory

            self._inventory = load_inventory(self.inventory_ref, {"PAIRCTL_HOME": str(self.home.root)})
        return self._inventory

    def short(self, digest: str | None, n: int = 12) -> str:
        """A hash or id shortened for a person's terminal; whole without a TTY."""
        if not digest:
            return "-"
        return digest[:n] if self.interactive else digest

    def say(self, doc: Any, *lines: str) -> None:
        """With --json the command's document, else its lines for a person."""
        if self.json_output:
            self.emit_json(doc)
            return
        self.line(*lines)

    def line(self, *lines: str) -> None:
        """Lines for a person, as plain text: text read from hosts or receipts is never rich markup."""
        for line in lines:
            self.console.print(line, markup=False)

    def emit_json(self, data: Any) -> None:
        """The command's one JSON document: held until the run ends (main prints it, with the
        `error` object when the command fails); written at once when no run holds it (tests)."""
        doc = json.loads(json.dumps(data, default=str))
        if self.run is not None:
            self.run.document, self.run.has_document = doc, True
            return
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()


def evidence_store_for(ctx: Context | Ctx, evidence_dir: Path | str | None = None) -> EvidenceStore:
    """The store a command writes to: `--evidence DIR` if given, else the home's evidence folder."""
    from orchestrator.evidence.store import EvidenceStore

    c = ctx if isinstance(ctx, Ctx) else get_ctx(ctx)
    return EvidenceStore(Path(evidence_dir) if evidence_dir else c.home.evidence)


def usage(message: str) -> NoReturn:
    """A bad option value: exit 2 like click's usage errors, without a traceback."""
    typer.echo(f"pairctl: error: {message}", err=True)
    raise typer.Exit(2)


def get_ctx(ctx: Context) -> Ctx:
    """The run's context, built from the global options the first time a command asks."""
    obj = ctx.find_root().obj
    if isinstance(obj, Ctx):
        return obj
    assert isinstance(obj, Globals), "pairctl's main() did not set up the run"
    if not isinstance(obj.context, Ctx):
        obj.context = Ctx.from_globals(obj)
    return obj.context


def log_internal_error(g: Globals) -> Path:
    """Record an unexpected exception with its traceback in the JSON log (never on the terminal)."""
    from orchestrator import log

    c = g.context if isinstance(g.context, Ctx) else Ctx.from_globals(g)
    log.get_logger().exception("internal error")
    return c.home.logs / "pairctl.jsonl"


def set_config_dir(config: Path | None) -> Path | None:
    """`--config DIR` into PAIRCTL_CONFIG, which every loader (and child process) reads through
    orchestrator.config.search; a directory that does not exist is refused here, once."""
    # start-up: loaded when a command runs, never for `--help`
    from orchestrator.config import search
    from orchestrator.errors import ConfigError

    if config is None:
        return None
    d = config.expanduser().resolve()
    if not d.is_dir():
        raise ConfigError(f"--config {config}: no such directory", hint="create one with `pairctl init DIR`")
    os.environ[search.CONFIG_ENV] = str(d)
    return d


def resolve_path(p: str | Path) -> Path:
    return Path(p).expanduser().resolve()
