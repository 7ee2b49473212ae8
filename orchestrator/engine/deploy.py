"""The bodies of `deploy` and `rollback` for one pair: one connection per host, one receipt, one engine.

A failure before anything that runs changed releases the leases and re-raises its cause; after, the
rollback playbook backs out (RolledBack, 7), or if that fails both services stop and the leases are
kept (RollbackFailed, 8).
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.build import revisions
from orchestrator.build.store import PackageStore, how_to_get
from orchestrator.config import search
from orchestrator.config.inventory import ApiKey, Inventory, read_api_key
from orchestrator.config.profiles import RouteProfile, load_profile
from orchestrator.engine import activate, leasing, route_plan, route_trust, targets, team_sync
from orchestrator.engine.actions import ACTIONS, host, load_playbook
from orchestrator.engine.context import HostState, Pool, RunEnv, RunInputs, RunOptions
from orchestrator.engine.plan import PairView, Prepared, RouteWrite, Step, Target, back_out, pair_view, plan, sealed
from orchestrator.engine.playbook import Playbook
from orchestrator.engine.runner import StepFailed, StepOutcome, error_of, run_steps
from orchestrator.engine.targets import restore_target
from orchestrator.errors import (
    ConfigError,
    HostError,
    HostStateError,
    LeaseError,
    PairctlError,
    RollbackFailed,
    RolledBack,
)
from orchestrator.evidence.journal import Journal
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import sha256_file, sha256_json
from orchestrator.hosts import space
from orchestrator.hosts.layout import check_state_dir
from orchestrator.hosts.leases import LeaseLost
from orchestrator.hosts.models import recorded_file_problems, recorded_files, recorded_model_problems
from orchestrator.hosts.probes import service_dir
from orchestrator.hosts.prune import prune_after_deploy
from orchestrator.hosts.release import ensure_release
from orchestrator.hosts.route import RouteEntry, RouteRecord
from orchestrator.log import get_logger
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool
from orchestrator.roles import ROLES, SERVICE_OF_ROLE

if TYPE_CHECKING:
    from orchestrator.checks.kernels import KernelCheckPlan

# Steps run before the plan is made. The lease comes before the facts: host state that decides
# anything (and is the route's compare-and-swap base) is read only once this run holds the hosts.
PLAN_PREFIX = {"preflight", "connect", "lease", "facts"}


@dataclass
class RunResult:
    """What a deploy / rollback did, for `--json`, tables, tests and the benchmark."""

    command: str
    pair: str
    outcome: str  # passed | failed | dry-run
    receipt: str | None
    plan: list[dict[str, Any]] = field(default_factory=list)
    back_out: list[dict[str, Any]] = field(default_factory=list)  # what a failure before the route write runs
    steps: list[dict[str, Any]] = field(default_factory=list)
    uploads: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    transport: dict[str, Any] = field(default_factory=dict)
    active: dict[str, Any] | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        timings = {k: round(v, 4) for k, v in self.timings.items()}
        return asdict(self) | {"timings": timings, "wall_s": round(self.wall_s, 4)}

    def passed(self, journal: Journal, outcome: str, said: str, active: Target | None = None) -> RunResult:
        """The run ended well (`outcome`: passed, dry-run, ...): its receipt sealed `passed`."""
        self.outcome = outcome
        if active is not None:
            self.active = active.entry.model_dump(mode="json")
        self.receipt = journal.finish("passed", said)
        return self


def _inputs(inventory: Inventory, *playbooks: str) -> dict[str, str]:
    """A receipt's inputs by sha256: the inventory and the playbooks the run may use."""
    shas = {f"playbook:{n}": sha256_file(search.resolve("playbook", n)) for n in playbooks}
    return {"inventory": sha256_json(inventory.model_dump(mode="json"))} | shas


@contextmanager
def _pair_run(
    home: Home,
    inventory: Inventory,
    view: PairView,
    *,
    command: str,
    dry_run: bool,
    inputs: dict[str, str],
    argv: list[str] | None,
    on_step: Callable[[StepOutcome], None] | None,
    pool: Pool | None,
    package_ids: tuple[str, str] | None = None,
    profile: RouteProfile | None = None,
    options: RunOptions | None = None,
    held_lease_nonce: str | None = None,
) -> Iterator[tuple[RunEnv, RunResult, _ReleaseWatch]]:
    """What deploy and rollback share: one receipt journal (sealed `failed`/`aborted` if the body
    raises first), one connection per host, the RunEnv, and a RunResult filled on every path."""
    t_start = time.monotonic()
    key = route_trust.route_key(home)
    evidence = EvidenceStore(home.evidence)
    journal_command = f"{command} --dry-run" if dry_run else command
    journal = evidence.begin(journal_command, argv=list(argv or []), pair=view.name, inputs=inputs)
    own_pool = pool is None
    pool = pool or TransportPool(inventory)
    given = RunInputs(home, inventory, view, journal.state.run_id, package_ids, profile, options or RunOptions())
    ctx = run_env(replace(given, held_lease_nonce=held_lease_nonce, route_key=key), evidence, journal, pool)
    result = RunResult(command=command, pair=view.name, outcome="failed", receipt=None)
    outcomes: list[StepOutcome] = []

    def record(o: StepOutcome) -> None:
        outcomes.append(o)
        if on_step:
            on_step(o)

    try:
        yield ctx, result, _ReleaseWatch(record)
    except BaseException as exc:
        if not journal.finished:
            journal.finish("failed" if isinstance(exc, Exception) else "aborted", str(exc) or type(exc).__name__)
        if isinstance(exc, PairctlError):
            exc.receipt = journal.receipt_hash  # type: ignore[attr-defined]
        raise
    finally:
        result.steps = [_step_dict(o) for o in outcomes]
        result.uploads = ctx.recorder.uploads()
        result.timings = ctx.recorder.timings()
        result.transport = pool.stats()
        result.wall_s = time.monotonic() - t_start
        if result.receipt is None:
            result.receipt = journal.receipt_hash
        if own_pool:
            pool.close()


def run_env(inputs: RunInputs, evidence: EvidenceStore, journal: Journal, pool: Pool) -> RunEnv:
    """The run's environment: `inputs` with the pair's newest receipt when the run began (the
    route records it writes anchor it) and whose chain that is, the connections, journal and log."""
    try:
        head = evidence.latest(inputs.view.name)
    except PairctlError:
        head = None  # a broken chain shows in the route's anchor check
    inputs = replace(inputs, evidence_head=head.sha256 if head else None, evidence_home=evidence.home_id())
    log = get_logger(pair=inputs.view.name, run=journal.run_id)
    return RunEnv(inputs, pool, journal, log, evidence, HostState(inputs.held_lease_nonce))


def _step_dict(o: StepOutcome) -> dict[str, Any]:
    return {
        "name": o.step.name,
        "hosts": list(o.step.hosts),
        "ok": o.ok,
        "seconds": round(o.seconds, 4),
        "error": o.error,
    }


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
    pool: Pool | None = None,
    held_lease_nonce: str | None = None,
    restore_record: RouteRecord | None = None,
    restore_previous_links: tuple[str | None, str | None] | None = None,
) -> RunResult:
    """Activate `package_ids` (native, rpc) on `pair_name`. Raises PairctlError subclasses.

    `restore_record` / `restore_previous_links`: qualify's restore, the record and `previous` links
    put back as found. `held_lease_nonce`: the caller holds both leases; renewed, never released."""
    view = pair_view(inventory, pair_name)
    pair = inventory.pair(pair_name)
    profile = load_profile(profile_name or pair.profile, pair=pair)
    deploy_pb, rollback_pb = load_playbook("deploy"), load_playbook("rollback")
    with _pair_run(
        home,
        inventory,
        view,
        command="deploy",
        dry_run=dry_run,
        inputs=_deploy_inputs(home, inventory, package_ids, profile),
        argv=argv,
        on_step=on_step,
        pool=pool,
        package_ids=(package_ids[0], package_ids[1]),
        profile=profile,
        options=RunOptions(
            skip_accept=skip_accept,
            checks=tuple(checks),
            kernel_check=kernel_check,
            restore_record=restore_record,
            restore_previous_links=restore_previous_links,
        ),
        held_lease_nonce=held_lease_nonce,
    ) as (ctx, result, record):
        journal = ctx.journal
        first = plan(deploy_pb, view, facts=None, target=None)
        n_prefix = _n_prefix(first)
        restore = Restore(None, {})
        try:
            _run_prefix(ctx, first, dry_run, record)
            judged = _judge_before_prepare(ctx, next(s for s in first if s.action == "prepare"))
            assert ctx.recorder.prep is not None  # preflight decided it
            restore = _restore_from_start(ctx, judged, ctx.recorder.prep.key)
            prep, steps = _deploy_plan(ctx, deploy_pb, restore)
            result.plan = [s.to_dict() for s in steps]
            result.back_out = [s.to_dict() for s in _restore_plan(ctx, back_out(rollback_pb), "back-out", restore)]
            journal.set("plan", result.plan)
            journal.set("back_out", result.back_out)
            if dry_run:
                return result.passed(journal, "dry-run", "dry run: plan printed, nothing changed")
            target = _activate(ctx, steps[n_prefix:], prep.target, restore, record)
        except StepFailed as failure:
            if not ctx.recorder.changed:
                _abort(ctx, failure, record)
                raise _cause(failure) from None
            _rollback_after_failure(ctx, rollback_pb, failure, record, restore)  # raises RolledBack / RollbackFailed
        except PairctlError as refused:
            # a refusal after `lease` but outside a step: nothing changed, give the leases back
            if ctx.recorder.changed:
                raise
            _abort(ctx, StepFailed(first[n_prefix - 1], {"local": refused}), record)
            raise
        journal.set("final_state", _final_state("activated", target))
        record.raise_if_release_failed(ctx, f"deployed {target.entry.names()} on {pair_name}")
        return result.passed(journal, "passed", f"deployed {target.entry.names()} on {pair_name}", target)


def _deploy_inputs(
    home: Home, inventory: Inventory, package_ids: tuple[str, str], profile: RouteProfile
) -> dict[str, str]:
    """The deploy receipt's inputs by sha256: packages (and content digests), profile, inventory, playbooks."""
    inputs = {
        "package:native": package_ids[0],
        "package:rpc": package_ids[1],
        "profile": sha256_json(profile.model_dump(mode="json")),
    } | _inputs(inventory, "deploy", "rollback")
    try:
        store = PackageStore(home.store)
        for role, pid in zip(("native", "rpc"), package_ids, strict=True):
            if store.exists(pid):
                inputs[f"package:{role}:content_digest"] = store.get(pid).manifest.content_digest
    except PairctlError:
        pass
    return inputs


def _deploy_plan(ctx: RunEnv, pb: Playbook, restore: Restore) -> tuple[Prepared, list[Step]]:
    """The whole deploy plan from the prefix's facts and preflight's decisions, its route records
    with the inventory's declared model sha256 (deferred where none is): what dry run and receipt show."""
    prep = ctx.recorder.prep
    assert prep is not None
    models = ctx.inventory.pair(ctx.view.name).models
    declared = {n: m.sha256 for n, m in models.items() if m.sha256}
    target = targets.with_models(_keep_previous_links(ctx, prep.target), declared)
    prep = replace(prep, target=target)
    deferred = ("active.models",) if len(declared) < len(models) else ()
    opts = ctx.inputs.options
    steps = plan(
        pb,
        ctx.view,
        facts=ctx.hosts.facts,
        target=target.activation,
        skip_accept=opts.skip_accept,
        checks=opts.checks,
        kernel=_kernel_plan(ctx, target) if opts.kernel_check else None,
        route=_deploy_route(ctx, target, restore, deferred),
        pair=target,
        packages=prep.packages,
        key=prep.key,
    )
    return prep, steps


def _kernel_plan(ctx: RunEnv, target: Target) -> KernelCheckPlan:
    """`--kernel-check`: the kernel harness of the packages being deployed, on both hosts."""
    from orchestrator.checks.kernels import DEFAULT_KERNEL, plan_kernel_check
    from orchestrator.config.kernels import load_cases

    ids = {ctx.view.hosts[r]: target.activation.package(r) for r in ROLES}
    return plan_kernel_check(ctx.inventory, ctx.view.name, load_cases(DEFAULT_KERNEL), ids)


def _activate(ctx: RunEnv, rest: list[Step], target: Target, restore: Restore, record: _ReleaseWatch) -> Target:
    """The deploy's steps after its prefix: up to the first change, then the rest with the route
    records sealed again, the keep_releases prune before the leases go. Returns the pair activated."""
    first_change = next((i for i, s in enumerate(rest) if s.changes), len(rest))
    done = run_steps(rest[:first_change], ctx, ACTIONS, journal=ctx.journal, on_step=record)
    hashed = next((o.data.get(ctx.host("native"), {}).get("models") for o in done if o.step.action == "prepare"), None)
    target = targets.with_models(target, {n: h["sha256"] for n, h in hashed.items()} if hashed else None)
    planned = next(s.route for s in rest if s.route is not None)
    route = _deploy_route(ctx, target, restore, planned.deferred)
    if route.to_dict() != planned.to_dict():  # the plan is what runs: never a record it did not show
        raise HostStateError(f"the route record after prepare is not the planned one: {route.to_dict()}")
    rest = sealed(rest[first_change:], route, target)
    cut = next((i for i, s in enumerate(rest) if s.action == "release-lease"), len(rest))
    run_steps(rest[:cut], ctx, ACTIONS, journal=ctx.journal, on_step=record)
    _prune(ctx)  # keep_releases, under the leases, recorded in the receipt
    run_steps(rest[cut:], ctx, ACTIONS, journal=ctx.journal, on_step=record)
    return target


@dataclass(frozen=True)
class Restore:
    """What a run that puts a recorded pair back restores, decided before its first change: the
    pair (None: nothing, both services stop), each role's (current, previous) links, verify's key."""

    target: Target | None
    links: Mapping[str, tuple[str | None, str | None]]
    key: ApiKey | None = field(default=None, repr=False)


def _deploy_route(ctx: RunEnv, target: Target, restore: Restore, deferred: tuple[str, ...]) -> RouteWrite:
    prior = restore.target.entry if restore.target else None
    return route_plan.for_deploy(ctx.inputs, _base_record(ctx), target.entry, prior, deferred)


def _n_prefix(steps: list[Step]) -> int:
    return next(i for i, s in enumerate(steps) if s.action not in PLAN_PREFIX)


def _run_prefix(ctx: RunEnv, steps: list[Step], dry_run: bool, record: Callable[[StepOutcome], None]) -> None:
    """The steps before the plan is made; a dry run reads the facts unleased, changing nothing on a host."""
    prefix = [s for s in steps[: _n_prefix(steps)] if not (dry_run and s.action == "lease")]
    run_steps(prefix, ctx, ACTIONS, journal=ctx.journal, on_step=record)


def _keep_previous_links(ctx: RunEnv, target: Target) -> Target:
    """Qualify's restore puts back the `previous` links as found too, where the hosts still keep those releases."""
    keep = ctx.inputs.options.restore_previous_links
    facts = ctx.hosts.facts
    if keep is None or not all(
        rel is None or rel in facts[r].releases for r, rel in zip(("native", "rpc"), keep, strict=True)
    ):
        return target
    return replace(target, activation=replace(target.activation, keep_previous=keep))


def _prune(ctx: RunEnv) -> None:
    """keep_releases after a successful activation, each lease re-checked first (a lost one: nothing
    pruned, recorded, and release-lease fails the run). Never fails the deploy itself."""
    try:
        for role in ("native", "rpc"):
            leasing.recheck(ctx, role)
    except (LeaseError, HostError) as exc:
        ctx.journal.set("prune", {"error": f"nothing pruned: {exc}"})
        return
    prune_after_deploy(ctx)


class _ReleaseWatch:
    """The step recorder, noting a failed release-lease: that makes the run failed, never a warning."""

    def __init__(self, record: Callable[[StepOutcome], None]) -> None:
        self.record = record
        self.errors: list[str] = []

    def __call__(self, o: StepOutcome) -> None:
        self.record(o)
        if o.step.action == "release-lease" and not o.ok:
            self.errors.append(o.error or "release-lease failed")

    def raise_if_release_failed(self, ctx: RunEnv, done: str) -> None:
        if not self.errors:
            return
        msg = f"{done}, but releasing the leases failed: {'; '.join(self.errors)}"
        ctx.journal.finish("failed", msg)
        raise LeaseError(
            msg,
            hint=f"`pairctl lease show {ctx.view.name}` shows who holds them now; "
            f"`pairctl status --pair {ctx.view.name}` checks the pair",
        )


def _base_record(ctx: RunEnv) -> RouteRecord | None:
    """The record this run's route writes and restores start from: what it wrote or re-read since
    on the native host, else the one the pair was judged by (route_trust.found_record), so a run cut
    short between its hosts' writes is followed, never written again at the same revision."""
    now = ctx.hosts.route_bytes("native")
    if now != ctx.hosts.facts["native"].route_bytes:
        return route_plan.parsed(now)
    return route_trust.found_record(ctx.hosts.facts, ctx.inputs.route_key)


def _restore_route(ctx: RunEnv, kind: str, restore: Restore) -> RouteWrite:
    """A restore's route write (kind: back-out | roll-back | roll-to), decided before its first change."""
    found, current = route_trust.found_record(ctx.hosts.facts, ctx.inputs.route_key), _base_record(ctx)
    restored = restore.target.entry if restore.target else None
    return route_plan.for_restore(
        ctx.inputs, kind, found=found, current=current, restored=restored, wrote=ctx.hosts.wrote_route()
    )


def _restore_plan(ctx: RunEnv, pb: Playbook, kind: str | None, restore: Restore) -> list[Step]:
    """The whole plan of a run that puts the recorded pair back (rollback, restart, start, stop, a
    failed deploy's back-out) from its prefix's facts. `kind`: its route write."""
    return plan(
        pb,
        ctx.view,
        facts=ctx.hosts.facts,
        target=None,
        restore=restore.target.activation if restore.target else None,
        restore_links=restore.links,
        route=_restore_route(ctx, kind, restore) if kind is not None else None,
        pair=restore.target,
        restores=True,
        key=restore.key,
    )


def _cause(failure: StepFailed) -> BaseException:
    err = error_of(failure)
    return err if err is not None else failure.cause


def _judge_hosts(ctx: RunEnv, command: str, allowed: frozenset[str]) -> route_trust.Judgement:
    """Both hosts' route records and links judged (route_trust); a problem not `allowed` refuses the run."""
    if ctx.evidence is not None and "native" in ctx.hosts.facts:  # another home's record: its receipts first
        warning = team_sync.pull_for_route(ctx.evidence, ctx.inputs.inventory, ctx.hosts.facts["native"].route_bytes)
        if warning:
            ctx.log.warning(warning)
    j = route_trust.judge(ctx.view, ctx.hosts.facts, ctx.inputs.route_key, ctx.evidence, run_id=ctx.run_id)
    if j.problems:
        ctx.journal.set("host_state_problems", _problem_rows(j))
    j.refuse(command, allowed)
    return j


def _problem_rows(j: route_trust.Judgement) -> list[dict[str, str | None]]:
    return [{"kind": p.kind, "text": p.text, "hint": p.hint} for p in j.problems]


def _judge_before_prepare(ctx: RunEnv, prepare: Step) -> route_trust.Judgement:
    """The route's judgement (_judge_hosts) first, its refusal (a security signal) saying more; then
    what PREPARE would refuse on either host, a default state dir on a read-only file system
    (layout.check_state_dir), refused by a dry run and by the real run before prepare. Both hosts
    judged, as a step's fan-out collects them: one error naming each refused host (a single host's
    in the very words its mkdir refusal gives), recorded as prepare's failure, its problems beside
    route_trust's (host_state_problems)."""
    judged = _judge_hosts(ctx, "deploy", route_trust.DEPLOY_ALLOWS)
    refused: dict[str, HostStateError] = {}
    for role in ROLES:
        try:
            check_state_dir(ctx.t(role), ctx.layout(role), ctx.hosts.facts.get(role))
        except HostStateError as exc:
            refused[ctx.host(role)] = exc
    if not refused:
        return judged
    errs = list(refused.values())
    rows = [{"kind": "state-dir", "text": e.message, "hint": e.hint} for e in errs]
    ctx.journal.set("host_state_problems", _problem_rows(judged) + rows)
    one = errs[0] if len(errs) == 1 else None
    hint = "; ".join(dict.fromkeys(e.hint for e in errs if e.hint))
    raise StepFailed(prepare, dict(refused), one or HostStateError("; ".join(e.message for e in errs), hint=hint))


def _restore_from_start(ctx: RunEnv, judged: route_trust.Judgement, key: ApiKey | None) -> Restore:
    """What a rollback puts back: the links and the route's active pair as found at the start,
    rendered now (never the recorded argv; one that cannot be rendered refuses here). Links a run
    cut short left switched go back to the recorded pair, never to a pair of two revisions."""
    facts = ctx.hosts.facts
    links = {r: (facts[r].current, facts[r].previous) for r in ("native", "rpc")}
    record = _base_record(ctx)
    if record is not None and judged.switched:
        back = route_trust.switched_links(record, facts, judged)
        links.update(back)
        ctx.journal.note(
            "current links left switched by a run cut short; a failed deploy puts back the recorded pair: "
            + ", ".join(f"{ctx.host(r)} current {c}" for r, (c, _) in back.items())
        )
    restore = None
    mixed = None
    if record is not None and record.active is not None:
        a = record.active
        revs = revisions.pair_revisions(PackageStore(ctx.home.store), a.native_package, a.rpc_package)
        # two known revisions; a package missing from the store is refused by restore_target below
        mixed = revs.describe() if revs.native and revs.rpc and revs.native != revs.rpc else None
    if mixed is not None:
        # never put back (a failed deploy stops both services instead): a pair runs one revision
        ctx.journal.note(f"the recorded active pair is not restored if this deploy fails: {mixed}")
        ctx.log.warning("recorded active pair mixes revisions: a failed deploy stops both", problem=mixed)
    elif record is not None and record.active is not None:
        restore = restore_target(
            ctx.view,
            ctx.inventory.pair(ctx.view.name),
            record.active,
            PackageStore(ctx.home.store),
            label="previous",
            trusted=record.mac_ok(ctx.inputs.route_key),
        )
    elif facts["native"].current or facts["rpc"].current:
        ctx.log.warning("hosts have a current release but no route record: a rollback can only stop")
    return Restore(restore, links, key)


def _abort(ctx: RunEnv, failure: StepFailed, record: Callable[[StepOutcome], None]) -> None:
    """Nothing that runs changed: release the leases this run holds; the cause is re-raised."""
    ctx.journal.note(f"aborted before any change to what runs: {failure.message}")
    if ctx.hosts.leases:
        rel = [
            s for s in plan(load_playbook("deploy"), ctx.view, facts=None, target=None) if s.action == "release-lease"
        ]
        try:
            run_steps(rel, ctx, ACTIONS, journal=ctx.journal, on_step=record)
        except StepFailed:
            pass
        # a root that refused the release keeps the lease until this home's next run frees it: say so
        cause, left = _cause(failure), [e for e in getattr(record, "errors", ()) if leasing.LEFT_ON_UNWRITABLE in e]
        if isinstance(cause, PairctlError) and left:
            cause.message += "\n" + "\n".join(x.splitlines()[0] for x in left)


def _release_unlost(ctx: RunEnv, failure: StepFailed) -> str:
    """After a lease was lost on one host: release the other host's, and say exactly what is held now."""
    lost_on = {h for h, e in failure.errors.items() if isinstance(e, LeaseLost)}
    released, kept = [], []
    for role, handle in list(ctx.hosts.leases.items()):
        host = ctx.host(role)
        if host in lost_on:
            continue
        try:
            if leasing.release(ctx, role, handle):
                ctx.hosts.lease_released(role)
                released.append(host)
            else:
                kept.append(f"{host} (held by the calling run)")
        except LeaseError as exc:  # not this run's any more either (a wrong nonce changes nothing)
            lost_on.add(host)
            ctx.journal.note(f"{host}: lease not released: {str(exc)[:200]}")
        except Exception as exc:  # the host did not answer: say so, the lease stays until its TTL
            kept.append(f"{host} (release failed: {str(exc)[:160]})")
    said = f"Its lease on {', '.join(sorted(lost_on)) or 'a host'} is not its own any more (another operator's?)"
    if released:
        said += f"; it released its lease on {', '.join(released)}"
    return said + (f"; it still holds the lease on {', '.join(kept)}" if kept else "; it holds no lease now")


def _rollback_after_failure(
    ctx: RunEnv, pb: Playbook, failure: StepFailed, record: Callable[[StepOutcome], None], restore: Restore
) -> None:
    lost = next((e for e in failure.errors.values() if isinstance(e, LeaseLost)), None)
    if lost is not None:
        # another operator holds the pair now (it broke this run's expired or stale lease): acting
        # on it would fight that operator, so this run changes nothing more and keeps no lease
        msg = (
            f"deploy lost its lease before step '{failure.step.name}' and changed nothing more: {lost}. "
            f"{_release_unlost(ctx, failure)}; the pair is as that step found it."
        )
        ctx.journal.set("failure", {"step": failure.step.name, "error": failure.message, "lease": "lost"})
        ctx.journal.set("final_state", {"state": f"left at step {failure.step.name} (lease lost)"})
        ctx.journal.finish("failed", msg)
        raise RollbackFailed(
            msg,
            hint=f"`pairctl lease show {ctx.view.name}` names the holder; once it is done, "
            f"`pairctl status --pair {ctx.view.name}` and `pairctl rollback --pair "
            f"{ctx.view.name}` or a new deploy",
        )
    ctx.journal.note(f"deploy failed at step {failure.step.name}; rolling back: {failure.message}")
    ctx.journal.set("failure", {"step": failure.step.name, "error": failure.message})
    ctx.hosts.forget_identities()  # what the deploy started is not what the back-out verifies
    steps = _restore_plan(ctx, back_out(pb), "back-out", restore)
    try:
        run_steps(steps, ctx, ACTIONS, journal=ctx.journal, on_step=record)
    except StepFailed as failed:
        _rollback_failed(ctx, failed, failure, restore.links)
    what = restore.target.entry.names() if restore.target else None
    written = any(s.route is not None and s.route.record is not None for s in steps)
    ctx.journal.set("final_state", _final_state("restored" if what else "stopped (no previous pair)", restore.target))
    ctx.journal.set("rollback", {"restored": what, "links": {ctx.host(r): restore.links[r] for r in ("native", "rpc")}})
    if what:
        msg = (
            f"deploy failed at step '{failure.step.name}' and was rolled back: {what} is running again, "
            f"verified, route record {'revision updated' if written else 'unchanged (it names that pair)'}; "
            f"{_leases_after(ctx, record)}.\ncause: {failure.message}"
        )
    else:
        msg = (
            f"deploy failed at step '{failure.step.name}'; there was no previous pair, so both services are "
            f"stopped; {_leases_after(ctx, record)}.\ncause: {failure.message}"
        )
    ctx.journal.finish("failed", msg)
    raise RolledBack(msg)


def _leases_after(ctx: RunEnv, record: Callable[[StepOutcome], None] | None = None) -> str:
    if ctx.lease_held_by_caller:
        return "the leases stay with the run that holds them"
    errors = getattr(record, "errors", None)
    return f"releasing the leases FAILED ({'; '.join(errors)})" if errors else "leases released"


# A deploy that failed at one of these steps has not written the route record yet: its links can
# go back as found, agreeing with the record again (after `route`, the record names this run's pair)
LINKS_BACK_BEFORE = {"stop", "restart-rpc", "switch", "start-server", "verify"}


def _logs_folder(ctx: RunEnv, role: str) -> str:
    """ROLE's service's folder as the hint names it, `DIR/`: the runtime dir while it runs from
    there (run/ read-only), else run/; run/'s where the host does not answer (the hint must not
    hide the failure it follows, nor wait to connect again to a host it lost)."""
    layout = ctx.view.layouts[role]
    try:
        t = ctx.t(role)
        if not getattr(t, "connected", True):
            return f"{layout.run}/"
        return posixpath.join(service_dir(t, layout.root, SERVICE_OF_ROLE[role]), "")
    except Exception:  # whatever it is, the rollback's own failure is what this message must say
        return f"{layout.run}/"


def _rollback_failed(
    ctx: RunEnv,
    rb: StepFailed,
    first_failure: StepFailed | None,
    links: Mapping[str, tuple[str | None, str | None]] | None = None,
) -> NoReturn:
    if rb.step.action == "stop" and isinstance(error_of(rb), (activate.UnreachableBeforeChange, space.NotWritable)):
        _rollback_unreachable(ctx, rb, first_failure)
    stopped = activate.stop_everything(ctx)
    final = _final_state("stopped (rollback failed)", None, stopped=stopped)
    if (
        first_failure is not None
        and first_failure.step.action in LINKS_BACK_BEFORE
        and all(ctx.hosts.route_bytes(r) == ctx.hosts.facts[r].route_bytes for r in ("native", "rpc"))
    ):
        final["links_back"] = activate.links_back(ctx, links or {})
    ctx.journal.set("final_state", final)
    logs = ", ".join(f"{h}:{_logs_folder(ctx, r)}" for r, h in ctx.view.hosts.items())
    msg = (
        _deploy_failed(first_failure)
        + f"the rollback failed at step '{rb.step.name}' on {', '.join(rb.step.hosts)}: {rb.message}. "
        + _down_now(ctx, stopped)
        + "; the leases are kept so nobody deploys onto an unknown state."
    )
    ctx.journal.finish("failed", msg)
    raise RollbackFailed(
        msg,
        hint=f"look at the logs under {logs}, `pairctl status --pair {ctx.view.name}` and receipt "
        f"{ctx.journal.receipt_hash}; leases held: {held_leases(ctx)} (release with `pairctl lease release`); "
        f"where status then names links that disagree with the route record, `pairctl repair --pair "
        f"{ctx.view.name} --yes` records what the links name before the next deploy",
    )


def _deploy_failed(first_failure: StepFailed | None) -> str:
    """A failed rollback's message opens with the deploy failure that started it, if any."""
    if first_failure is None:
        return ""
    return f"deploy failed at step '{first_failure.step.name}' ({first_failure.message.splitlines()[0]}); "


def held_leases(ctx: RunEnv) -> dict[str, str] | str:
    """The leases this run still holds, by host, as a failure's hint names them."""
    return {ctx.host(r): str(leasing.describe(h)) for r, h in ctx.hosts.leases.items()} or "none"


def _down_now(ctx: RunEnv, stopped: dict[str, str]) -> str:
    """What runs after a failed rollback, host by host, naming a stop that failed as such."""
    said = []
    for role in ("native", "rpc"):
        host, svc = ctx.host(role), SERVICE_OF_ROLE[role]
        out = stopped.get(host, "")
        if out.startswith("stop failed"):
            why = out.removeprefix("stop failed: ").splitlines()[0][:200]
            said.append(f"{host}: stopping {svc} FAILED ({why}; `pairctl status` shows whether it still runs)")
        else:
            said.append(f"{host}: {svc} stopped")
    return "Now down (a pair never runs half): " + "; ".join(said)


def _rollback_unreachable(ctx: RunEnv, rb: StepFailed, first_failure: StepFailed | None) -> None:
    """The rollback could not reach the RPC host, or a root it must write takes no new file, before
    its first change: it changes nothing (native may still serve) and keeps the leases."""
    unwritable = isinstance(error_of(rb), space.NotWritable)
    why = "a root it must write takes no new file" if unwritable else "could not reach the RPC host"
    ctx.journal.set("final_state", {"state": f"left as the failed step left it (rollback {why})"})
    said = rb.message.splitlines()[0]
    msg = _deploy_failed(first_failure) + (
        f"the rollback cannot write where it must ({said}), so it changed nothing: what runs keeps running "
        f"(`pairctl status --pair {ctx.view.name}` names what is down)."
        if unwritable
        else f"the rollback could not reach {ctx.host('rpc')} ({said}), so it changed nothing: "
        f"{ctx.host('native')} was not stopped."
    )
    msg += " The leases are kept so nobody deploys onto an unknown state."
    ctx.journal.finish("failed", msg)
    raise RollbackFailed(
        msg,
        hint=f"once {'the root takes writes' if unwritable else ctx.host('rpc') + ' answers SSH'} again: "
        f"`pairctl status --pair {ctx.view.name}`, release the leases (`pairctl lease release {ctx.view.name} "
        f"--dead-run {ctx.run_id}`), then rollback or deploy; leases held: {held_leases(ctx)}",
    )


def _final_state(what: str, tgt: Target | None, stopped: dict[str, str] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"state": what}
    if tgt is not None:
        d["active"] = tgt.entry.names()
    if stopped:
        d["stopped"] = stopped
    return d


# -- rollback -----------------------------------------------------------------------------------


def _verify_restore_releases(
    ctx: RunEnv, entry: RouteEntry, store: PackageStore, restore: Target, verb: str = "rollback"
) -> None:
    """Before anything running changes: the releases restored still match their manifests on the
    hosts (one exec per host); a damaged one is refused (exit 6) and the running pair keeps running."""
    for r in ("native", "rpc"):
        if store.exists(entry.package(r)):
            ensure_release(ctx.t(r), ctx.layout(r), store.get(entry.package(r)), True, ctx.host(r))
    _verify_restore_files(ctx, entry, verb, restore)
    for r in ("native", "rpc"):  # systemd hosts: the units to start pass the host's verify
        host.verify_unit_before_change(ctx, r, restore)


def _verify_restore_files(ctx: RunEnv, entry: RouteEntry, verb: str, restore: Target) -> None:
    """Before anything running changes: every file the restored llama-server loads besides its
    release (the profile's `files`, the models) re-hashed on the native host against the route
    record's hashes (and the profile's as rendered now, where they differ); a replaced file
    refuses the rollback or restart (exit 6), naming it."""
    t, layout, host = ctx.t("native"), ctx.layout("native"), ctx.host("native")
    problems = recorded_file_problems(entry.profile, host, t, layout)
    rendered = recorded_files(restore.entry.profile)
    if rendered != recorded_files(entry.profile):  # an untrusted record: the operator's profile file renders it
        problems += recorded_file_problems(restore.entry.profile, host, t, layout)
    models = ctx.inventory.pair(ctx.view.name).models  # the ones the server is rendered to load now
    recorded = {n: sha for n, sha in entry.models.items() if n in models}
    problems += recorded_model_problems(recorded, models, host, t, layout)
    if problems:
        raise HostStateError(
            f"{verb} refused, nothing was changed: " + "; ".join(dict.fromkeys(problems)),
            hint="put the deployed file back on the native host (or deploy the pair you want with a profile that "
            "declares the new file's sha256)",
        )


def _refuse_restoring_what_runs(ctx: RunEnv, active: RouteEntry | None, restore: Target) -> None:
    """A rollback never "restores" the pair that is already running (a record whose active and
    previous were swapped on the host would otherwise stop and restart it, reported healthy)."""
    a = restore.activation
    facts = ctx.hosts.facts
    running = (facts["native"].current, facts["rpc"].current) == (a.native_package, a.rpc_package)
    same = (
        active is not None
        and (active.native_package, active.rpc_package) == (a.native_package, a.rpc_package)
        and tuple(active.native_argv) == a.native_argv
        and tuple(active.rpc_argv) == a.rpc_argv
    )
    if running and (same or active is None):
        raise HostStateError(
            f"rollback refused, nothing was changed: the route record's previous pair {restore.entry.names()} "
            f"is what runs now on {ctx.host('native')} and {ctx.host('rpc')}",
            hint=f"`pairctl repair --pair {ctx.view.name}` rebuilds the record from the links; deploy the pair "
            "you want instead",
        )


def _release_pair(ctx: RunEnv, to: tuple[str, ...], store: PackageStore) -> tuple[str, str]:
    """`rollback --to`: the (native, rpc) release ids. One id: that release on native and the RPC
    host's kept release of its revision; two ids: native, rpc. Kept on the hosts and in the store, one revision."""
    facts = ctx.hosts.facts
    if len(to) not in (1, 2):
        raise ConfigError("rollback --to takes one release (both hosts) or two (native, then rpc)")
    native = to[0]

    def kept(role: str, pid: str) -> None:
        if pid not in facts[role].releases:
            have = ", ".join(sorted(facts[role].releases)) or "none"
            raise ConfigError(
                f"{ctx.host(role)}: release {pid} is not kept there (kept: {have})",
                hint=f"`pairctl releases list --pair {ctx.view.name}` shows what each host keeps",
            )
        if not store.exists(pid):
            raise ConfigError(
                f"release {pid} is not in the local package store: its identity cannot be verified",
                hint=how_to_get(pid),
            )

    kept("native", native)
    rev = store.get(native).manifest.revision
    if len(to) == 2:
        rpc = to[1]
    else:
        same = [r for r in sorted(facts["rpc"].releases) if store.exists(r) and store.get(r).manifest.revision == rev]
        rpc = native if native in same else (same[0] if len(same) == 1 else "")
        if not rpc:
            raise ConfigError(
                f"{ctx.host('rpc')}: "
                + (
                    f"several kept releases of revision {rev[:12]}: {', '.join(same)}"
                    if same
                    else f"no kept release of revision {rev[:12]}"
                )
                + f" to pair with {native}",
                hint="name both: rollback --to NATIVE_RELEASE --to RPC_RELEASE",
            )
    kept("rpc", rpc)
    if store.get(rpc).manifest.revision != rev:
        raise ConfigError(f"releases {native} and {rpc} come from two revisions; a pair is built from one")
    return native, rpc


def _rollback_target(
    ctx: RunEnv, rec: RouteRecord | None, to: tuple[str, ...], store: PackageStore
) -> tuple[RouteEntry, Target]:
    """The record entry the rollback puts back, and that pair rendered now."""
    pair_name, pair = ctx.view.name, ctx.inventory.pair(ctx.view.name)
    if rec is None:
        raise HostStateError(
            f"rollback refused, nothing was changed: pair {pair_name} has no route record (never deployed)",
            hint=f"`pairctl deploy --pair {pair_name} --packages NATIVE RPC`",
        )
    trusted = rec.mac_ok(ctx.inputs.route_key)
    if not to:
        if rec.previous is None:
            raise HostStateError(
                f"rollback refused, nothing was changed: pair {pair_name}'s route record names no previous pair "
                "to roll back to (it has been deployed once)",
                hint=f"`pairctl status --pair {pair_name}` shows what runs; `pairctl rollback --pair {pair_name} "
                "--to RELEASE` goes to another kept release",
            )
        return rec.previous, restore_target(ctx.view, pair, rec.previous, store, label="previous", trusted=trusted)
    native, rpc = _release_pair(ctx, to, store)
    known = next(
        (e for e in (rec.previous, rec.active) if e is not None and (e.native_package, e.rpc_package) == (native, rpc)),
        None,
    )
    if known is not None:  # a recorded pair: its own profile, as a plain rollback renders it
        return known, restore_target(ctx.view, pair, known, store, label="previous", trusted=trusted)
    tgt = targets.render_recorded(ctx.view, pair, native, rpc, pair.profile, {}, store, f"release {native}")
    return tgt.entry, tgt


def _cut_short_target(ctx: RunEnv, rec: RouteRecord | None, store: PackageStore) -> tuple[RouteEntry, Target]:
    """`rollback` after a run cut short between its switch and its route record (kind `switched`):
    the recorded active pair comes back and the record is written as found, as that run's own
    back-out would have."""
    assert rec is not None and rec.active is not None  # `switched` needs a record naming a pair
    pair = ctx.inventory.pair(ctx.view.name)
    tgt = restore_target(ctx.view, pair, rec.active, store, label="recorded", trusted=True)
    ctx.journal.note(
        f"current links disagree with route record revision {rec.revision} (a run cut short): "
        f"rollback puts back the recorded pair {rec.active.names()}"
    )
    return rec.active, tgt


def _rollback_links(
    ctx: RunEnv, rec: RouteRecord, back_to: RouteEntry, cut_short: route_trust.Judgement | None
) -> dict[str, tuple[str | None, str | None]]:
    """(current, previous) per role after the rollback: the restored release current, the recorded
    active one previous (or the kept previous); after a run cut short, the recorded pair's own links."""
    links: dict[str, tuple[str | None, str | None]] = {}
    for r in ("native", "rpc"):
        want = back_to.package(r)
        if want not in ctx.hosts.facts[r].releases:
            raise ConfigError(f"{ctx.host(r)}: release {want} (the previous pair) is not installed")
        cur = None if rec.active is None else rec.active.package(r)
        links[r] = (want, cur if cur != want else ctx.hosts.facts[r].previous)
    if cut_short is not None:
        links.update(route_trust.switched_links(rec, ctx.hosts.facts, cut_short))
    return links


@dataclass(frozen=True)
class PutBack:
    """What a run that puts a recorded pair back (rollback, restart, start, stop) decided from its
    prefix's facts before its first change, and the words its receipt and messages use."""

    entry: RouteEntry  # the recorded entry restored
    target: Target  # that pair rendered now
    links: dict[str, tuple[str | None, str | None]]
    kind: str | None  # its route write (None: the record is not written)
    noop: str | None = None  # `start` on a running pair: nothing to start, this said


# each command's playbook and words: what its dry run would do, its final state, its message once done
PUT_BACK: dict[str, tuple[str, str, str, str]] = {
    "rollback": ("rollback", "roll back to", "restored", "rolled back {pair} to {names}"),
    "restart": ("restart", "restart", "restarted", "restarted {pair}: {names}"),
    "start": ("restart", "start", "started", "started {pair}: {names}"),
    "stop": ("stop", "stop", "stopped", "stopped {pair}: {names}"),
}


def put_back(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    command: str,
    extra_inputs: Mapping[str, str],
    decide: Callable[[RunEnv, route_trust.Judgement, PackageStore], PutBack],
    *,
    dry_run: bool,
    argv: list[str] | None,
    on_step: Callable[[StepOutcome], None] | None,
    pool: Pool | None,
) -> RunResult:
    """What rollback and restart/start/stop share: the prefix, `decide` and the restored releases
    verified before any change (a refusal releases the leases), the whole plan, then its run; a
    failure after the first change stops both services and keeps the leases."""
    view = pair_view(inventory, pair_name)
    playbook, would, state, done = PUT_BACK[command]
    pb = load_playbook(playbook)
    with _pair_run(
        home,
        inventory,
        view,
        command=command,
        dry_run=dry_run,
        inputs=_inputs(inventory, playbook) | dict(extra_inputs),
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
            store = PackageStore(home.store)
            put = decide(ctx, _judge_hosts(ctx, command, route_trust.ROLLBACK_ALLOWS), store)
            if not dry_run and command != "stop":
                _verify_restore_releases(ctx, put.entry, store, put.target, command)
        except (StepFailed, PairctlError) as exc:  # the prefix changes nothing that runs
            failure = exc if isinstance(exc, StepFailed) else None
            _abort(ctx, failure or StepFailed(steps[n_prefix - 1], {"local": exc}), record)
            raise (_cause(failure) if failure else exc) from None
        tgt, names = put.target, put.target.entry.names()
        done = done.format(pair=pair_name, names=names)
        full = _restore_plan(ctx, pb, put.kind, Restore(tgt, put.links, key))
        result.plan = [s.to_dict() for s in full]
        journal.set("plan", result.plan)
        journal.set("target", {"to" if command == "rollback" else "pair": names, "how": put.kind or command})
        if put.noop is not None:
            if not dry_run:
                run_steps([s for s in full if s.action == "release-lease"], ctx, ACTIONS, journal=journal,
                          on_step=record)  # fmt: skip
                record.raise_if_release_failed(ctx, "nothing to start")
            return result.passed(journal, "nothing to start", put.noop, tgt)
        if dry_run:
            return result.passed(journal, "dry-run", f"dry run: would {would} {names}", tgt)
        try:
            run_steps(full[n_prefix:], ctx, ACTIONS, journal=journal, on_step=record)
        except StepFailed as failed:
            if not ctx.recorder.changed:  # refused before its first change (the RPC host did not answer)
                _abort(ctx, failed, record)
                raise _cause(failed) from None
            if command == "rollback":
                _rollback_failed(ctx, failed, None)
            _failed_after_change(ctx, failed, command, tgt)
        journal.set("final_state", _final_state(state, tgt))
        record.raise_if_release_failed(ctx, done)
        return result.passed(journal, "passed", done, tgt)


def _failed_after_change(ctx: RunEnv, failed: StepFailed, verb: str, tgt: Target) -> NoReturn:
    """A restart, start or stop that failed after its first change ends like a failed rollback:
    both services stopped (never half a pair), the leases kept."""
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


def rollback(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    *,
    to: tuple[str, ...] = (),
    dry_run: bool = False,
    argv: list[str] | None = None,
    on_step: Callable[[StepOutcome], None] | None = None,
    pool: Pool | None = None,
) -> RunResult:
    """`pairctl rollback`: to the route record's previous pair (or, with `to`, a kept release),
    verified, leases released. `dry_run` reads the hosts unleased and prints the plan."""

    def decide(ctx: RunEnv, judged: route_trust.Judgement, store: PackageStore) -> PutBack:
        rec = judged.record
        cut_short = judged.switched and not to
        kind = "back-out" if cut_short else "roll-to" if to else "roll-back"  # engine/route_states.py's transition
        back_to, tgt = _cut_short_target(ctx, rec, store) if cut_short else _rollback_target(ctx, rec, tuple(to), store)
        assert rec is not None
        revisions.require_one_revision(
            store,
            pair_name,
            back_to.native_package,
            back_to.rpc_package,
            what="rollback to " + ("the route record's previous pair" if not to else f"release {to[0]}"),
            hint=f"deploy the pair you want, built from one commit: `pairctl deploy --pair {pair_name} "
            "--packages NATIVE RPC`",
        )
        if not cut_short:
            _refuse_restoring_what_runs(ctx, rec.active, tgt)
        links = _rollback_links(ctx, rec, back_to, judged if cut_short else None)
        return PutBack(back_to, tgt, links, kind)

    inputs = {"to": " ".join(to)} if to else {}
    return put_back(
        home,
        inventory,
        pair_name,
        "rollback",
        inputs,
        decide,
        dry_run=dry_run,
        argv=argv,
        on_step=on_step,
        pool=pool,
    )
