"""`pairctl receipts prune`: remove old receipts that are safe elsewhere, and record what went.

The order keeps the audit trail: verify the store (a broken one is never pruned); hold every
pruned chain's lock; read the hosts' route records (what they anchor stays); select; check each
against the remote's bytes or the read-back archive; seal the prune receipt; only then remove.
A crash at any point leaves nothing unaccounted."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.errors import EvidenceError, PairctlError
from orchestrator.evidence import atomic
from orchestrator.evidence import prune as pr
from orchestrator.evidence.receipt import NO_PAIR, Receipt
from orchestrator.evidence.store import ChainLock, EvidenceStore, _read_small


@dataclass
class PruneResult:
    selection: pr.Selection
    cutoff: datetime
    dry_run: bool
    receipt: str | None = None  # the prune receipt (None: dry run, or nothing went)
    archive: dict[str, Any] | None = None
    remote: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "cutoff": self.cutoff.isoformat(),
            "receipt": self.receipt,
            "pruned": [
                {"hash": c.sha, **{k: getattr(c.receipt, k) for k in _SHOWN}, "bytes": c.size, "kept": c.kept}
                for c in self.selection.prune
            ],
            "bytes": self.selection.bytes,
            "kept": self.selection.kept,
            "blocked": self.selection.blocked,
            "archive": self.archive,
            "remote": self.remote,
            "warnings": self.warnings,
        }


_SHOWN = ("chain", "command", "started_at")


def pins(receipts: Sequence[Receipt]) -> dict[str, str]:
    """hash -> why a feature still reads the receipt: reference pins and answers, the newest
    baseline per check, models and answer key, calibrations and prune receipts."""
    from orchestrator.checks.reference import state_from_receipts

    out: dict[str, str] = {}
    by_pair: dict[str, list[Receipt]] = {}
    for r in receipts:
        if r.command == pr.COMMAND:
            out[r.sha256] = "a prune receipt (it accounts for pruned receipts)"
        elif isinstance(r.extra_fields().get("calibration"), dict):
            out[r.sha256] = "a calibration `qualify` reads"
        if r.pair:
            by_pair.setdefault(r.pair, []).append(r)
    for members in by_pair.values():
        members.sort(key=lambda r: (r.finished_at, r.started_at))
        state = state_from_receipts(members)
        if state.pin is not None and state.pin.receipt:
            out[state.pin.receipt] = "the pair's reference pin"
        for a in state.answers.values():
            out[a.receipt] = "the pair's reference answers"
        seen: set[str] = set()
        for r in reversed(members):
            if r.outcome != "passed":
                continue
            for s in r.steps:
                raw = s.data.get("raw")
                if s.name.startswith("check:") and isinstance(raw, dict) and raw.get("results"):
                    key = json.dumps([s.name, raw.get("models"), raw.get("answer_key")], sort_keys=True, default=str)
                    if key not in seen:
                        seen.add(key)
                        out.setdefault(r.sha256, "the newest baseline of a check (live checks compare against it)")
    return out


def route_anchors(inventory: Any, pairs: Iterable[str]) -> tuple[dict[str, pr.Anchors], dict[str, str]]:
    """What the route records on each pair's hosts anchor; a pair whose records cannot be read is
    blocked (without its anchors nothing of that chain may go)."""
    from orchestrator.engine.plan import pair_view
    from orchestrator.hosts.route import parse_route
    from orchestrator.remote.pool import TransportPool
    from orchestrator.remote.transport import HOST_FILE_MAX

    anchors: dict[str, pr.Anchors] = {}
    blocked: dict[str, str] = {}
    wanted = sorted(pairs)
    if not wanted:
        return anchors, blocked
    if inventory is None:
        return anchors, {p: "no inventory: the route records on its hosts cannot be read" for p in wanted}
    with TransportPool(inventory) as pool:
        for pair in wanted:
            if pair not in inventory.pairs:
                blocked[pair] = f"pair {pair} is not in the inventory: the route records on its hosts cannot be read"
                continue
            try:
                view = pair_view(inventory, pair)
                runs: set[str] = set()
                heads: set[str] = set()
                for role, host in view.hosts.items():
                    try:
                        data = pool.get(host).read_bytes(view.layouts[role].route, max_bytes=HOST_FILE_MAX)
                    except FileNotFoundError:
                        continue
                    rec = parse_route(data, where=f"{host}:route.json", pair=pair)
                    if rec is not None:
                        runs.add(rec.updated_by)
                        if rec.evidence_head:
                            heads.add(rec.evidence_head)
                anchors[pair] = pr.Anchors(frozenset(runs), frozenset(heads))
            except (PairctlError, OSError) as exc:
                text = getattr(exc, "message", None) or str(exc)
                blocked[pair] = f"the route records of pair {pair} cannot be read ({text.splitlines()[0]})"
    return anchors, blocked


def run(
    store: EvidenceStore,
    *,
    days: float,
    inventory: Any,
    access: Any,
    archive: Path | None,
    dry_run: bool,
    argv: list[str],
    now: datetime | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> PruneResult:
    cutoff = (now or datetime.now(UTC)) - timedelta(days=days)
    rep = store.verify()
    if not rep.ok:
        first = rep.first
        raise EvidenceError(
            f"the evidence does not verify ({len(rep.problems)} problem(s); first: {first.message if first else '?'}); "
            "nothing was pruned",
            hint="run `pairctl receipts verify` and resolve it first",
        )
    receipts = list(store.iter())
    sizes = [(r, store.path_of(r.sha256).stat().st_size) for r in receipts]
    by_hash = {r.sha256: r for r in receipts}
    chains = sorted({r.chain for r in receipts})
    blocked: dict[str, str] = {}
    for u in store.unsealed():
        blocked.setdefault(u["pair"] or NO_PAIR, f"run {u['run_id']} ({u['command']}) is not sealed yet")
    locks: list[ChainLock] = []
    try:
        for chain in chains:
            if chain == NO_PAIR or chain in blocked:
                continue
            lock = ChainLock(store.locks_dir / f"{chain}.lock")
            if lock.acquire(wait_s=0):
                locks.append(lock)
            else:
                blocked[chain] = "a pairctl run on this pair holds its chain now"
        pairs = [c for c in chains if c != NO_PAIR and c not in blocked]
        anchors, unread = route_anchors(inventory, pairs) if pairs else ({}, {})
        blocked.update(unread)
        heads = {c: _read_small(store.heads_dir / c) for c in chains}
        pruned = store.pruned()
        sel = pr.select(
            sizes, heads, cutoff=cutoff, anchors=anchors, pinned=pins(receipts), blocked=blocked, pruned=pruned
        )
        res = PruneResult(sel, cutoff, dry_run)
        safe: dict[str, list[str]] = {c.sha: [] for c in sel.prune}
        if access is not None and sel.prune:
            from orchestrator.evidence import team

            try:
                tip, copies = team.remote_copies(store, access, [c.sha for c in sel.prune])
            except PairctlError as exc:
                res.warnings.append(f"the evidence remote was not checked: {exc.message}")
                tip, copies = None, {}
            for c in sel.prune:
                if copies.get(c.sha) == store.path_of(c.sha).read_bytes():
                    safe[c.sha].append("remote")
            res.remote = {"url": access.url, "branch": f"homes/{store.home_id()}", "commit": tip}
        if archive is not None:
            for c in sel.prune:
                safe[c.sha].append("archive")
        why = (
            "not on the team's evidence remote with the same bytes, and no --archive given"
            if access is not None
            else "no evidence remote in the inventory and no --archive given: it would be kept nowhere"
        )
        pr.restrict(sel, by_hash, safe, why)
        if dry_run or not sel.prune:
            return res
        if archive is not None:
            files = {c.sha: store.path_of(c.sha) for c in sel.prune if "archive" in c.kept}
            say(f"writing {len(files)} receipt(s) to {archive} and reading them back")
            res.archive = pr.write_archive(archive, files)
        doc = pr.record(sel, cutoff=cutoff, archive=res.archive, remote=res.remote)
        with store.begin(pr.COMMAND, argv, pair=None) as j:
            j.set(pr.FIELD, doc)
            places = (("on the evidence remote", res.remote), ("in an archive", res.archive))
            kept = " and ".join(w for w, on in places if on)
            res.receipt = j.finish(
                "passed", f"pruned {len(sel.prune)} receipt(s) finished before {doc['cutoff']}, kept {kept}"
            )
        _remove(store, [c.sha for c in sel.prune])
        return res
    finally:
        for lock in locks:
            lock.release()


def _remove(store: EvidenceStore, hashes: Sequence[str]) -> None:
    for sha in hashes:
        store.path_of(sha).unlink(missing_ok=True)
        (store.index_dir / f"{sha}.json").unlink(missing_ok=True)
    for d in (store.receipts_dir, store.index_dir):
        if d.is_dir():
            atomic.fsync_dir(d)
