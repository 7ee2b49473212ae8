"""`pairctl repair --pair P`: rebuild a pair's route record from what the hosts and this home
hold, after showing it.

The route record is a cache of what runs, signed by this home. When it is missing, does not
parse, differs between the hosts, names what the links do not, or was written elsewhere,
deploy and rollback refuse (exit 6) and point here. The rebuilt record says:
  - active: the packages `current` names on both hosts, previous: what `previous` names;
  - each rendered now from the inventory and a profile: the one the old record names for
    those packages, else the one the newest passed deploy of them in this home's evidence
    used, else the pair's profile in the inventory;
  - the model hashes the old record had for those packages (none otherwise);
  - revision: one above the highest either host had; signed and anchored like any record.
Without `--yes` nothing is written (the receipt says what would be). With it, both hosts'
leases are taken, route.json is replaced by compare-and-swap on each host, and the leases are
released. A current link naming a release that is not installed cannot be repaired here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.build.store import PackageStore
from orchestrator.config.inventory import Inventory
from orchestrator.engine import activate, route_trust
from orchestrator.engine.context import HostState, Pool, RunContext, RunInputs
from orchestrator.engine.plan import pair_view, plan
from orchestrator.engine.playbook import load_playbook
from orchestrator.engine.runner import StepFailed, error_of, run_steps
from orchestrator.errors import CheckFailed, HostStateError, PairctlError
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts.route import RouteConflict, RouteEntry, RouteRecord, cas_write, next_record, parse_route
from orchestrator.log import get_logger
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool

EVIDENCE_LOOKBACK = 200  # receipts walked back to find the profile a pair was deployed with


@dataclass
class RepairResult:
    pair: str
    written: bool
    problems: list[str]
    record: dict[str, Any] | None
    receipt: str | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair,
            "written": self.written,
            "problems": self.problems,
            "record": self.record,
            "sources": self.sources,
            "receipt": self.receipt,
        }


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
    try:
        head = evidence.latest(pair_name)
    except PairctlError:
        head = None
    ctx = RunContext(
        inputs=RunInputs(
            home=home,
            inventory=inventory,
            view=view,
            run_id=journal.state.run_id,
            route_key=key,
            evidence_head=head.sha256 if head else None,
        ),
        pool=pool,
        journal=journal,
        log=get_logger(pair=pair_name, run=journal.run_id),
        evidence=evidence,
        mode="repair",
        hosts=HostState(),
    )
    steps = plan(load_playbook("repair"), view, facts=None, target=None)
    try:
        n_read = next(i for i, s in enumerate(steps) if s.action == "lease")
        try:
            run_steps(steps[:n_read], ctx, HANDLERS, journal=journal)
            judged = route_trust.judge(view, ctx.hosts.facts, key, evidence, run_id=ctx.run_id)
            problems = [str(p) for p in judged.problems]
            journal.set("problems_before", problems)
            rec, sources = rebuilt_record(ctx, judged)
            journal.set("rebuilt", {"record": rec.model_dump(mode="json", by_alias=True), "sources": sources})
            result = RepairResult(pair_name, False, problems, rec.model_dump(mode="json", by_alias=True), None, sources)
            if not write:
                result.receipt = journal.finish("passed", "repair shown, nothing written (--yes writes it)")
                return result
            ctx.next_route = rec
            run_steps(steps[n_read:], ctx, HANDLERS, journal=journal)
        except StepFailed as failure:
            if ctx.hosts.leases:
                rel = [s for s in steps if s.action == "release-lease"]
                try:
                    run_steps(rel, ctx, HANDLERS, journal=journal)
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


def rebuilt_record(ctx: RunContext, judged: route_trust.Judgement) -> tuple[RouteRecord, dict[str, str]]:
    """The record the links, manifests and this home's evidence support (see the module doc)."""
    view, facts = ctx.view, ctx.hosts.facts
    bad = [p for p in judged.problems if p.kind == route_trust.RELEASE]
    if bad:
        raise HostStateError(
            "repair cannot rebuild the route record: " + "; ".join(p.text for p in bad),
            hint=bad[0].hint.split(", then")[0],
        )
    olds = [r for r in (_parsed(facts[role].route_bytes) for role in ("native", "rpc")) if r is not None]
    old_entries = [(e, r.mac_ok(ctx.inputs.route_key)) for r in olds for e in (r.active, r.previous) if e is not None]
    pair = ctx.inventory.pair(view.name)
    store = PackageStore(ctx.home.store)
    sources: dict[str, str] = {}

    def entry_for(label: str, native: str | None, rpc: str | None) -> RouteEntry | None:
        if native is None or rpc is None:
            return None
        known = next(((e, ok) for e, ok in old_entries if (e.native_package, e.rpc_package) == (native, rpc)), None)
        if known is not None:
            e, ok = known
            sources[label] = f"{native} + {rpc}, profile {e.profile_name} (from the old route record" + (
                ", signed by this home)" if ok else "; the profile file of that name)"
            )
            return activate.restore_target(view, pair, e, store, label, trusted=ok).entry
        found = _profile_from_evidence(ctx.evidence, view.name, native, rpc)
        profile, why = (found, "this home's evidence") if found else (pair.profile, "the inventory")
        sources[label] = f"{native} + {rpc}, profile {profile} (from {why})"
        return activate.render_recorded(view, pair, native, rpc, profile, {}, store, label).entry

    active = entry_for("active", facts["native"].current, facts["rpc"].current)
    prev_links = (facts["native"].previous, facts["rpc"].previous)
    previous = None
    if all(p is not None and p in facts[r].releases for p, r in zip(prev_links, ("native", "rpc"), strict=True)):
        try:
            previous = entry_for("previous", *prev_links)
        except PairctlError as exc:  # the previous pair cannot be rendered here: record none rather than guess
            sources["previous"] = f"none ({exc.message})"
    base = max(olds, key=lambda r: r.revision) if olds else None
    rec = next_record(base, pair=view.name, active=active, previous=previous, run_id=ctx.run_id)
    # never below what this home recorded writing: a rebuilt record must not read as a replay
    recorded = route_trust.highest_recorded(ctx.evidence, view.name) if ctx.evidence is not None else None
    if recorded is not None and rec.revision <= recorded:
        rec = rec.model_copy(update={"revision": recorded + 1})
    rec = rec.model_copy(update={"evidence_head": ctx.inputs.evidence_head}).sign(ctx.inputs.route_key)
    return rec, sources


def a_route_repair(ctx: RunContext, role: str) -> dict[str, Any]:
    """The rebuilt record onto one host, by compare-and-swap on the bytes read there."""
    rec = ctx.next_route
    assert rec is not None
    data = rec.to_bytes()
    try:
        back = cas_write(ctx.t(role), ctx.layout(role).route, ctx.hosts.route_bytes(role), data)
    except RouteConflict as exc:
        raise CheckFailed(f"{ctx.host(role)}: {exc} (compare-and-swap refused; run repair again)") from None
    if back != data:
        raise CheckFailed(f"{ctx.host(role)}: route.json read back differs from what was written")
    ctx.hosts.route_written(role, data)
    return {"revision": rec.revision, "sha256": sha256_bytes(data), "read_back": "byte-identical"}


def _parsed(data: bytes | None) -> RouteRecord | None:
    try:
        return parse_route(data)
    except PairctlError:
        return None


def _profile_from_evidence(evidence: EvidenceStore | None, pair: str, native: str, rpc: str) -> str | None:
    """The profile the newest passed deploy of these packages used (its preflight step says)."""
    if evidence is None:
        return None
    try:
        r = evidence.latest(pair)
        for _ in range(EVIDENCE_LOOKBACK):
            if r is None:
                return None
            if r.command == "deploy" and r.outcome == "passed":
                pre = next((s for s in r.steps if s.name == "preflight"), None)
                if pre is not None and pre.data.get("packages") == {"native": native, "rpc": rpc}:
                    name = pre.data.get("profile")
                    return name if isinstance(name, str) else None
            r = evidence.load(r.previous) if r.previous else None
    except PairctlError:
        return None
    return None


HANDLERS = {**activate.HANDLERS, "route-repair": a_route_repair}
