"""`pairctl restart | start | stop`: the active pair in place (Kamal's `app boot | start | stop`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx

if TYPE_CHECKING:
    from orchestrator.engine.services_run import Verb

DRY_RUN = typer.Option(
    False,
    "--dry-run",
    help="Read the hosts (no lease) and print every step with the exact command it runs; change nothing.",
)


def _run(ctx: typer.Context, verb: Verb, pair: str, dry_run: bool) -> None:
    # start-up: the engine (SSH stack) loads when the command runs, never for `--help`
    from orchestrator.cli.fleet_cmd import failed_run_json
    from orchestrator.engine.render import print_plan, print_result
    from orchestrator.engine.services_run import run_services

    c = get_ctx(ctx)
    inv = c.inventory()
    with failed_run_json(c, verb, pair):
        result = run_services(c.home, inv, pair, verb, dry_run=dry_run, argv=["pairctl", *sys.argv[1:]])
    if c.json_output:
        c.emit_json(result.to_dict())
        return
    if result.outcome == "nothing to start":
        c.line(f"start {pair}: nothing to start, both services run (restart restarts them)")
    elif dry_run:
        a = result.active or {}
        c.line(f"{verb}s: {a.get('native_package')} + {a.get('rpc_package')} ({a.get('profile_name')})")
        print_plan(c.console, result.plan, command=verb)
    else:
        print_result(c.console, result)


def restart(ctx: typer.Context, pair: str = opts.PAIR, dry_run: bool = DRY_RUN) -> None:
    """Restart PAIR's active pair in place (Kamal's `app boot`): under both leases, verify each
    release on its host, stop llama-server, restart ggml-rpc-server, start llama-server, verify
    identities (sha256, argv, build_info, slots). The releases, links and route record stay; argv
    are rendered now from the inventory and the recorded profile, as a rollback renders them.

    \b
    Exit 0 restarted; 6 never deployed, or damaged route record or links (nothing changed);
    4 a host unreachable, 5 leased (nothing changed); 8 failed after the first stop (both
    services stopped, leases kept: `pairctl logs`, then deploy or rollback)."""
    _run(ctx, "restart", pair, dry_run)


def start(ctx: typer.Context, pair: str = opts.PAIR, dry_run: bool = DRY_RUN) -> None:
    """Start PAIR's active pair after `pairctl stop` (or a crash the supervisor gave up on): the
    same steps as restart. When both services already run, nothing is started ('nothing to
    start', exit 0; restart restarts them). Exit codes as restart."""
    _run(ctx, "start", pair, dry_run)


def stop(ctx: typer.Context, pair: str = opts.PAIR, dry_run: bool = DRY_RUN) -> None:
    """Stop both services of PAIR (llama-server first) and their supervisors, under both leases,
    so nothing restarts them, not even a reboot. Releases, links and the route record stay:
    `pairctl start` brings the same pair back; `status` shows it stopped (a problem, exit 1).

    \b
    Exit 0 stopped; 6 never deployed or damaged host state; 4, 5 nothing changed; 8 a stop failed
    (leases kept)."""
    _run(ctx, "stop", pair, dry_run)
