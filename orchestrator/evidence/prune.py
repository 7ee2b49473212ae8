"""Pruning old receipts without breaking the audit trail: what may go (pure), how it stays
accounted for, and the archive it is written into first.

A *prune receipt* (command `receipts prune`, field `pruned`) names each pruned receipt's hash,
chain, `previous` and where it is kept (remote, archive), so `verify` and the chain walks step
over it; any other missing receipt is still deleted evidence. Prune receipts are never pruned.

Per chain (`select`) only receipts reachable from the head may go, and never: the head or anything
as new as the newest that must stay (newer than the cut-off, or anchored by a host's route record,
so the walk to a route record's writer never crosses a gap); a receipt a feature reads (`pinned`)
or a kept derived record references; a chain the caller blocked.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.errors import EvidenceError
from orchestrator.evidence.receipt import Receipt, parse_time

COMMAND = "receipts prune"
FIELD = "pruned"
_HEX = frozenset("0123456789abcdef")


def _is_hash(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX


@dataclass(frozen=True)
class Anchors:
    """What a pair's route records point at: the writers' run ids and the heads they followed."""

    run_ids: frozenset[str] = frozenset()
    hashes: frozenset[str] = frozenset()


@dataclass
class Candidate:
    receipt: Receipt
    size: int
    kept: list[str] = field(default_factory=list)  # where it is safe: "remote", "archive"

    @property
    def sha(self) -> str:
        return self.receipt.sha256


@dataclass
class Selection:
    prune: list[Candidate] = field(default_factory=list)  # oldest first within each chain
    kept: dict[str, str] = field(default_factory=dict)  # hash -> why it stays (older than the cut-off only)
    blocked: dict[str, str] = field(default_factory=dict)  # chain -> why nothing of it goes

    @property
    def bytes(self) -> int:
        return sum(c.size for c in self.prune)


def accounted(receipts: Iterable[Receipt]) -> dict[str, dict[str, Any]]:
    """hash -> its entry (plus `by`: the prune receipt) in the prune receipts among `receipts`
    (which verify); an entry of the wrong shape is ignored."""
    out: dict[str, dict[str, Any]] = {}
    for r in receipts:
        if r.command != COMMAND:
            continue
        doc = r.extra_fields().get(FIELD)
        entries = doc.get("receipts") if isinstance(doc, dict) else None
        for e in entries if isinstance(entries, list) else []:
            if (
                isinstance(e, dict)
                and _is_hash(e.get("hash"))
                and isinstance(e.get("chain"), str)
                and (e.get("previous") is None or _is_hash(e.get("previous")))
            ):
                out.setdefault(e["hash"], {**e, "by": r.sha256})
    return out


def chain_order(head: str | None, present: Mapping[str, Receipt], pruned: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The chain's receipts present here, newest first, walking `previous` from `head` and stepping
    over receipts a prune record accounts for."""
    out: list[str] = []
    seen: set[str] = set()
    cur = head
    while cur and cur not in seen:
        seen.add(cur)
        if cur in present:
            out.append(cur)
            cur = present[cur].previous
        elif cur in pruned:
            cur = pruned[cur].get("previous")
        else:
            break
    return out


def select(
    receipts: Sequence[tuple[Receipt, int]],
    heads: Mapping[str, str | None],
    *,
    cutoff: datetime,
    anchors: Mapping[str, Anchors],
    pinned: Mapping[str, str],
    blocked: Mapping[str, str],
    pruned: Mapping[str, Mapping[str, Any]],
) -> Selection:
    """Which receipts may go, before `restrict` checks each is safe elsewhere. `receipts`: every
    verifying receipt with its size; `pinned`: hash -> why a feature reads it; `blocked`: chain ->
    why none of it may go; `pruned`: `accounted()`."""
    by_hash = {r.sha256: r for r, _ in receipts}
    size = {r.sha256: n for r, n in receipts}
    sel = Selection(blocked=dict(blocked))
    chains = sorted({r.chain for r, _ in receipts})
    for chain in chains:
        old = [r.sha256 for r, _ in receipts if r.chain == chain and parse_time(r.finished_at) < cutoff]
        if chain in blocked:
            sel.kept.update({h: blocked[chain] for h in old})
            continue
        order = chain_order(heads.get(chain), by_hash, pruned)
        a = anchors.get(chain, Anchors())
        keep_to = 0  # index (newest first) of the oldest receipt that must stay with all newer ones
        why: dict[int, str] = {0: "the chain's head"}
        for i, h in enumerate(order):
            r = by_hash[h]
            if parse_time(r.finished_at) >= cutoff:
                keep_to, why[i] = i, "newer than the cut-off"
            elif r.run_id in a.run_ids or h in a.hashes:
                keep_to, why[i] = i, "a route record on the pair's hosts anchors it"
        reason = why.get(keep_to, "the chain's head")
        in_order = set(order)
        for h in old:
            if h not in in_order:
                sel.kept[h] = "not reachable from its chain's head (run `pairctl receipts verify`)"
        for i, h in enumerate(order):
            r = by_hash[h]
            if parse_time(r.finished_at) >= cutoff:
                continue
            if i <= keep_to:
                sel.kept[h] = why.get(i) or f"newer than a receipt that stays ({reason})"
            elif h in pinned:
                sel.kept[h] = pinned[h]
            else:
                sel.prune.append(Candidate(r, size[h]))
    sel.prune.sort(key=lambda c: (c.receipt.chain, c.receipt.finished_at))
    _close_references(sel, by_hash)
    return sel


def restrict(sel: Selection, receipts: Mapping[str, Receipt], safe: Mapping[str, list[str]], why: str) -> None:
    """Keep every candidate not safe elsewhere (`safe`: hash -> where it is kept; missing or
    empty: nowhere), with `why`; then keep what a kept derived record references."""
    for c in list(sel.prune):
        c.kept = list(safe.get(c.sha) or [])
        if not c.kept:
            sel.prune.remove(c)
            sel.kept[c.sha] = why
    _close_references(sel, receipts)


def _refs(r: Receipt) -> set[str]:
    return ({r.derived_from} if r.derived_from else set()) | {s.from_ for s in r.reused_steps.values()}


def _close_references(sel: Selection, receipts: Mapping[str, Receipt]) -> None:
    """A receipt a kept derived record reuses stays (verify checks the reused data), transitively."""
    going = {c.sha: c for c in sel.prune}
    changed = True
    while changed:
        changed = False
        for h, r in receipts.items():
            if h in going:
                continue
            for ref in _refs(r) & set(going):
                sel.kept[ref] = f"derived receipt {h[:12]} reuses it"
                sel.prune.remove(going.pop(ref))
                changed = True


def record(
    sel: Selection, *, cutoff: datetime, archive: dict[str, Any] | None, remote: dict[str, Any] | None
) -> dict[str, Any]:
    """The prune receipt's `pruned` field: per chain the first and last pruned hash, each pruned
    receipt's link and where it is kept."""
    chains: dict[str, dict[str, Any]] = {}
    for c in sel.prune:
        ch = chains.setdefault(c.receipt.chain, {"first": c.sha, "count": 0, "bytes": 0})
        ch.update(last=c.sha, count=ch["count"] + 1, bytes=ch["bytes"] + c.size)
    return {
        "cutoff": cutoff.isoformat().replace("+00:00", "Z"),
        "archive": archive,
        "remote": remote,
        "chains": chains,
        "receipts": [
            {"hash": c.sha, **{k: getattr(c.receipt, k) for k in _LINK}, "bytes": c.size, "kept": c.kept}
            for c in sel.prune
        ],
    }


_LINK = ("chain", "previous", "command", "outcome", "started_at")


# -- the archive ----------------------------------------------------------------------------


def write_archive(path: Path, files: Mapping[str, Path]) -> dict[str, Any]:
    """Write `receipts/<sha>.json` of each into a new tar.xz (O_EXCL, 0600), fsync, read it back and
    check each member: {path, sha256, bytes, receipts}; EvidenceError on any mismatch."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise EvidenceError(f"--archive {path} exists; name a new file (an archive is never overwritten)") from None
    except OSError as exc:
        raise EvidenceError(f"--archive {path} cannot be created: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            with tarfile.open(fileobj=f, mode="w:xz") as tar:
                for sha, src in sorted(files.items()):
                    data = src.read_bytes()
                    info = tarfile.TarInfo(f"receipts/{sha}.json")
                    info.size, info.mode, info.mtime = len(data), 0o444, int(src.stat().st_mtime)
                    tar.addfile(info, io.BytesIO(data))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise EvidenceError(
            f"--archive {path} could not be written: {exc.strerror or exc}; nothing was pruned"
        ) from None
    check_archive(path, files)
    data = path.read_bytes()
    return {"path": str(path), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "receipts": len(files)}


def check_archive(path: Path, files: Mapping[str, Path]) -> None:
    """Every receipt present once, hashing to its name and equal to the local file."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r:xz") as tar:
            for m in tar:
                f = tar.extractfile(m) if m.isfile() else None
                name = m.name.removeprefix("receipts/").removesuffix(".json")
                if f is None or name in found:
                    raise EvidenceError(f"archive {path}: unexpected member {m.name}; nothing was pruned")
                found[name] = f.read()
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise EvidenceError(f"archive {path} does not read back: {exc}; nothing was pruned") from None
    for sha, src in files.items():
        data = found.get(sha)
        if data is None or hashlib.sha256(data).hexdigest() != sha or data != src.read_bytes():
            raise EvidenceError(f"archive {path}: receipt {sha} did not read back intact; nothing was pruned")
    if set(found) != set(files):
        raise EvidenceError(f"archive {path} holds receipts that were not written to it; nothing was pruned")
