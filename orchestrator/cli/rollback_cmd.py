"""`pairctl rollback`: put the route record's previous pair back and verify it (one pair or many)."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx


def rollback(
    ctx: typer.Context,
    pair: list[str] | None = opts.PAIRS,
    all_pairs: bool = opts.ALL_PAIRS,
    canary: str | None = opts.CANARY,
    serial: int = opts.SERIAL,
    max_fail: int = opts.MAX_FAIL,
    pause: float = opts.PAUSE,
    waves: int = opts.WAVES,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Name the pair it would go back to and print every step; change nothing."
    ),
    to: list[str] | None = typer.Option(
        None,
        "--to",
        metavar="RELEASE",
        help="Go to this kept release instead of the previous pair (once: both hosts, its revision's "
        "release on the RPC host; twice: native, then rpc).",
    ),
) -> None:
    """Swap PAIR back to its previous pair (playbooks/rollback.yaml), restarted with argv
    rendered now from the inventory and its profile. Exit 6 (nothing changed) when the route
    record or links are damaged, unsigned or disagree (`pairctl repair` rebuilds the record);
    exit 8 if the rollback fails (hosts stopped, leases kept).

    \b
    Several --pair or --all: in waves like `deploy --rev` (--canary, --serial, --max-fail, --pause),
    each pair with its own leases and receipt, one fleet receipt naming them. Exit 0 all rolled back;
    8 any rollback failed; 5 some skipped because leased; else the code of a pair refused.
    """
    c = get_ctx(ctx)
    if to and (all_pairs or len(pair or []) != 1):
        raise typer.BadParameter("names a release of one pair: give exactly one --pair", param_hint="--to")
    if all_pairs or len(pair or []) != 1 or canary:
        from orchestrator.cli.fleet_cmd import run_fleet  # start-up: the engine loads only when it runs
        from orchestrator.ops.rollout import RolloutOptions

        o = RolloutOptions(canary=canary, serial=serial, max_fail=max_fail, pause_s=pause, waves=waves)
        run_fleet(c, "rollback", pair, all_pairs, o, dry_run=dry_run)
        return
    # start-up: the engine (SSH stack) loads when a rollback runs, never for `--help`
    from orchestrator.cli.fleet_cmd import failed_run_json, fire_rollback_hook
    from orchestrator.engine.deploy import rollback as run_rollback
    from orchestrator.engine.render import print_plan, print_result

    name = (pair or [""])[0]
    inv = c.inventory()
    with failed_run_json(c, "rollback", name), fire_rollback_hook(c, inv, name, enabled=not dry_run) as hook:
        result = run_rollback(c.home, inv, name, to=tuple(to or ()), dry_run=dry_run, argv=["pairctl", *sys.argv[1:]])
        hook["receipt"] = result.receipt
    if c.json_output:
        c.emit_json(result.to_dict())
    elif dry_run:
        print_plan(c.console, result.plan, command="rollback", target=result.active)
    else:
        print_result(c.console, result)
