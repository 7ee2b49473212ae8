"""`pairctl restart | start | stop`: the active pair restarted, started or stopped in place, under both leases.

Rollback's machinery (engine/deploy.py `put_back`): the route record's active entry rendered now
(never the recorded argv), links left as found, the route record not written. A failure after the
first change ends like a failed rollback: both services stopped, leases kept, exit 8.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from orchestrator.build.store import PackageStore
from orchestrator.config.inventory import Inventory
from orchestrator.engine import route_trust, targets
from orchestrator.engine.context import Pool, RunEnv
from orchestrator.engine.deploy import PutBack, RunResult, put_back
from orchestrator.engine.runner import StepOutcome
from orchestrator.errors import HostStateError
from orchestrator.paths import Home
from orchestrator.roles import ROLES, SERVICE_OF_ROLE

Verb = Literal["restart", "start", "stop"]


def run_services(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    verb: Verb,
    *,
    dry_run: bool = False,
    argv: list[str] | None = None,
    on_step: Callable[[StepOutcome], None] | None = None,
    pool: Pool | None = None,
) -> RunResult:
    """Restart, start or stop PAIR's active pair in place. `dry_run` reads the hosts without
    leases and returns the plan (the exact commands); nothing changes."""

    def decide(ctx: RunEnv, judged: route_trust.Judgement, store: PackageStore) -> PutBack:
        rec = judged.record
        if rec is None or rec.active is None:
            raise HostStateError(
                f"{verb} refused, nothing was changed: pair {pair_name} "
                + ("was never deployed (no route record)" if rec is None else "has no active pair recorded"),
                hint=f"`pairctl deploy --pair {pair_name} --native ID --rpc ID` deploys one",
            )
        tgt = targets.restore_target(
            ctx.view,
            inventory.pair(pair_name),
            rec.active,
            store,
            label="active",
            trusted=rec.mac_ok(ctx.inputs.route_key),
        )
        links: dict[str, tuple[str | None, str | None]] = {
            r: (ctx.hosts.facts[r].current, ctx.hosts.facts[r].previous) for r in ROLES
        }
        running = {r: SERVICE_OF_ROLE[r] in ctx.hosts.facts[r].running for r in ROLES}
        # Kamal's `app start` on a running app: nothing to start (restart restarts it)
        noop = (
            f"nothing to start: both services of {pair_name} run" if verb == "start" and all(running.values()) else None
        )
        return PutBack(rec.active, tgt, links, None, noop)

    return put_back(
        home,
        inventory,
        pair_name,
        verb,
        {},
        decide,
        dry_run=dry_run,
        argv=argv,
        on_step=on_step,
        pool=pool,
    )
