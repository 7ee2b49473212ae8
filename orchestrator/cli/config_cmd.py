"""`pairctl config check|schema`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.cli.context import get_ctx
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

app = typer.Typer(help="Validate manifests and print their JSON schemas.", no_args_is_help=True)

def _schemas() -> dict[str, type[BaseModel]]:
    from orchestrator.config import registry

    return registry.schemas()


@app.command("check")
def check(
    ctx: typer.Context,
    paths: list[Path] | None = typer.Argument(None, help="Files to check; default: every manifest in the repo."),
    kind: str | None = typer.Option(None,
        help="Kind of the files given (target, profile, inventory, ...); default: from their folder."),
) -> None:
    """Validate manifests: unknown keys, wrong types and impossible values are named with file and field."""
    c = get_ctx(ctx)
    from orchestrator.config import registry

    results = registry.check_all(paths or None, kind=kind, variables=c.variables)
    problems = [r for r in results if r[1] is not None]
    if c.json_output:
        c.emit_json([{"file": str(p), "ok": e is None, "error": e} for p, e in results])
    else:
        for p, e in results:
            c.console.print(f"{'ok  ' if e is None else 'FAIL'} {p}")
            if e:
                c.console.print(e, markup=False)
    if problems:
        raise ConfigError(f"{len(problems)} of {len(results)} file(s) invalid")


@app.command("schema")
def schema(
    ctx: typer.Context,
    kind: str = typer.Argument(..., metavar="KIND",
        help="A manifest kind (target, profile, inventory, playbook, plan, kernel), or output.COMMAND for the JSON "
             "a command prints with --json (output.deploy, output.status, output.error, ...; `output`: all)."),
) -> None:
    """Print the JSON schema of a manifest kind or of a command's --json output."""
    from orchestrator.cli.outputs import OUTPUTS, output_schema

    if kind == "output":
        doc: object = {name: output_schema(name) for name in OUTPUTS}
    elif kind.startswith("output."):
        if kind[len("output."):] not in OUTPUTS:
            raise ConfigError(f"unknown output {kind!r}; known: {', '.join('output.' + n for n in OUTPUTS)}")
        doc = output_schema(kind[len("output."):])
    else:
        schemas = _schemas()
        if kind not in schemas:
            raise ConfigError(f"unknown kind {kind!r}; known: {', '.join(sorted(schemas))}, output.COMMAND")
        doc = schemas[kind].model_json_schema()
    c = get_ctx(ctx)
    if c.json_output:
        c.emit_json(doc)
    else:
        typer.echo(json.dumps(doc, indent=2))
