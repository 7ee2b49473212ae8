"""`pairctl status`: what runs on a pair, whether it matches, the route record, leases."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli.context import get_ctx


def status(ctx: typer.Context, pair: str = typer.Option(..., "--pair", help="Pair name from the inventory.")) -> None:
    """Show PAIR's current/previous releases, services, route record and leases (read-only).
    Exit 1 when something does not match."""
    from orchestrator.engine.render import print_status
    from orchestrator.engine.status import status as run_status

    c = get_ctx(ctx)
    out = run_status(c.home, c.inventory(), pair, argv=["pairctl", *sys.argv[1:]])
    if c.json_output:
        c.emit_json(out)
    else:
        print_status(c.console, out)
    if out["problems"]:
        raise typer.Exit(1)
