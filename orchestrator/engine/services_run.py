"""`pairctl restart | start | stop`: the active pair restarted, started or stopped in place, under both leases.

Rollback's machinery (engine/deploy.py `_pair_run`): the route record's active entry rendered now
(never the recorded argv), links left as found, the route record not written. A failure after the
first change ends like a failed rollback: both services stopped, leases kept, exit 8.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from orchestrator.build.store import PackageStore
from orchestrator.config.inventory import Inventory, read_api_key
from orchestrator.engine import activate, route_trust, targets
from orchestrator.engine.actions import ACTIONS, load_playbook
from orchestrator.engine.context import Pool, RunEnv
from orchestrator.engine.deploy import (
    Restore,
    RunResult,
    _abort,
    _cause,
    _final_state,
    _inputs,
    _judge_hosts,
    _n_prefix,
    _pair_run,
    _restore_plan,
    _run_prefix,
    _verify_restore_releases,
    held_leases,
)
from orchestrator.engine.plan import Target, pair_view, plan
from orchestrator.engine.runner import StepFailed, StepOutcome, run_steps
from orchestrator.errors import HostStateError, PairctlError, RollbackFailed
from orchestrator.paths import Home
from orchestrator.roles import ROLES, SERVICE_OF_ROLE

Verb = Literal["restart", "start", "stop"]
PLAYBOOK: dict[str, str] = {"restart": "restart", "start": "restart", "stop": "stop"}
DONE = {"restart": "restarted", "start": "started", "stop": "stopped"}


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
    view = pair_view(inventory, pair_name)
    name = PLAYBOOK[verb]
    pb = load_playbook(name)
    inputs = _inputs(inventory, name)
    with _pair_run(
        home,
        inventory,
        view,
        command=verb,
        dry_run=dry_run,
        inputs=inputs,
        argv=argv,
        on_step=on_step,
        pool=pool,
    ) as (ctx, result, record):
        journal = ctx.journal
        key = read_api_key(pair_name, inventory.pair(pair_name))  # verify's /props and /slots reads need it
        steps = plan(pb, view, facts=None, target=None, restores=True)
        n_prefix = _n_prefix(steps)
        try:
            _run_prefix(ctx, steps, dry_run, record)
            rec = _judge_hosts(ctx, verb, route_trust.ROLLBACK_ALLOWS).record
            if rec is None or rec.active is None:
                raise HostStateError(
                    f"{verb} refused, nothing was changed: pair {pair_name} "
                    + ("was never deployed (no route record)" if rec is None else "has no active pair recorded"),
                    hint=f"`pairctl deploy --pair {pair_name} --native ID --rpc ID` deploys one",
                )
            store = PackageStore(home.store)
            tgt = targets.restore_target(
                view,
                inventory.pair(pair_name),
                rec.active,
                store,
                label="active",
                trusted=rec.mac_ok(ctx.inputs.route_key),
            )
            links: dict[str, tuple[str | None, str | None]] = {
                r: (ctx.hosts.facts[r].current, ctx.hosts.facts[r].previous) for r in ROLES
            }
            if not dry_run and verb != "stop":
                _verify_restore_releases(ctx, rec.active, store, tgt, verb)
        except (StepFailed, PairctlError) as exc:
            failure = exc if isinstance(exc, StepFailed) else None
            _abort(ctx, failure or StepFailed(steps[n_prefix - 1], {"local": exc}), record)
            raise (_cause(failure) if failure else exc) from None
        full = _restore_plan(ctx, pb, None, Restore(tgt, links, key))
        result.plan = [s.to_dict() for s in full]
        journal.set("plan", result.plan)
        journal.set("target", {"pair": tgt.entry.names(), "how": verb})
        running = {r: SERVICE_OF_ROLE[r] in ctx.hosts.facts[r].running for r in ROLES}
        if verb == "start" and all(running.values()):
            # Kamal's `app start` on a running app: nothing to start (restart restarts it)
            if not dry_run:
                run_steps([s for s in full if s.action == "release-lease"], ctx, ACTIONS, journal=journal,
                          on_step=record)  # fmt: skip
                record.raise_if_release_failed(ctx, "nothing to start")
            return result.passed(
                journal, "nothing to start", f"nothing to start: both services of {pair_name} run", tgt
            )
        if dry_run:
            return result.passed(journal, "dry-run", f"dry run: would {verb} {tgt.entry.names()}", tgt)
        try:
            run_steps(full[n_prefix:], ctx, ACTIONS, journal=journal, on_step=record)
        except StepFailed as failed:
            if not ctx.recorder.changed:
                _abort(ctx, failed, record)
                raise _cause(failed) from None
            _failed_after_change(ctx, failed, verb, tgt)
        journal.set("final_state", _final_state(DONE[verb], tgt))
        done = f"{DONE[verb]} {pair_name}: {tgt.entry.names()}"
        record.raise_if_release_failed(ctx, done)
        return result.passed(journal, "passed", done, tgt)


def _failed_after_change(ctx: RunEnv, failed: StepFailed, verb: str, tgt: Target) -> None:
    """Like a failed rollback: both services stopped (never half a pair), the leases kept."""
    stopped = activate.stop_everything(ctx)
    ctx.journal.set("final_state", _final_state(f"stopped ({verb} failed)", tgt, stopped=stopped))
    msg = (
        f"{verb} failed at step '{failed.step.name}' on {', '.join(failed.step.hosts)}: {failed.message}. "
        "Both services are stopped; the leases are kept so nobody deploys onto an unknown state."
    )
    ctx.journal.finish("failed", msg)
    raise RollbackFailed(
        msg,
        hint=f"`pairctl logs --pair {ctx.view.name}` and receipt {ctx.journal.receipt_hash}; leases held: "
        f"{held_leases(ctx)} (`pairctl lease release {ctx.view.name} --dead-run {ctx.run_id}`), then deploy "
        "or rollback",
    )
