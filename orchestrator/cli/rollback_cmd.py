"""`pairctl rollback`: put the route record's previous pair back and verify it."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx


def rollback(ctx: typer.Context, pair: str = opts.PAIR) -> None:
    """Swap PAIR back to its previous pair (playbooks/rollback.yaml), restarted with argv
    rendered now from the inventory and its profile. Exit 6 (nothing changed) when the route
    record or links are damaged, unsigned or disagree (`pairctl repair` rebuilds the record);
    exit 8 if the rollback fails (hosts stopped, leases kept)."""
    # start-up: the engine (SSH stack) loads when a rollback runs, never for `--help`
    from orchestrator.engine.deploy import rollback as run_rollback
    from orchestrator.engine.render import print_result, progress_printer

    c = get_ctx(ctx)
    result = run_rollback(
        c.home,
        c.inventory(),
        pair,
        argv=["pairctl", *sys.argv[1:]],
        on_step=None if c.json_output else progress_printer(c.console),
    )
    if c.json_output:
        c.emit_json(result.to_dict())
    else:
        print_result(c.console, result)
