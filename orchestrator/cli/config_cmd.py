"""`pairctl config check|show|schema`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from orchestrator.cli.context import get_ctx
from orchestrator.errors import ConfigError

app = typer.Typer(help="Validate manifests, show where names resolve, print JSON schemas.", no_args_is_help=True)


@app.command("check")
def check(
    ctx: typer.Context,
    paths: list[Path] | None = typer.Argument(
        None, help="Files to check; default: every name on the config search path."
    ),
    kind: str | None = typer.Option(
        None,
        metavar="KIND",
        help="Kind of the files given (target, profile, inventory, ...); default: from their folder, else from "
        "their keys.",
    ),
) -> None:
    """Validate manifests: every problem of a file in one pass (unknown keys, wrong types, impossible
    values, and names it uses that do not resolve: profile, targets, model roles), each with file,
    field and fix."""
    from orchestrator.cli import config_registry as registry  # start-up: the manifest models load when it runs

    c = get_ctx(ctx)
    if not paths:
        _check_here_too()
    models = registry.schemas()
    results = [registry.check_file(p, kind=kind, models=models) for p in (paths or registry.default_files())]
    bad = [r for r in results if not r.ok]
    if c.json_output:
        c.emit_json(
            [
                {
                    "file": str(r.path),
                    "kind": r.kind,
                    "ok": r.ok,
                    "problems": list(r.problems),
                    "error": "\n".join(r.problems) or None,
                }
                for r in results
            ]
        )
    else:
        for r in results:
            kind_note = f"  ({r.kind})" if r.kind else ""
            c.line(f"{'ok  ' if r.ok else 'FAIL'} {r.path}{kind_note}")
            for line in r.problems:
                c.line("  " + line)
    if bad:
        n = sum(len(r.problems) for r in bad)
        raise ConfigError(f"{len(bad)} of {len(results)} file(s) invalid ({n} problem{'s' if n != 1 else ''})")


def _check_here_too() -> None:
    """Run inside a config directory (`pairctl init DIR`, then `cd DIR`) that is not on the search
    path: check its files as if it were (`--config .`), and say that other commands will not read
    it until PAIRCTL_CONFIG names it. Otherwise an operator's own inventory goes unchecked while
    `config check` says all is well."""
    import os
    import sys

    from orchestrator.config import search

    here = Path.cwd().resolve()
    own = [here / search.KIND_DIRS[k] for k in ("inventory", "profile")]
    if not any(d.is_dir() and any(d.glob("*.yaml")) for d in own):
        return
    if any(layer.root == here for layer in search.current_layers()):
        return
    os.environ[search.CONFIG_ENV] = str(here)
    print(
        f"pairctl: note: {here} is a config directory that is not on the search path; its files are checked "
        f"as with --config {here}, but other commands will not read them until you `export "
        f"PAIRCTL_CONFIG={here}` (or pass --config)",
        file=sys.stderr,
    )


@app.command("show")
def show(ctx: typer.Context) -> None:
    """The config search path, and where each name resolves (an operator file overrides a bundled
    one of the same name)."""
    from orchestrator.config import search  # start-up: loaded when the command runs

    c = get_ctx(ctx)
    layers = search.current_layers()
    table = {kind: search.names(kind, layers) for kind in search.KIND_DIRS}
    if c.json_output:
        c.emit_json(
            {
                "search_path": [{"origin": lay.origin, "root": str(lay.root)} for lay in layers],
                "names": {
                    kind: {
                        n: {"path": str(r.path), "origin": r.origin, "overrides": [str(p) for p in r.shadows]}
                        for n, r in res.items()
                    }
                    for kind, res in table.items()
                },
            }
        )
        return
    c.line("search path (first match wins):")
    for i, lay in enumerate(layers, 1):
        c.line(f"  {i}. {lay.origin:<15} {lay.root}")
    for kind, res in table.items():
        c.line(f"\n{kind} ({search.KIND_DIRS[kind]}/):")
        for n, r in res.items():
            over = f"  (overrides {', '.join(str(p) for p in r.shadows)})" if r.shadows else ""
            c.line(f"  {n:<20} {r.origin:<15} {r.path}{over}")


@app.command("schema")
def schema(
    ctx: typer.Context,
    kind: str = typer.Argument(
        ...,
        metavar="KIND",
        help="A manifest kind (target, profile, inventory, playbook, plan, kernel), or output.COMMAND for the JSON "
        "a command prints with --json (output.deploy, output.status, output.error, ...; `output`: all).",
    ),
) -> None:
    """Print the JSON schema of a manifest kind or of a command's --json output."""
    from orchestrator.cli.outputs import OUTPUTS, output_schema

    if kind == "output":
        doc: object = {name: output_schema(name) for name in OUTPUTS}
    elif kind.startswith("output."):
        if kind[len("output.") :] not in OUTPUTS:
            raise ConfigError(f"unknown output {kind!r}; known: {', '.join('output.' + n for n in OUTPUTS)}")
        doc = output_schema(kind[len("output.") :])
    else:
        from orchestrator.cli import config_registry as registry

        schemas = registry.schemas()
        if kind not in schemas:
            raise ConfigError(f"unknown kind {kind!r}; known: {', '.join(sorted(schemas))}, output.COMMAND")
        doc = schemas[kind].model_json_schema()
    c = get_ctx(ctx)
    if c.json_output:
        c.emit_json(doc)
    else:
        typer.echo(json.dumps(doc, indent=2))
