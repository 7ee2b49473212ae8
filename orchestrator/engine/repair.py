"""`pairctl repair --pair P`: rebuild a pair's route record from what the hosts and this home hold.

The rebuilt record names what `current` and `previous` name on both hosts, each rendered now with the
profile the signed old record names for it, else the newest passed deploy's, else the inventory's (an
unsigned record never picks the profile); model hashes from the signed old record only; revision one
above either host's; state from route_states.rebuilt. A pair never deployed is refused. Without `--yes`
nothing is written; with it the record is replaced by compare-and-swap under both leases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from orchestrator.build import revisions
from orchestrator.build.store import PackageStore
from orchestrator.config.inventory import Inventory
from orchestrator.engine import route_plan, route_states, route_trust, targets, team_sync
from orchestrator.engine.actions import ACTIONS, load_playbook
from orchestrator.engine.context import Pool, RunEnv, RunInputs
from orchestrator.engine.deploy import run_env
from orchestrator.engine.plan import RouteWrite, pair_view, plan, sealed
from orchestrator.engine.runner import StepFailed, error_of, run_steps
from orchestrator.errors import HostStateError, PairctlError
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.route import RouteEntry, RouteRecord
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool

ROLES = ("native", "rpc")
EVIDENCE_LOOKBACK = 200  # receipts walked back to find the profile a pair was deployed with


@dataclass
class RepairResult:
    pair: str
    written: bool
    problems: list[str]
    record: dict[str, Any] | None
    sources: dict[str, str] = field(default_factory=dict)
    receipt: str | None = None
    plan: list[dict[str, Any]] = field(default_factory=list)  # its steps, as shown and as run (plan.Step.to_dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def repair(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    *,
    write: bool,
    argv: list[str] | None = None,
    pool: Pool | None = None,
) -> RepairResult:
    view = pair_view(inventory, pair_name)
    evidence = EvidenceStore(home.evidence)
    key = route_trust.route_key(home)
    journal = evidence.begin("repair" if write else "repair --show", argv=list(argv or []), pair=pair_name)
    own = pool is None
    pool = pool or TransportPool(inventory)
    ctx = run_env(RunInputs(home, inventory, view, journal.state.run_id, route_key=key), evidence, journal, pool)
    steps = plan(load_playbook("repair"), view, facts=None, target=None)
    try:
        n_read = next(i for i, s in enumerate(steps) if s.action == "lease")
        try:
            run_steps(steps[:n_read], ctx, ACTIONS, journal=journal)
            team_sync.pull_for_route(evidence, inventory, ctx.hosts.facts["native"].route_bytes)
            judged = route_trust.judge(view, ctx.hosts.facts, key, evidence, run_id=ctx.run_id)
            problems = [str(p) for p in judged.problems]
            journal.set("problems_before", problems)
            rec, sources, relinks = rebuilt_record(ctx, judged)
            journal.set("rebuilt", {"record": rec.model_dump(mode="json", by_alias=True), "sources": sources})
            result = RepairResult(pair_name, False, problems, rec.model_dump(mode="json", by_alias=True), sources)
            base = route_plan.parsed(ctx.hosts.route_bytes("native"))
            route = RouteWrite("rebuilt", base.revision if base else None, rec)
            rest = [
                replace(s, links={view.hosts[r]: lk for r, lk in relinks.items()}) if s.action == "route-repair" else s
                for s in sealed(steps[n_read:], route, None)
            ]
            result.plan = [s.to_dict() for s in steps[:n_read] + rest]  # shown, then (--yes) run
            journal.set("plan", result.plan)
            if not write:
                result.receipt = journal.finish("passed", "repair shown, nothing written (--yes writes it)")
                return result
            run_steps(rest, ctx, ACTIONS, journal=journal)
        except StepFailed as failure:
            if ctx.hosts.leases:
                rel = [s for s in steps if s.action == "release-lease"]
                try:
                    run_steps(rel, ctx, ACTIONS, journal=journal)
                except StepFailed:
                    pass
            err = error_of(failure)
            raise err if err is not None else failure.cause from None
        result.written = True
        result.receipt = journal.finish("passed", f"route record of {pair_name} rebuilt: revision {rec.revision}")
        return result
    except BaseException as exc:
        if not journal.finished:
            journal.finish("failed", str(exc) or type(exc).__name__)
        raise
    finally:
        if own:
            pool.close()


def rebuilt_record(
    ctx: RunEnv, judged: route_trust.Judgement
) -> tuple[RouteRecord, dict[str, str], dict[str, tuple[str, str | None]]]:
    """The record the links, manifests and this home's evidence support (see the module doc), and
    the links put back first where `current` was of the other revision (role -> current, previous)."""
    view, facts = ctx.view, ctx.hosts.facts
    bad = [p for p in judged.problems if p.kind == route_trust.RELEASE]
    if bad:
        raise HostStateError(
            "repair cannot rebuild the route record: " + "; ".join(p.text for p in bad),
            hint=bad[0].hint.split(", then")[0],
        )
    olds = [r for r in (route_plan.parsed(facts[role].route_bytes) for role in ("native", "rpc")) if r is not None]
    old_entries = [(e, r.mac_ok(ctx.inputs.route_key)) for r in olds for e in (r.active, r.previous) if e is not None]
    pair = ctx.inventory.pair(view.name)
    store = PackageStore(ctx.home.store)
    sources: dict[str, str] = {}

    def entry_for(label: str, native: str | None, rpc: str | None) -> RouteEntry | None:
        if native is None or rpc is None:
            return None
        # Only a record this home signed says which profile and model hashes: an unsigned one is
        # whatever the host wrote, and must not choose which of the operator's profiles runs.
        same = [(e, ok) for e, ok in old_entries if (e.native_package, e.rpc_package) == (native, rpc)]
        signed = next((e for e, ok in same if ok), None)
        if signed is not None:
            what = f"profile {signed.profile_name} (from the old route record, signed by this home)"
            sources[label] = f"{native} + {rpc}, {what}"
            return targets.restore_target(view, pair, signed, store, label, trusted=True).entry
        found = _profile_from_evidence(ctx.evidence, view.name, native, rpc)
        profile, why = (found, "this home's evidence") if found else (pair.profile, "the inventory")
        if same:
            why += "; the old route record is not signed by this home, so its profile and model hashes are not used"
        sources[label] = f"{native} + {rpc}, profile {profile} (from {why})"
        return targets.render_recorded(view, pair, native, rpc, profile, {}, store, label).entry

    links, relinks = _one_revision_links(ctx, store, olds)
    for r, (cur, prev) in relinks.items():  # shown (and, with --yes, done) before the record
        sources[f"links:{ctx.host(r)}"] = f"current {cur}, previous {prev} (put back: current was of another revision)"
    active = entry_for("active", links["native"][0], links["rpc"][0])
    prev_links = (links["native"][1], links["rpc"][1])
    previous = None
    mixed_prev = revisions.mixed_problem(store, *prev_links)
    if mixed_prev and all(p is not None for p in prev_links):
        sources["previous"] = f"none ({mixed_prev})"  # never recorded: a rollback would start it
    elif all(p is not None and p in facts[r].releases for p, r in zip(prev_links, ("native", "rpc"), strict=True)):
        try:
            previous = entry_for("previous", *prev_links)
        except PairctlError as exc:  # the previous pair cannot be rendered here: record none rather than guess
            sources["previous"] = f"none ({exc.message})"
    if active is None:
        # a record naming nothing active is no record: never offered (engine/route_states.py)
        currents = {view.hosts[r]: facts[r].current or "nothing" for r in ("native", "rpc")}
        never = not olds and not any(facts[r].current for r in ("native", "rpc"))
        raise HostStateError(
            f"repair has nothing to rebuild for pair {view.name}: "
            + (
                "it was never deployed (no route record, no current release on either host)"
                if never
                else "`current` does not name a release on both hosts ("
                + ", ".join(f"{h}: {c}" for h, c in currents.items())
                + ")"
            ),
            hint=f"`pairctl deploy --pair {view.name} --packages NATIVE RPC` records the pair it activates",
        )
    base = max(olds, key=lambda r: r.revision) if olds else None
    rec = route_states.rebuilt(base, active, previous, pair=view.name, run_id=ctx.run_id)
    # never below what this home recorded writing: a rebuilt record must not read as a replay
    recorded = route_trust.highest_recorded(ctx.evidence, view.name) if ctx.evidence is not None else None
    if recorded is not None and rec.revision <= recorded:
        rec = rec.model_copy(update={"revision": recorded + 1})
    rec = rec.model_copy(
        update={"evidence_head": ctx.inputs.evidence_head, "evidence_home": ctx.inputs.evidence_home}
    ).sign(ctx.inputs.route_key)
    return rec, sources, relinks


def _one_revision_links(
    ctx: RunEnv, store: PackageStore, olds: list[RouteRecord]
) -> tuple[dict[str, tuple[str | None, str | None]], dict[str, tuple[str, str | None]]]:
    """(current, previous) per host that the rebuilt record names: the links as they are, unless
    their `current`s are of two revisions; then the active pair of the old record this home
    signed (the second map, switched back under the leases with `--yes`), else refused (exit 6)."""
    facts, pair = ctx.hosts.facts, ctx.view.name
    links: dict[str, tuple[str | None, str | None]] = {r: (facts[r].current, facts[r].previous) for r in ROLES}
    relinks: dict[str, tuple[str, str | None]] = {}
    if links["native"][0] is None or links["rpc"][0] is None:
        return links, relinks
    revs = revisions.pair_revisions(store, links["native"][0], links["rpc"][0])
    if revs.native is None or revs.rpc is None or not revisions.differ(revs.native, revs.rpc):
        return links, relinks  # one revision (a package missing from the store is refused when it is rendered)
    problem = f"the pair {revs.describe()}, not of one source revision"
    trusted = [r for r in olds if r.mac_ok(ctx.inputs.route_key) and r.active is not None]
    rec = max(trusted, key=lambda r: r.revision) if trusted else None
    act = rec.active if rec is not None else None
    if (
        rec is None
        or act is None
        or revisions.mixed_problem(store, act.native_package, act.rpc_package) is not None
        or act.native_package not in facts["native"].releases
        or act.rpc_package not in facts["rpc"].releases
    ):
        raise HostStateError(
            f"repair refused, nothing was written: the current links name {problem}, and no route record "
            "signed by this home names an installed pair of one revision to put back",
            hint=f"on one host point current at a release of the other's revision (`ln -sfn ROOT/releases/ID "
            f"ROOT/run/current`), then `pairctl repair --pair {pair} --yes`; or deploy one revision to both",
        )
    want = {r: act.package(r) for r in ROLES}
    prev = rec.previous
    for r in ROLES:
        if links[r][0] != want[r]:
            p = None if prev is None else prev.package(r)
            p = p if p in facts[r].releases and p != want[r] else links[r][0]
            relinks[r] = links[r] = (want[r], p)
    ctx.journal.note(
        f"current links named {problem}; repair puts back {act.names()} (route record revision "
        f"{rec.revision}) on {', '.join(ctx.host(r) for r in relinks)}"
    )
    return links, relinks


def _profile_from_evidence(evidence: EvidenceStore | None, pair: str, native: str, rpc: str) -> str | None:
    """The profile the newest passed deploy of these packages used (its preflight step says)."""
    if evidence is None:
        return None
    for r in route_trust.chain(evidence, pair, EVIDENCE_LOOKBACK):
        if r.command == "deploy" and r.outcome == "passed":
            pre = next((s for s in r.steps if s.name == "preflight"), None)
            if pre is not None and pre.data.get("packages") == {"native": native, "rpc": rpc}:
                name = pre.data.get("profile")
                return name if isinstance(name, str) else None
    return None
