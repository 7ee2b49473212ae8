"""Commands registered by name and imported only when they run (click's LazyGroup pattern).

`pairctl --help` lists the registry's one-line summaries without importing any command module.
For the same start-up budget (benchmarks/startup.py) a command body imports what only it needs
inside the function, never at the top of its module: `--help` loads none of it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from orchestrator import progress
from orchestrator.cli.options import Globals, global_params, uncoerced

if TYPE_CHECKING:  # typer >= 0.29 vendors click as the private typer._click; only types name it, so
    # pairctl starts on the older typer its floor allows (whose Context is click's)
    from typer._click.core import Context


@dataclass(frozen=True)
class Lazy:
    """Where a command lives ("module:attribute", a typer app or a command function) and its
    one-line summary for the root help (so listing commands imports none of them)."""

    target: str
    summary: str


def load(name: str, entry: Lazy) -> Any:
    """Import the module and turn its typer app or function into a prepared click command."""
    module, _, attr = entry.target.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    cmd: Any
    if isinstance(obj, typer.Typer):
        cmd = typer.main.get_group(obj)
    else:
        t = typer.Typer(add_completion=False)
        t.command(name, short_help=entry.summary)(obj)
        cmd = typer.main.get_command(t)
    cmd.name = name
    return prepare(cmd)


def prepare(cmd: Any) -> Any:
    """Attach the global options, readable metavars, plain help and the run set-up, recursively."""
    if getattr(cmd, "_pairctl_prepared", False):
        return cmd
    cmd._pairctl_prepared = True
    have = {p.name for p in cmd.params}
    cmd.params.extend(p for p in global_params() if p.name not in have)
    for p in cmd.params:
        kind = getattr(p, "param_type_name", "")
        takes_value = not getattr(p, "is_flag", False) and not getattr(p, "count", False)
        if kind == "option" and p.metavar is None and takes_value:
            p.metavar = (p.name or "value").upper()
        elif kind == "argument":
            p.get_help_record = _untyped_help(p.get_help_record)
    cmd.rich_markup_mode = None
    if cmd.callback is not None:
        cmd.callback = _with_run_context(cmd.callback)
    for sub in getattr(cmd, "commands", {}).values():
        prepare(sub)
    return cmd


def _untyped_help(record: Callable[[Context], tuple[str, str] | None]) -> Callable[[Context], tuple[str, str] | None]:
    """An argument's help row names it (`ID`), without typer's `<str>` after the name."""

    def plain(ctx: Context) -> tuple[str, str] | None:
        rv = record(ctx)
        return None if rv is None else (rv[0].split(" <", 1)[0], rv[1])

    return plain


def _with_run_context(callback: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        ctx = typer.main.get_current_context()
        if ctx.invoked_subcommand is None:
            g = ctx.find_root().obj
            if isinstance(g, Globals):
                g.ran = True
            from orchestrator.cli.context import get_ctx

            get_ctx(ctx)
            with progress.to_stderr():
                return callback(*args, **kwargs)
        return callback(*args, **kwargs)

    return run


class LazyGroup(TyperGroup):
    """A typer group whose subcommands come from `registry` (name -> Lazy) on first use."""

    registry: Mapping[str, Lazy] = {}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        have = {p.name for p in self.params}
        self.params.extend(p for p in global_params() if p.name not in have)

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        for p in self.params:  # --version and completion (added after __init__): flags, parsed before any subcommand
            if getattr(p, "is_flag", False):
                uncoerced(p)
        return super().parse_args(ctx, args)

    def get_help_option(self, ctx: Context) -> Any:
        return uncoerced(super().get_help_option(ctx))

    def list_commands(self, ctx: Context) -> list[str]:
        return [*self.registry, *(n for n in self.commands if n not in self.registry)]

    def get_command(self, ctx: Context, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in self.registry:
            self.commands[cmd_name] = load(cmd_name, self.registry[cmd_name])
        cmd = self.commands.get(cmd_name)
        return prepare(cmd) if cmd is not None else None

    def resolve_command(self, ctx: Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name = args[0]
        cmd = self.get_command(ctx, name)
        if cmd is None and not ctx.resilient_parsing:
            if name.startswith("-"):
                self.parse_args(ctx, args)  # an unknown option: click's own message
            close = get_close_matches(name, self.list_commands(ctx))
            ctx.fail(f"No such command {name!r}." + (f" Did you mean {', '.join(map(repr, close))}?" if close else ""))
        return (name if cmd is not None else None), cmd, args[1:]

    def format_commands(self, ctx: Context, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.registry:
                rows.append((name, self.registry[name].summary))
            elif not self.commands[name].hidden:
                rows.append((name, self.commands[name].get_short_help_str(80)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
