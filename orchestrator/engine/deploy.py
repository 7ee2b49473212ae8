"""The three commands' bodies: `deploy`, `rollback` and `status` for one pair.

Each opens one connection per host for the whole run (TransportPool), writes a receipt
through the evidence store (inputs by hash), and runs its playbook through the one engine
(`runner.run_steps`). Failure handling lives here, in one place:
  - before anything that runs changed: release the leases this run took, re-raise (exit code
    of the cause: 3 config, 4 host/host key, 5 leased, 6 package);
  - after: run playbooks/rollback.yaml → RolledBack (7), or if that fails: stop both services,
    keep the leases → RollbackFailed (8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import load_profile
from orchestrator.engine import activate
from orchestrator.engine.activate import RunContext, target_from_entry
from orchestrator.engine.plan import pair_view, plan
from orchestrator.engine.playbook import Playbook, load_playbook
from orchestrator.engine.runner import StepFailed, StepOutcome, error_of, run_steps
from orchestrator.errors import ConfigError, PairctlError, RollbackFailed, RolledBack
from orchestrator.hashing import sha256_file, sha256_json
from orchestrator.hosts.prune import prune_after_deploy
from orchestrator.hosts.route import parse_route
from orchestrator.log import get_logger
from orchestrator.paths import Home

READ_ONLY_PREFIX = {"preflight", "connect", "facts"}


@dataclass
class RunResult:
    """What a deploy / rollback did, for `--json`, tables, tests and the benchmark."""

    command: str
    pair: str
    outcome: str  # passed | failed | dry-run
    receipt: str | None
    plan: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    uploads: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    transport: dict[str, Any] = field(default_factory=dict)
    active: dict[str, Any] | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command, "pair": self.pair, "outcome": self.outcome, "receipt": self.receipt,
            "plan": self.plan, "steps": self.steps, "uploads": self.uploads,
            "timings": {k: round(v, 4) for k, v in self.timings.items()}, "transport": self.transport,
            "active": self.active, "wall_s": round(self.wall_s, 4),
        }


def _pool(inventory: Inventory) -> Any:
    from orchestrator.remote.transport import TransportPool

    return TransportPool(inventory)


def _evidence(home: Home) -> Any:
    from orchestrator.evidence.store import EvidenceStore

    return EvidenceStore(home.evidence)


def _inventory_sha(inventory: Inventory) -> str:
    return sha256_json(inventory.model_dump(mode="json"))


def _playbook_sha(name: str) -> str:
    from orchestrator.config.search import resolve

    return sha256_file(resolve("playbook", name))


@contextmanager
def _pair_run(home: Home, inventory: Inventory, view: Any, *, command: str, journal_command: str,
              inputs: dict[str, str], argv: list[str] | None, on_step: Callable[[StepOutcome], None] | None,
              pool: Any, **ctx_fields: Any) -> Iterator[tuple[RunContext, RunResult, Callable[[StepOutcome], None]]]:
    """What deploy and rollback share: one receipt journal (sealed `failed`/`aborted` if the body
    raises before finishing it, its hash on the error), one connection per host, the RunContext,
    and a RunResult whose steps, uploads, timings and transport figures are filled on every path."""
    t_start = time.monotonic()
    journal = _evidence(home).begin(journal_command, argv=list(argv or []), pair=view.name, inputs=inputs)
    own_pool = pool is None
    pool = pool or _pool(inventory)
    ctx = RunContext(home=home, inventory=inventory, view=view, pool=pool, journal=journal, run_id=journal.run_id,
                     log=get_logger(pair=view.name, run=journal.run_id), **ctx_fields)
    result = RunResult(command=command, pair=view.name, outcome="failed", receipt=None)
    outcomes: list[StepOutcome] = []

    def record(o: StepOutcome) -> None:
        outcomes.append(o)
        if on_step:
            on_step(o)

    try:
        yield ctx, result, record
    except BaseException as exc:
        if not journal.finished:
            journal.finish("failed" if isinstance(exc, Exception) else "aborted", str(exc) or type(exc).__name__)
        if isinstance(exc, PairctlError):
            exc.receipt = journal.receipt_hash  # type: ignore[attr-defined]
        raise
    finally:
        result.steps = [_step_dict(o) for o in outcomes]
        result.uploads = dict(ctx.uploads)
        result.timings = dict(ctx.timings)
        result.transport = pool.stats() if hasattr(pool, "stats") else {}
        result.wall_s = time.monotonic() - t_start
        if result.receipt is None:
            result.receipt = journal.receipt_hash
        if own_pool:
            pool.close()
        ctx.result = result  # type: ignore[attr-defined]


def _step_dict(o: StepOutcome) -> dict[str, Any]:
    return {"name": o.step.name, "hosts": list(o.step.hosts), "ok": o.ok, "seconds": round(o.seconds, 4), "error": o.error}


def deploy(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    package_ids: tuple[str, str],
    *,
    profile_name: str | None = None,
    dry_run: bool = False,
    skip_accept: bool = False,
    checks: tuple[str, ...] = (),
    kernel_check: bool = False,
    argv: list[str] | None = None,
    on_step: Callable[[StepOutcome], None] | None = None,
    pool: Any = None,
    held_lease_nonce: str | None = None,
) -> RunResult:
    """Activate `package_ids` (native, rpc) on `pair_name`. Raises PairctlError subclasses.

    `held_lease_nonce`: the caller already holds both hosts' leases with this nonce (a
    qualification across its arms); the run renews them and leaves them held on every path."""
    view = pair_view(inventory, pair_name)
    pair = inventory.pair(pair_name)
    profile = load_profile(profile_name or pair.profile)
    deploy_pb, rollback_pb = load_playbook("deploy"), load_playbook("rollback")
    inputs = {
        "package:native": package_ids[0],
        "package:rpc": package_ids[1],
        "profile": sha256_json(profile.model_dump(mode="json")),
        "inventory": _inventory_sha(inventory),
        "playbook:deploy": _playbook_sha("deploy"),
        "playbook:rollback": _playbook_sha("rollback"),
    }
    _add_digests(home, package_ids, inputs)
    with _pair_run(home, inventory, view, command="deploy", journal_command="deploy" if not dry_run else "deploy --dry-run",
                   inputs=inputs, argv=argv, on_step=on_step, pool=pool, package_ids=tuple(package_ids), profile=profile,
                   skip_accept=skip_accept, checks=tuple(checks), kernel_check=kernel_check,
                   lease_nonce=held_lease_nonce, lease_held_by_caller=held_lease_nonce is not None) as (ctx, result, record):
        journal = ctx.journal
        first = plan(deploy_pb, view, facts=None, target=None)
        n_prefix = next(i for i, s in enumerate(first) if s.action not in READ_ONLY_PREFIX)
        try:
            run_steps(first[:n_prefix], ctx, activate.HANDLERS, journal=journal, on_step=record)
            steps = plan(deploy_pb, view, facts=ctx.facts, target=ctx.target.activation,
                         skip_accept=skip_accept, checks=tuple(checks), kernel_check=kernel_check)
            result.plan = [s.to_dict() for s in steps]
            journal.set("plan", result.plan)
            if dry_run:
                result.outcome = "dry-run"
                result.receipt = journal.finish("passed", "dry run: plan printed, nothing changed")
                return result
            _set_restore_from_start(ctx)
            rest = steps[n_prefix:]
            cut = next((i for i, s in enumerate(rest) if s.action == "release-lease"), len(rest))
            for i, part in enumerate((rest[:cut], rest[cut:])):
                if i == 1:
                    prune_after_deploy(ctx)  # keep_releases, under the leases, recorded in the receipt
                run_steps(part, ctx, activate.HANDLERS, journal=journal, on_step=record)
        except StepFailed as failure:
            if not ctx.changed:
                _abort(ctx, failure, record)
                raise _cause(failure) from None
            _rollback_after_failure(ctx, rollback_pb, failure, record)  # raises RolledBack / RollbackFailed
        result.outcome = "passed"
        result.active = ctx.target.entry.model_dump(mode="json")
        journal.set("final_state", _final_state(ctx, "activated"))
        result.receipt = journal.finish("passed", f"deployed {ctx.target.entry.names()} on {pair_name}")
        return result


def _add_digests(home: Home, package_ids: tuple[str, str], inputs: dict[str, str]) -> None:
    """Packages by content digest in the receipt's inputs (when the store has them)."""
    try:
        from orchestrator.build.store import PackageStore

        store = PackageStore(home.store)
        for role, pid in zip(("native", "rpc"), package_ids):
            if store.exists(pid):
                inputs[f"package:{role}:content_digest"] = store.get(pid).manifest.content_digest
    except PairctlError:
        pass


def _cause(failure: StepFailed) -> BaseException:
    err = error_of(failure)
    return err if err is not None else failure.cause


def _set_restore_from_start(ctx: RunContext) -> None:
    """What a rollback puts back: the links and the route's active entry as found at the start."""
    from orchestrator.build.store import PackageStore

    ctx.restore_links = {r: (ctx.facts[r].current, ctx.facts[r].previous) for r in ("native", "rpc")}
    record = parse_route(ctx.route_bytes.get("native"))
    ctx.restore = None
    if record is not None and record.active is not None:
        ctx.restore = target_from_entry(record.active, PackageStore(ctx.home.store), ctx.view, label="previous")
        ctx.restore_previous_entry = record.previous
    elif ctx.facts["native"].current or ctx.facts["rpc"].current:
        ctx.log.warning("hosts have a current release but no route record: a rollback can only stop")


def _abort(ctx: RunContext, failure: StepFailed, record: Callable[[StepOutcome], None]) -> None:
    """Nothing that runs changed: release the leases this run holds; the cause is re-raised."""
    ctx.journal.note(f"aborted before any change to what runs: {failure.message}")
    if ctx.leases:
        rel = [s for s in plan(load_playbook("deploy"), ctx.view, facts=None, target=None) if s.action == "release-lease"]
        try:
            run_steps(rel, ctx, activate.HANDLERS, journal=ctx.journal, on_step=record)
        except StepFailed:
            pass


def _rollback_after_failure(ctx: RunContext, pb: Playbook, failure: StepFailed,
                            record: Callable[[StepOutcome], None]) -> None:
    ctx.journal.note(f"deploy failed at step {failure.step.name}; rolling back: {failure.message}")
    ctx.journal.set("failure", {"step": failure.step.name, "error": failure.message})
    ctx.mode = "rollback"
    ctx._next_route = None
    ctx.identities = {}
    steps = plan(pb, ctx.view, facts=ctx.facts, target=None, restore=ctx.restore.activation if ctx.restore else None,
                 mode="auto", restore_links=ctx.restore_links)
    try:
        run_steps(steps, ctx, activate.HANDLERS, journal=ctx.journal, on_step=record)
    except StepFailed as rb:
        _rollback_failed(ctx, rb, first_failure=failure)
    what = ctx.restore.entry.names() if ctx.restore else None
    ctx.journal.set("final_state", _final_state(ctx, "restored" if what else "stopped (no previous pair)"))
    ctx.journal.set("rollback", {"restored": what, "links": {ctx.host(r): ctx.restore_links[r] for r in ("native", "rpc")}})
    if what:
        msg = (f"deploy failed at step '{failure.step.name}' and was rolled back: {what} is running again, "
               f"verified, route record revision updated; {_leases_after(ctx)}.\ncause: {failure.message}")
    else:
        msg = (f"deploy failed at step '{failure.step.name}'; there was no previous pair, so both services are "
               f"stopped; {_leases_after(ctx)}.\ncause: {failure.message}")
    ctx.journal.finish("failed", msg)
    raise RolledBack(msg)


def _leases_after(ctx: RunContext) -> str:
    return "the leases stay with the run that holds them" if ctx.lease_held_by_caller else "leases released"


def _rollback_failed(ctx: RunContext, rb: StepFailed, first_failure: StepFailed | None) -> None:
    stopped = activate.stop_everything(ctx)
    ctx.journal.set("final_state", _final_state(ctx, "stopped (rollback failed)", stopped=stopped))
    held = {ctx.host(r): activate_lease_text(h) for r, h in ctx.leases.items()}
    where = rb.step.hosts
    logs = ", ".join(f"{h}:{ctx.view.layouts[r].run}/" for r, h in ctx.view.hosts.items())
    msg = (
        (f"deploy failed at step '{first_failure.step.name}' ({first_failure.message.splitlines()[0]}); "
         if first_failure else "")
        + f"the rollback failed at step '{rb.step.name}' on {', '.join(where)}: {rb.message}. "
        + "Both services are stopped; the leases are kept so nobody deploys onto an unknown state."
    )
    ctx.journal.finish("failed", msg)
    raise RollbackFailed(
        msg,
        hint=f"look at the logs under {logs}, `pairctl status --pair {ctx.view.name}` and receipt "
        f"{ctx.journal.receipt_hash}; leases held: {held or 'none'} (release with `pairctl lease release`)",
    )


def activate_lease_text(handle: Any) -> str:
    from orchestrator.engine import leasing

    return str(leasing.describe(handle))


def _final_state(ctx: RunContext, what: str, stopped: dict[str, str] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"state": what}
    tgt = ctx.activating()
    if tgt is not None and what != "stopped (rollback failed)":
        d["active"] = tgt.entry.names()
    if stopped:
        d["stopped"] = stopped
    return d


# -- rollback -----------------------------------------------------------------------------------

def _read_api_key(ctx: RunContext, api_key_file: str | None) -> None:
    """The pair's API key for verify's /props and /slots reads, as deploy's preflight reads it
    (without it a rollback of a keyed pair got 401 at verify and left the hosts stopped)."""
    from orchestrator.config.inventory import read_api_key

    key = read_api_key(ctx.view.name, ctx.inventory.pair(ctx.view.name))
    if key is not None:
        ctx.api_key_bytes = key.file_bytes


def _verify_restore_releases(ctx: RunContext, entry: Any, store: Any) -> None:
    """Before anything running changes: the releases being restored still match their manifests
    on the hosts (sha256 of every file, one exec per host); a damaged one is refused (exit 6)
    and the running pair keeps running. Without this, a rollback to a damaged previous release
    stopped a verified pair and left both hosts stopped (found by the fault matrix)."""
    from orchestrator.hosts.release import ensure_release

    for r, pid in (("native", entry.native_package), ("rpc", entry.rpc_package)):
        if store.exists(pid):
            ensure_release(ctx.t(r), ctx.layout(r), store.get(pid), True, ctx.host(r))


def rollback(home: Home, inventory: Inventory, pair_name: str, *, argv: list[str] | None = None,
             on_step: Callable[[StepOutcome], None] | None = None, pool: Any = None) -> RunResult:
    """`pairctl rollback`: swap to the route record's previous pair, verify it, release leases."""
    from orchestrator.build.store import PackageStore

    view = pair_view(inventory, pair_name)
    pb = load_playbook("rollback")
    inputs = {"inventory": _inventory_sha(inventory), "playbook:rollback": _playbook_sha("rollback")}
    with _pair_run(home, inventory, view, command="rollback", journal_command="rollback", inputs=inputs, argv=argv,
                   on_step=on_step, pool=pool, mode="rollback") as (ctx, result, record):
        journal = ctx.journal
        _read_api_key(ctx, inventory.pair(pair_name).api_key_file)
        steps = plan(pb, view, facts=None, target=None, mode="manual")
        n_prefix = next(i for i, s in enumerate(steps) if s.action not in READ_ONLY_PREFIX | {"lease"})
        try:
            run_steps(steps[:n_prefix], ctx, activate.HANDLERS, journal=journal, on_step=record)
            rec = parse_route(ctx.route_bytes.get("native"))
            if rec is None or rec.previous is None:
                raise ConfigError(f"pair {pair_name}: the route record names no previous pair to roll back to")
            ctx.restore = target_from_entry(rec.previous, PackageStore(home.store), view, label="previous")
            ctx.restore_previous_entry = rec.active
            for r in ("native", "rpc"):
                want = rec.previous.native_package if r == "native" else rec.previous.rpc_package
                if want not in ctx.facts[r].releases:
                    raise ConfigError(f"{view.hosts[r]}: release {want} (the previous pair) is not installed")
                cur = rec.active.native_package if (rec.active and r == "native") else (rec.active.rpc_package if rec.active else None)
                ctx.restore_links[r] = (want, cur if cur != want else ctx.facts[r].previous)
            _verify_restore_releases(ctx, rec.previous, PackageStore(home.store))
        except (StepFailed, PairctlError) as exc:
            failure = exc if isinstance(exc, StepFailed) else None
            if failure is not None and ctx.changed:
                _rollback_failed(ctx, failure, None)
            _abort(ctx, failure or StepFailed(steps[n_prefix - 1], {"local": exc}), record)
            raise (_cause(failure) if failure else exc) from None
        full = plan(pb, view, facts=ctx.facts, target=None, restore=ctx.restore.activation, mode="manual",
                    restore_links=ctx.restore_links)
        result.plan = [s.to_dict() for s in full]
        journal.set("plan", result.plan)
        try:
            run_steps(full[n_prefix:], ctx, activate.HANDLERS, journal=journal, on_step=record)
        except StepFailed as rb:
            _rollback_failed(ctx, rb, None)
        result.outcome = "passed"
        result.active = ctx.restore.entry.model_dump(mode="json")
        journal.set("final_state", _final_state(ctx, "restored"))
        result.receipt = journal.finish("passed", f"rolled back {pair_name} to {ctx.restore.entry.names()}")
        return result

