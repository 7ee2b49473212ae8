"""`pairctl repair`: rebuild a pair's route record from the links, manifests and evidence."""

from __future__ import annotations

import json
import sys

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx


def repair(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    yes: bool = typer.Option(False, "--yes", help="Write the rebuilt record (without: show it only)."),
) -> None:
    """Show (and with --yes write) the route record PAIR's links, manifests and this home's
    evidence support, when deploy or rollback refused a missing, damaged or disagreeing record
    (exit 6). Nothing that runs changes. Recorded in a receipt."""
    # start-up: the engine (SSH stack) loads when a repair runs, never for `--help`
    from orchestrator.engine.repair import repair as run_repair

    c = get_ctx(ctx)
    result = run_repair(c.home, c.inventory(), pair, write=yes, argv=["pairctl", *sys.argv[1:]])
    if c.json_output:
        c.emit_json(result.to_dict())
        return
    for p in result.problems:
        c.line(f"problem: {p}")
    healthy = not result.problems and not result.written
    if healthy:  # the record the hosts hold already judges clean: say so first, not after 300 lines
        c.line(f"nothing to repair: pair {pair}'s route record is valid, signed and agrees with both hosts' links")
        if c.verbosity < 1:
            c.line("(-v shows the record it would write)")
            return
    for label, text in result.sources.items():
        c.line(f"{label}: {text}")
    c.line(json.dumps(result.record, indent=2, sort_keys=True))
    if result.written:
        c.line(f"written on both hosts (receipt {result.receipt})")
    else:
        c.line(f"nothing written; `pairctl repair --pair {pair} --yes` writes this record")
