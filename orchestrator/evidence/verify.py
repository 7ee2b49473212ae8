"""`receipts verify`: rehash every receipt and walk every chain from the receipts themselves.
Heads are a cache, only cross-checked (a head naming a missing receipt shows the newest one
deleted, which walking cannot). Derived records' references must resolve to verifying receipts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from orchestrator.errors import EvidenceError
from orchestrator.evidence import safejson
from orchestrator.evidence.prune import accounted
from orchestrator.evidence.receipt import Receipt, samples_sha256
from orchestrator.hashing import canonical_json, sha256_bytes


class StoreFiles(Protocol):
    """What verification reads of an evidence store (so this module never imports the store)."""

    root: Path
    receipts_dir: Path
    journal_dir: Path
    heads_dir: Path
    index_dir: Path

    def path_of(self, sha: str) -> Path: ...

    def unsealed(self) -> list[dict[str, Any]]: ...


@dataclass
class Problem:
    kind: str  # changed | invalid | missing-previous | previous-changed | wrong-chain | fork | two-starts
    #           | head-missing | beyond-head | dangling-reference | stray-file | unreadable | deleted
    file: str
    message: str
    chain: str | None = None
    at: str | None = None  # when the receipt concerned started (orders "first broken link")


@dataclass
class VerifyReport:
    root: str
    receipts: int = 0
    chains: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    signers: dict[str, list[str]] = field(default_factory=dict)  # home -> who signed its pushes (--remote)
    pruned: int = 0  # receipts a prune receipt accounts for that are gone (kept on the remote or an archive)
    quarantined: dict[str, dict[str, Any]] = field(default_factory=dict)  # home -> the decision (--remote)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first(self) -> Problem | None:
        return self.problems[0] if self.problems else None

    def to_json(self) -> dict[str, Any]:
        d = {**asdict(self), "ok": self.ok}
        return {k: v for k, v in d.items() if v or k not in ("signers", "quarantined")}  # those: --remote only


def _started(data: bytes) -> str | None:
    try:
        at = safejson.loads(data, what="receipt").get("started_at")
    except (EvidenceError, AttributeError):
        return None
    return at if isinstance(at, str) else None


def _text(path: Path) -> str | None:
    """A head file's content; None when it cannot be read (reported as a missing head)."""
    try:
        return safejson.read_bounded(path, 1 << 16).decode("utf-8", errors="replace").strip()
    except (OSError, EvidenceError):
        return None


@dataclass
class _Found:
    """What the walk has learnt so far: the checks after the first read it, so each stays small."""

    good: dict[str, Receipt] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)  # sha named by the file -> file
    pruned: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def add(self, kind: str, file: str, message: str, chain: str | None = None, at: str | None = None) -> None:
        self.problems.append(Problem(kind, file, message, chain, at))

    def reject(self, stem: str, path: Path, kind: str, message: str, at: str | None = None) -> None:
        """A receipt file named `stem` that cannot be trusted: it is bad (links to it are judged so) and a problem."""
        self.bad[stem] = str(path)
        self.add(kind, str(path), message, at=at)


def verify_store(store: StoreFiles) -> VerifyReport:
    rep = VerifyReport(root=str(store.root))
    found = _Found()
    if store.receipts_dir.exists():
        for path in sorted(store.receipts_dir.iterdir()):
            _read_receipt(path, rep, found)
    good, bad, problems = found.good, found.bad, found.problems
    # receipts `receipts prune` removed, as its prune receipts (which verify) account for them
    found.pruned = {h: e for h, e in accounted(good.values()).items() if h not in good and h not in bad}
    rep.pruned = len(found.pruned)
    by_chain: dict[str, list[Receipt]] = defaultdict(list)
    for r in good.values():
        by_chain[r.chain].append(r)
    for chain, members in sorted(by_chain.items()):
        rep.chains[chain] = len(members)
        _check_links(store, chain, members, found)
        _check_head(store, chain, members, found, rep)
    # Heads of chains that no longer have a single verifying receipt.
    if store.heads_dir.exists():
        for head_file in sorted(store.heads_dir.iterdir()):
            if head_file.name.endswith(".pending") or head_file.name in by_chain or head_file.name.startswith(".tmp-"):
                continue
            head = _text(head_file)
            if head not in good and head not in bad:
                msg = f"chain {head_file.name!r}: its head {head_file} names receipt {head or '(unreadable)'}"
                found.add("head-missing", str(head_file), f"{msg}, which is missing", head_file.name, "~")
    for r in good.values():
        _check_references(str(store.path_of(r.sha256)), r, found)
    _check_deleted(store, found)
    for j in store.unsealed() if store.journal_dir.exists() else []:
        state = "running" if j["alive"] else ("killed, not yet sealed" if j["alive"] is False else "of another host")
        rep.warnings.append(f"journal {j['journal']} ({j['command']}, pair {j['pair']}): {state}")
    problems.sort(key=lambda p: (p.at is None, p.at or "", p.file))
    rep.problems = problems
    return rep


def _read_receipt(path: Path, rep: VerifyReport, found: _Found) -> None:
    """A receipt file hashing to its name, in canonical form, goes to `good`; anything else is a
    problem (and `bad` when it has a receipt's name: a chain through it is broken, not missing)."""
    name = path.name
    if name.startswith(".tmp-"):
        rep.warnings.append(f"leftover temporary file {path} (an interrupted write; safe to delete)")
        return
    stem = name[:-5] if name.endswith(".json") else name
    if not name.endswith(".json") or len(stem) != 64 or any(c not in "0123456789abcdef" for c in stem):
        found.add("stray-file", str(path), f"{path} is not a receipt name (<sha256>.json)")
        return
    rep.receipts += 1
    try:
        data = safejson.read_receipt(path)
    except OSError as exc:
        found.reject(stem, path, "unreadable", f"receipt file {path} cannot be read: {exc.strerror or exc}")
        return
    except EvidenceError as exc:
        found.reject(stem, path, "unreadable", exc.message)
        return
    actual = sha256_bytes(data)
    if actual != stem:
        msg = f"receipt file {path} does not match its name: its sha256 is {actual} (changed after it was written)"
        found.reject(stem, path, "changed", msg, at=_started(data))
        return
    try:
        if canonical_json(safejson.loads(data, what="it")) != data:
            raise ValueError("not canonical JSON (sorted keys, no whitespace, UTF-8)")
        r = Receipt.model_validate_json(data)
    except (ValidationError, ValueError, EvidenceError, RecursionError) as exc:
        msg = f"receipt file {path} is not a valid receipt: {str(exc).splitlines()[0]}"
        found.reject(stem, path, "invalid", msg, at=_started(data))
        return
    r._sha256 = stem
    found.good[stem] = r


def _check_links(store: StoreFiles, chain: str, members: list[Receipt], found: _Found) -> None:
    """Each receipt's `previous` must be a verifying receipt of the same chain (or one a prune
    receipt accounts for), and no two receipts may follow the same one: walking the receipts
    finds a deletion or an insertion that the head cache cannot."""
    good, bad = found.good, found.bad
    children: dict[str | None, list[Receipt]] = defaultdict(list)
    for r in members:
        children[r.previous].append(r)
        f, prev = str(store.path_of(r.sha256)), r.previous
        if prev is None or (prev in good and good[prev].chain == chain):
            continue
        if prev in found.pruned and found.pruned[prev]["chain"] == chain:
            continue  # kept on the team's remote or in an archive, as its prune receipt says
        if prev in good:
            kind = "wrong-chain"
            msg = f"receipt {f} (chain {chain!r}) names previous {prev}, which belongs to chain {good[prev].chain!r}"
        elif prev in bad:
            kind, msg = (
                "previous-changed",
                f"chain {chain!r} broken at {f}: its previous receipt {bad[prev]} does not verify",
            )
        else:
            kind, msg = "missing-previous", f"chain {chain!r} broken at {f}: it names previous receipt {prev}"
            msg += ", which is missing (deleted or renamed)"
        found.add(kind, f, msg, chain, r.started_at)
    for prev, kids in children.items():
        if len(kids) > 1:
            names = ", ".join(str(store.path_of(k.sha256)) for k in kids)
            what = "start the chain" if prev is None else f"name the same previous {prev}"
            msg = f"chain {chain!r}: {len(kids)} receipts {what}: {names}"
            kind = "two-starts" if prev is None else "fork"
            found.add(kind, str(store.path_of(kids[1].sha256)), msg, chain, min(k.started_at for k in kids))


def _check_head(store: StoreFiles, chain: str, members: list[Receipt], found: _Found, rep: VerifyReport) -> None:
    """The head file, a cache, must name a receipt that exists; every other end of the chain must
    be explained (an interrupted write) or is reported."""
    good, problems = found.good, found.problems
    # a receipt the next one of which was pruned is still followed: the prune receipt says by what
    referenced = {r.previous for r in members} | {
        e.get("previous") for e in found.pruned.values() if e["chain"] == chain
    }
    tips = {r.sha256 for r in members if r.sha256 not in referenced}
    head_file = store.heads_dir / chain
    if not head_file.exists():
        rep.warnings.append(f"chain {chain!r} has no head file {head_file}")
        return
    head = _text(head_file)
    if head in good:
        pending = store.heads_dir / f"{chain}.pending"
        explained = pending.exists() and _text(pending) in tips
        # A break in the chain leaves an extra end before the gap; the break is reported.
        broken = any(p.chain == chain and p.kind in ("missing-previous", "previous-changed") for p in problems)
        for tip in sorted(tips - {head}) if not broken else []:
            if explained:
                rep.warnings.append(
                    f"chain {chain!r}: newest receipt {tip[:12]} is not yet its head "
                    "(a write was interrupted; the next run repairs it)"
                )
            else:
                f = str(store.path_of(tip))
                msg = f"chain {chain!r}: receipt {f} is not reachable from the chain's head {head[:12]}"
                found.add("beyond-head", f, f"{msg} (added outside pairctl?)", chain, good[tip].started_at)
    elif head not in found.bad:
        msg = f"chain {chain!r}: its head {head_file} names receipt {head or '(unreadable)'}, which is missing"
        found.add("head-missing", str(head_file), f"{msg} (the newest receipt was deleted or replaced)", chain, "~")


def _check_references(f: str, r: Receipt, found: _Found) -> None:
    """A derived receipt's original, and each step it reuses, must resolve to a receipt that
    verifies and whose step data and samples still hash as the derived receipt recorded."""
    good, bad = found.good, found.bad
    if r.derived_from and r.derived_from not in good:
        state = "does not verify" if r.derived_from in bad else "is missing"
        msg = f"derived receipt {f} names original {r.derived_from}, which {state}"
        found.add("dangling-reference", f, msg, r.chain, r.started_at)
    for step, ref in r.reused_steps.items():
        src = good.get(ref.from_)
        why = None
        if src is None:
            why = f"receipt {ref.from_} " + ("does not verify" if ref.from_ in bad else "is missing")
        else:
            rec = src.step(step)
            if rec is None:
                why = f"receipt {ref.from_[:12]} has no step {step!r}"
            elif rec.outcome != "passed":
                why = f"step {step!r} {rec.outcome} in {ref.from_[:12]}"
            elif rec.data_sha256() != ref.data_sha256:
                why = f"step {step!r} data in {ref.from_[:12]} has sha256 {rec.data_sha256()}, not {ref.data_sha256}"
            elif samples_sha256(src.samples.get(step)) != ref.samples_sha256:
                why = f"step {step!r} samples in {ref.from_[:12]} do not match samples_sha256"
        if why:
            found.add(
                "dangling-reference", f, f"derived receipt {f} reuses step {step!r}: {why}", r.chain, r.started_at
            )


def _check_deleted(store: StoreFiles, found: _Found) -> None:
    """An index entry whose receipt is gone, and no prune receipt accounts for it, shows a deletion
    that moving the head back or re-hashing the chain hid."""
    if not store.index_dir.exists():
        return
    for idx in sorted(store.index_dir.glob("*.json")):
        sha = idx.name[:-5]
        if len(sha) == 64 and all(c in "0123456789abcdef" for c in sha) and sha not in found.good:
            if sha not in found.bad and sha not in found.pruned:
                msg = f"receipt {sha} was written (the index has its entry {idx}) but is gone: "
                found.add("deleted", str(store.path_of(sha)), msg + "evidence was deleted or rewritten", None, "~")
