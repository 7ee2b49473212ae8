"""`pairctl config check|schema`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel

from orchestrator.cli.context import get_ctx
from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import RouteProfile
from orchestrator.config.targets import Target
from orchestrator.errors import ConfigError

app = typer.Typer(help="Validate manifests and print their JSON schemas.", no_args_is_help=True)

KINDS = {"target": Target, "profile": RouteProfile, "inventory": Inventory}


def _schemas() -> dict[str, type[BaseModel]]:
    from orchestrator.config import registry

    return registry.schemas()


@app.command("check")
def check(
    ctx: typer.Context,
    paths: Optional[list[Path]] = typer.Argument(None, help="Files to check; default: every manifest in the repo."),
    kind: Optional[str] = typer.Option(None, help="Kind of the files given (target, profile, inventory, ...); default: from their folder."),
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
    kind: str = typer.Argument(..., help="One of: " + ", ".join(sorted(["target", "profile", "inventory", "playbook", "plan", "kernel"]))),
) -> None:
    """Print the JSON schema of a manifest kind."""
    schemas = _schemas()
    if kind not in schemas:
        raise ConfigError(f"unknown kind {kind!r}; known: {', '.join(sorted(schemas))}")
    typer.echo(json.dumps(schemas[kind].model_json_schema(), indent=2))
