"""The evidence store: sealed receipts named by hash, per-pair chains, journals of live runs.

Layout under the root:

    receipts/<sha256>.json   canonical JSON, mode 0444, created once (link), never rewritten
    journal/<run-id>.jsonl   a run in progress (or one killed: recovered as `aborted`)
    heads/<chain>            hash of the chain's newest receipt (a cache; `verify` does not trust it)
    heads/<chain>.pending    written before a receipt, removed after its head moved (crash repair)
    locks/<chain>.lock       flock held by the live run of a pair, so two runs can't extend one chain
    index/<sha256>.json      summary of a receipt for listing (a cache; `verify` never reads it)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import re
import secrets
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import EllipsisType
from typing import Any

from orchestrator import log as logging_setup  # the module, not a name: log.py imports evidence.masking
from orchestrator.errors import EvidenceError, LeaseHeldError
from orchestrator.evidence import atomic, procid, safejson
from orchestrator.evidence.derived import coverage, derived_outcome
from orchestrator.evidence.journal import Journal, JournalState, replay
from orchestrator.evidence.masking import mask_argv
from orchestrator.evidence.receipt import (
    NO_PAIR,
    OUTCOMES,
    RESERVED_FIELDS,
    SCHEMA_VERSION,
    STEP_OUTCOMES,
    HostInfo,
    Receipt,
    ReusedStep,
    StepRecord,
    samples_sha256,
    summary_of,
    utc_now,
)
from orchestrator.evidence.verify import VerifyReport, verify_store
from orchestrator.hashing import sha256_bytes

_HASH = re.compile(r"^[0-9a-f]{64}$")
SMALL_FILE_MAX = 1 << 16  # heads, pending heads, lock holders: a hash or a line of JSON
_CHAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
HOME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a branch name on the evidence remote
# evidence roots that sealed a receipt in this process: main() pushes them to the team's remote
WRITTEN: set[Path] = set()
# hash -> summary: the bytes are still read and hashed on every call, only the parse is kept
# (a status asks for every summary 3-4 times; ~1,000 receipts cost 0.3 s CPU a parse).
_SUMMARIES: dict[str, dict[str, Any]] = {}


class EvidenceBusy(LeaseHeldError):
    """Another live pairctl process is writing this pair's chain."""


def _check_chain_name(name: str) -> str:
    if name != NO_PAIR and not _CHAIN_NAME.match(name):
        raise EvidenceError(f"pair name {name!r} cannot name an evidence chain (letters, digits, . _ - only)")
    return name


class ChainLock:
    """An exclusive flock on locks/<chain>.lock; the kernel drops it when the holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, wait_s: float = 0.0, holder: dict[str, Any] | None = None) -> bool:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EvidenceError(f"lock file {self.path} cannot be opened: {exc.strerror or exc}") from None
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    os.close(fd)
                    if exc.errno in (errno.EAGAIN, errno.EACCES):
                        return False
                    raise
                time.sleep(0.05)
        self._fd = fd
        if holder is not None:  # overwrite, then cut: the file is never empty for a reader
            data = json.dumps(holder).encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        return True

    def holder(self, wait_s: float = 1.0) -> dict[str, Any]:
        """Who holds the lock, waiting briefly for a winner still writing its record."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                raw = safejson.read_bounded(self.path, SMALL_FILE_MAX) or b"{}"
                h = safejson.parse_bounded(raw, max_bytes=SMALL_FILE_MAX, max_depth=8, noun="lock holder")
                if isinstance(h, dict) and h.get("run_id"):
                    return h
            except (OSError, ValueError, EvidenceError):
                pass
            if time.monotonic() >= deadline:
                return {}
            time.sleep(0.02)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_small(path: Path) -> str | None:
    """A pointer file's text, or None if it is missing or unreadable (a cache, never trusted)."""
    try:
        return safejson.read_bounded(path, SMALL_FILE_MAX).decode("utf-8", errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise EvidenceError(f"{path} cannot be read: {exc.strerror or exc}") from None


def _new_run_id() -> str:
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{os.getpid()}-{secrets.token_hex(3)}"


def _operator(explicit: str | None) -> str | None:
    return explicit or os.environ.get("PAIRCTL_OPERATOR") or procid.login_user()


class EvidenceStore:
    """Receipts, chains and journals under one root (default: `Home.evidence`)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        self.receipts_dir = self.root / "receipts"
        self.journal_dir = self.root / "journal"
        self.heads_dir = self.root / "heads"
        self.locks_dir = self.root / "locks"
        self.index_dir = self.root / "index"
        self.log = logging_setup.get_logger(evidence=str(self.root))

    def _ensure(self) -> None:
        for d in (self.root, self.receipts_dir, self.journal_dir, self.heads_dir, self.locks_dir):
            d.mkdir(parents=True, exist_ok=True)

    def path_of(self, sha: str) -> Path:
        return self.receipts_dir / f"{sha}.json"

    # -- this home among the team's (evidence/team.py) ---------------------------------------
    def home_id(self, *, create: bool = True) -> str:
        """This home's name in the team (its remote branch, the `evidence_home` of its route
        records): made once from user, machine and a random part, kept in `home-id`."""
        path = self.root / "home-id"
        found = _read_small(path)
        if found and HOME_ID.match(found):
            return found
        if found is not None or not create:
            if found is None:
                return ""
            raise EvidenceError(f"{path} does not hold a home id (letters, digits, . _ - only)")
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{_operator(None) or 'operator'}-{os.uname().nodename}")
        self.root.mkdir(parents=True, exist_ok=True)
        atomic.write_once(path, f"{base.strip('-._')[:48] or 'home'}-{secrets.token_hex(3)}".encode(), mode=0o644)
        return self.home_id(create=False)

    def team_dir(self, home: str) -> Path:
        if not HOME_ID.match(home):
            raise EvidenceError(f"{home!r} cannot name an operator home (letters, digits, . _ - only)")
        return self.root / "team" / home

    def team_store(self, home: str) -> EvidenceStore | None:
        """The pulled copy of another home's evidence (None: none pulled, or `home` is this one)."""
        if not HOME_ID.match(home) or home == self.home_id(create=False):
            return None
        d = self.team_dir(home)
        return EvidenceStore(d) if (d / "receipts").is_dir() else None

    def team_stores(self) -> dict[str, EvidenceStore]:
        d = self.root / "team"
        names = sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []
        return {n: s for n in names if (s := self.team_store(n)) is not None}

    def _lock(self, chain: str) -> ChainLock:
        return ChainLock(self.locks_dir / f"{_check_chain_name(chain)}.lock")

    # -- starting a run ----------------------------------------------------------------------
    def begin(
        self,
        command: str,
        argv: list[str],
        pair: str | None = None,
        inputs: dict[str, str] | None = None,
        operator: str | None = None,
    ) -> Journal:
        """Open a journal for one run. For a pair: take the pair's chain lock for the whole run
        (EvidenceBusy if another live run holds it) and first seal any killed run of that pair."""
        self._ensure()
        chain = _check_chain_name(pair or NO_PAIR)
        run_id = _new_run_id()
        lock: ChainLock | None = None
        if pair is not None:
            lock = self._lock(chain)
            holder = {"run_id": run_id, "pid": os.getpid(), "command": command}
            if not lock.acquire(holder=holder):
                h = lock.holder()
                who = (
                    f"(pid {h['pid']}, {h.get('command', 'pairctl')}, run {h['run_id']})"
                    if h.get("pid")
                    else f"(it has not recorded itself in {lock.path} yet)"
                )
                raise EvidenceBusy(
                    f"pair {pair!r} is being run by another pairctl process {who}",
                    hint="wait for it to finish; a killed run releases the pair by itself",
                )
        journal: Journal | None = None
        try:
            recovered = self._recover(chain, lock_held=lock is not None)
            header = dict(schema_version=SCHEMA_VERSION, run_id=run_id, command=command, argv=mask_argv(list(argv)))
            header.update(pair=pair, inputs=dict(inputs or {}), operator=_operator(operator))
            header["host"] = procid.this_process().model_dump()
            seal = functools.partial(self._seal, lock=lock)
            journal = Journal(self.journal_dir / f"{run_id}.jsonl", lock, seal=seal, header=header)
        except BaseException:
            if journal is not None:
                journal.close_unfinished()  # also releases the lock
                journal.path.unlink(missing_ok=True)
            if lock is not None:
                lock.release()
            raise
        journal.recovered = recovered
        return journal

    # -- recovery of killed runs -------------------------------------------------------------
    def recover_aborted(self, pair: str | None | EllipsisType = ...) -> list[str]:
        """Seal every journal of a dead process as an `aborted` receipt; their hashes. `pair=...`:
        every chain; None: runs without a pair. Chains held by a live run are left to it."""
        if not self.journal_dir.exists():
            return []
        chains = {NO_PAIR if pair is None else pair} if pair is not ... else None
        out: list[str] = []
        for chain in sorted(chains or {s.chain for s, _ in self._journals()}):
            out += self._recover(chain, lock_held=False)
        return out

    def _journals(self) -> Iterator[tuple[JournalState, Path]]:
        """The journals this user wrote. A journal proves a run dead (freeing its leases) and is
        sealed into a chain, so one of another user is skipped with a warning, never believed."""
        me = os.geteuid()
        for path in sorted(self.journal_dir.glob("*.jsonl")):
            try:
                with safejson.open_regular(path) as f:
                    owner = os.fstat(f.fileno()).st_uid
                    if owner != me:
                        self.log.warning("journal of another user skipped", journal=str(path), owner_uid=owner, uid=me)
                        continue
                    first = f.readline(safejson.MAX_RECEIPT_BYTES)
                state = JournalState()
                state.apply(safejson.loads(first, what=f"journal {path}"))
                HostInfo(**state.header["host"])
                if not isinstance(state.header.get("run_id"), str):
                    raise ValueError("no run id")
            except (OSError, ValueError, KeyError, TypeError, AttributeError, EvidenceError, RecursionError) as exc:
                self._drop_empty_journal(path, exc)
                continue
            yield state, path

    def _drop_empty_journal(self, path: Path, exc: Exception) -> None:
        """A journal without a whole `begin` line: removed once the pid in its name is gone."""
        try:
            pid = int(path.stem.split("-")[1])
        except (IndexError, ValueError):
            pid = None
        if pid is not None and path.is_file() and procid.start_ticks(pid) is None and path.stat().st_size < 4096:
            self.log.warning("empty journal of a dead process removed", journal=str(path))
            path.unlink(missing_ok=True)
        else:
            self.log.warning("unreadable journal skipped", journal=str(path), error=str(exc))

    def unsealed(self) -> list[dict[str, Any]]:
        """Journals present now: live runs and killed ones not yet recovered (for status/verify)."""
        out = []
        for state, path in self._journals():
            h = state.header
            alive, why = procid.liveness(HostInfo(**h["host"]))
            j = {"run_id": state.run_id, "pair": h.get("pair"), "command": h.get("command"), "journal": str(path)}
            out.append({**j, "alive": alive, "why": why, "owner": _owner_of(h.get("host"))})
        return out

    def run_status(self, run_id: str) -> tuple[str, str]:
        """(state, why): "ended", "dead" (killed, not sealed), "running", "elsewhere" (another
        machine's journal) or "unknown". Only "ended" and "dead" prove its leases unused."""
        return self.run_record(run_id)[:2]

    def run_record(self, run_id: str) -> tuple[str, str, str | None]:
        """run_status plus its owner (`user@machine`). "ended" only from a receipt that verifies and
        that its chain's head reaches: a forged receipt beside the chain never proves a run over."""
        for j in self.unsealed():
            if j["run_id"] == run_id:
                state = {True: "running", False: "dead", None: "elsewhere"}[j["alive"]]
                return state, f"{j['command']} run {run_id}: {j['why']}", j.get("owner")
        for summ in self.summaries():
            if summ.get("run_id") != run_id:
                continue
            if not summ.get("in_chain"):
                why = f"receipt {summ['hash'][:12]} names run {run_id} but is not reachable from "
                return (
                    "unknown",
                    f"{why}chain {summ.get('pair') or NO_PAIR!r}'s head (run `pairctl receipts verify`)",
                    None,
                )
            why = f"{summ['command']} run {run_id} ended {summ['outcome']} (receipt {summ['hash'][:12]})"
            return "ended", why, summ.get("owner")
        return "unknown", f"no run {run_id} in the evidence under {self.root}", None

    def _recover(self, chain: str, *, lock_held: bool) -> list[str]:
        candidates = [(s, p) for s, p in self._journals() if s.chain == chain] if self.journal_dir.exists() else []
        dead = []
        for state, path in candidates:
            alive, why = procid.liveness(HostInfo(**state.header["host"]))
            if alive is False:
                dead.append((path, why))
            elif alive is None:
                self.log.warning("journal of another host left alone", journal=str(path), why=why)
        if not dead:
            return []
        lock: ChainLock | None = None
        if not lock_held:
            lock = self._lock(chain)
            if not lock.acquire(wait_s=0 if chain != NO_PAIR else 10.0):
                return []  # a live run holds the chain; it recovers when it begins
        out = []
        try:
            for path, why in dead:
                sha = self._recover_one(path, why, lock_held=True)
                if sha:
                    out.append(sha)
        finally:
            if lock is not None:
                lock.release()
        return out

    def _recover_one(self, path: Path, why: str, *, lock_held: bool) -> str | None:
        try:
            state, problems = replay(path)
        except FileNotFoundError:  # sealed meanwhile by a run that had the chain's lock
            return None
        head = self._head(state.chain)
        if state.finish is not None:
            # It finished but died while sealing: the receipt may already be the chain's head.
            if head is not None and self._field_of(head, "run_id", None) == state.run_id:
                path.unlink(missing_ok=True)
                return None
            outcome, reason = state.finish["outcome"], state.finish["reason"]
            reason = f"{reason} (sealed later from its journal: {why})"
        else:
            in_progress = [s["name"] for s in state.open_steps.values()]
            outcome = "aborted"
            reason = f"pairctl was killed ({why})" + (f" during step {', '.join(in_progress)}" if in_progress else "")
        if problems:
            reason += "; " + "; ".join(problems)
        sha = self._write_receipt(
            state.seal(outcome=outcome, reason=reason, previous=head, recovered=True), state.chain
        )
        path.unlink(missing_ok=True)
        atomic.fsync_dir(path.parent)
        self.log.warning(
            "a previous run was killed; sealed its journal as an aborted receipt",
            pair=state.header.get("pair"),
            run_id=state.run_id,
            command=state.header.get("command"),
            receipt=sha,
            why=why,
        )
        return sha

    def _field_of(self, sha: str, key: str, default: Any) -> Any:
        """One field of a receipt file, unchecked (`default`: unreadable)."""
        try:
            return safejson.loads(safejson.read_receipt(self.path_of(sha)), what="receipt").get(key)
        except (OSError, EvidenceError, AttributeError):
            return default

    # -- sealing -----------------------------------------------------------------------------
    def _seal(
        self, state: JournalState, journal_path: Path, *, lock: ChainLock | None, outcome: str, reason: str
    ) -> str:
        own = lock is None or not lock.held
        if own:
            lock = self._lock(state.chain)
            if not lock.acquire(wait_s=30.0):
                raise EvidenceBusy(
                    f"evidence chain {state.chain!r} stayed locked for 30 s; the journal {journal_path} is kept"
                )
        try:
            head = self._head(state.chain)
            sha = self._write_receipt(state.seal(outcome=outcome, reason=reason, previous=head), state.chain)
            journal_path.unlink(missing_ok=True)
            atomic.fsync_dir(journal_path.parent)
        finally:
            if own and lock is not None:
                lock.release()
        return sha

    def _write_receipt(self, sealed: tuple[str, bytes, Receipt], chain: str) -> str:
        sha, data, receipt = sealed
        pending = self.heads_dir / f"{chain}.pending"
        atomic.replace(pending, sha.encode())
        path = self.path_of(sha)
        if not atomic.write_once(path, data) and sha256_bytes(safejson.read_receipt(path)) != sha:
            raise EvidenceError(f"receipt file {path} exists with different content; run `pairctl receipts verify`")
        atomic.replace(self.heads_dir / chain, sha.encode())
        pending.unlink(missing_ok=True)
        self._index_put(sha, summary_of(receipt, sha))
        WRITTEN.add(self.root)
        return sha

    # -- summary index (a cache for listing; `verify` never reads it) -------------------------
    def _index_put(self, sha: str, summary: dict[str, Any]) -> None:
        try:
            self.index_dir.mkdir(parents=True, exist_ok=True)
            atomic.replace(self.index_dir / f"{sha}.json", json.dumps(summary, sort_keys=True).encode())
        except OSError as exc:  # a cache: never fail a run over it
            self.log.warning("receipt index not written", receipt=sha, error=str(exc))

    def summaries(self, pair: str | None | EllipsisType = ...) -> list[dict[str, Any]]:
        """Summaries oldest first, each read from its receipt and checked against its name (the
        index is never read here: a forged entry cannot change an outcome). `in_chain`: reachable
        from its chain's head through receipts that verify."""
        every: dict[str, dict[str, Any]] = {}
        for sha in self.hashes():
            try:
                summary = self.summary_of(sha)
            except EvidenceError as exc:
                self.log.warning("receipt skipped", receipt=sha, error=str(exc).splitlines()[0])
                continue
            every[sha] = summary
        pruned = self.pruned(every)
        for chain in {s["pair"] or NO_PAIR for s in every.values()}:
            head = _read_small(self.heads_dir / chain)
            seen: set[str] = set()
            while head and head not in seen:
                seen.add(head)
                if head in every and (every[head]["pair"] or NO_PAIR) == chain:
                    every[head]["in_chain"] = True
                    head = every[head]["previous"]
                elif head not in every and pruned.get(head, {}).get("chain") == chain:
                    head = pruned[head].get("previous")  # pruned: step over it by its recorded link
                else:
                    break
        out = [s for s in every.values() if pair is ... or s.get("pair") == pair]
        for s in out:
            s.setdefault("in_chain", False)
        out.sort(key=lambda s: (s["finished_at"], s["started_at"]))
        return out

    def pruned(self, summaries: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
        """hash -> its entry in the verified prune receipt that accounts for it (evidence/prune.py)."""
        from orchestrator.evidence.prune import COMMAND, accounted

        every = summaries if summaries is not None else {s["hash"]: s for s in self.summaries()}
        records = []
        for sha, summ in every.items():
            if summ.get("command") == COMMAND:
                try:
                    records.append(self.load(sha))
                except EvidenceError:
                    continue
        return accounted(records)

    def summary_of(self, sha: str) -> dict[str, Any]:
        """One receipt's summary, its file checked against its name on every call, parsed once."""
        path = self.path_of(sha)
        data = _read_receipt(path)
        if sha256_bytes(data) != sha:
            raise EvidenceError(f"receipt file {path} does not match its name")
        if sha in _SUMMARIES:
            return dict(_SUMMARIES[sha])
        obj = safejson.loads(data, what=f"receipt file {path}")
        if not isinstance(obj, dict):
            raise EvidenceError(f"receipt file {path} is not a receipt")
        summary = {k: obj.get(k) for k in (*_SUMMARY_STR, *_SUMMARY_OPT) if k != "hash"}
        summary.update(hash=sha, recovered=obj.get("recovered") is True, owner=_owner_of(obj.get("host")))
        # outside every chain yet about one pair: a qualification, a bisect and its steps
        step = obj.get("bisect_step")
        about = obj.get("qualify_pair") or obj.get("bisect_pair")
        if about is None and isinstance(step, dict):
            about = step.get("pair")
        summary["about_pair"] = about if isinstance(about, str) else None
        if not _summary_ok(summary) or summary["outcome"] not in OUTCOMES:
            raise EvidenceError(f"receipt file {path} is not a valid receipt (summary fields)")
        _SUMMARIES[sha] = dict(summary)
        return summary

    def _head(self, chain: str) -> str | None:
        """The chain's newest receipt, repairing a head left behind by a crash mid-seal."""
        head_file = self.heads_dir / chain
        pending = self.heads_dir / f"{chain}.pending"
        head = _read_small(head_file)
        if pending.exists():
            p = _read_small(pending) or ""
            if _HASH.match(p) and self.path_of(p).exists():
                if self._field_of(p, "previous", "?") == head:
                    atomic.replace(head_file, p.encode())
                    head = p
            pending.unlink(missing_ok=True)
        if head is not None:
            if not _HASH.match(head):
                raise EvidenceError(f"the head file {head_file} is not a receipt hash; run `pairctl receipts verify`")
            if not self.path_of(head).exists():  # never block a run: chain on, `verify` shows the gap
                self.log.warning(
                    "the newest receipt of this chain is missing; run `pairctl receipts verify`",
                    chain=chain,
                    missing=head,
                )
            return head
        # No head file: fall back to the receipts themselves (heads are only a cache).
        members = [r for r in self.iter() if r.chain == chain]
        if not members:
            return None
        referenced = {r.previous for r in members}
        tips = [r.sha256 for r in members if r.sha256 not in referenced]
        if len(tips) != 1:
            raise EvidenceError(f"evidence chain {chain!r} has {len(tips)} ends; run `pairctl receipts verify`")
        atomic.replace(head_file, tips[0].encode())
        return tips[0]

    # -- reading -----------------------------------------------------------------------------
    def hashes(self) -> list[str]:
        if not self.receipts_dir.exists():
            return []
        return sorted(p.name[:-5] for p in self.receipts_dir.glob("*.json") if _HASH.match(p.name[:-5]))

    def resolve(self, ref: str) -> str:
        """A full receipt hash from a hash or a unique prefix (at least 4 hex digits)."""
        ref = ref.strip().lower().removesuffix(".json")
        if _HASH.match(ref):
            if not self.path_of(ref).exists():
                raise EvidenceError(f"no receipt {ref} in {self.receipts_dir}")
            return ref
        if not re.fullmatch(r"[0-9a-f]{4,63}", ref):
            raise EvidenceError(f"{ref!r} is not a receipt hash or hash prefix (4+ hex digits)")
        found = [h for h in self.hashes() if h.startswith(ref)]
        if not found:
            raise EvidenceError(f"no receipt starting with {ref} in {self.receipts_dir}")
        if len(found) > 1:
            raise EvidenceError(f"{ref} is ambiguous: {', '.join(h[:16] for h in found[:5])}...")
        return found[0]

    def load(self, ref: str) -> Receipt:
        """A receipt by hash (or prefix), checked against its name: a changed byte is an error."""
        sha = self.resolve(ref)
        path = self.path_of(sha)
        data = _read_receipt(path)
        actual = sha256_bytes(data)
        if actual != sha:
            raise EvidenceError(
                f"receipt file {path} does not match its name (its sha256 is {actual})",
                hint="it was changed after it was written; run `pairctl receipts verify`",
            )
        try:  # _read_receipt refused a file larger than any receipt
            receipt = Receipt.model_validate_json(data)
        except (ValueError, RecursionError) as exc:  # pydantic's ValidationError is a ValueError
            raise EvidenceError(
                f"receipt file {path} is not a valid receipt: {str(exc).splitlines()[0]}",
                hint="run `pairctl receipts verify`",
            ) from None
        receipt._sha256 = sha
        return receipt

    def iter(self, pair: str | None | EllipsisType = ...) -> Iterator[Receipt]:
        """Every receipt that verifies, oldest first; `pair=` filters (None: receipts with no pair)."""
        for summary in self.summaries(pair):
            try:
                r = self.load(summary["hash"])
            except (EvidenceError, ValueError) as exc:
                self.log.warning("receipt skipped", receipt=summary["hash"], error=str(exc).splitlines()[0])
                continue
            if pair is ... or r.pair == pair:
                yield r

    def latest(self, pair: str | None) -> Receipt | None:
        """The newest receipt of a pair's chain (None: no receipt yet)."""
        chain = _check_chain_name(pair or NO_PAIR)
        head = _read_small(self.heads_dir / chain)
        if head and _HASH.match(head) and self.path_of(head).is_file():
            with contextlib.suppress(EvidenceError):  # else fall back to the receipts themselves
                return self.load(head)
        members = list(self.iter(pair))
        return members[-1] if members else None

    # -- derived records ---------------------------------------------------------------------
    def derive(
        self,
        original_hash: str,
        reuse: list[str],
        reason: str,
        fresh_steps: Sequence[StepRecord | dict[str, Any]] | None = None,
        *,
        fresh_samples: dict[str, list[dict[str, Any]]] | None = None,
        fields: dict[str, Any] | None = None,
        identities: list[tuple[str, dict[str, Any]]] | None = None,
        outcome: str | None = None,
        command: str = "receipts derive",
        argv: list[str] | None = None,
        operator: str | None = None,
    ) -> str:
        """A new receipt reusing passed steps of `original_hash` by reference, with `fresh_steps`
        re-run now; the original is only read. Returns the new receipt's hash."""
        original = self.load(original_hash)
        fresh = [s if isinstance(s, StepRecord) else _fresh_step(s) for s in (fresh_steps or [])]
        fresh_names = [s.name for s in fresh]
        reuse = list(dict.fromkeys(reuse))

        bad_fields = [k for k in (fields or {}) if k in RESERVED_FIELDS or k.startswith("_")]
        if bad_fields:
            raise EvidenceError(f"derive: {', '.join(bad_fields)} are reserved receipt fields")
        if outcome is not None and outcome not in OUTCOMES:
            raise EvidenceError(f"derive: outcome must be one of {OUTCOMES}, not {outcome!r}")
        if not reuse:
            raise EvidenceError("derive needs at least one step to reuse (--reuse STEP)")
        if not reason.strip():
            raise EvidenceError("derive needs a reason (--reason TEXT)")
        reused: dict[str, dict[str, Any]] = {}
        run = [s.name for s in original.steps]
        for name in reuse:
            if name in fresh_names:
                raise EvidenceError(f"step {name!r} is both reused and given fresh; choose one")
            if name in original.reused_steps:
                ref = original.reused_steps[name]  # reuse through a derived record: point at the source
                reused[name] = ref.model_dump(by_alias=True)
                continue
            step = original.step(name)
            if step is None:
                raise EvidenceError(
                    f"cannot reuse step {name!r}: it was not run in receipt {original.sha256[:12]} "
                    f"(steps: {', '.join(run) or 'none'})"
                )
            if step.outcome != "passed":
                raise EvidenceError(
                    f"refusing to reuse step {name!r}: it {step.outcome} in receipt {original.sha256[:12]}"
                    + (f" ({step.error or step.skip_reason})" if (step.error or step.skip_reason) else "")
                )
            rows = original.samples.get(name)
            reused[name] = ReusedStep(
                from_=original.sha256,
                data_sha256=step.data_sha256(),
                samples_sha256=samples_sha256(rows),
                samples=len(rows or []),
                outcome=step.outcome,
            ).model_dump(by_alias=True)
        if argv is None:
            argv = ["receipts", "derive", "--from", original.sha256, *[a for n in reuse for a in ("--reuse", n)]]
            argv += ["--reason", reason]
        with self.begin(command, argv, pair=original.pair, inputs=original.inputs, operator=operator) as j:
            j.record_derivation(original.sha256, reused, fresh_names)
            for key, value in (fields or {}).items():
                j.set(key, value)
            for host, data in identities or []:
                j.identity(host, data)
            for s in fresh:
                j.record_step(**s.model_dump(exclude={"seq"}))
            for step_name, rows in (fresh_samples or {}).items():
                j.samples(step_name, rows)
            cov = coverage(original, reuse, fresh, list(identities or []))
            j.set("coverage", cov.to_json())
            final = derived_outcome(cov, outcome)
            return j.finish(final, reason if cov.complete else f"{reason} [incomplete: {cov.why()}]")

    def step_view(self, ref: str, step: str) -> tuple[StepRecord, list[Any]]:
        """A step's record and samples, following a derived record's reference to the source and
        checking that data against the hashes the derived record holds."""
        rec, rows = self._step_view(ref, step)
        return rec, rows or []

    def _step_view(self, ref: str, step: str) -> tuple[StepRecord, list[Any] | None]:
        receipt = self.load(ref)
        if step in receipt.reused_steps:
            r = receipt.reused_steps[step]
            rec, rows = self._step_view(r.from_, step)
            if rec.data_sha256() != r.data_sha256 or samples_sha256(rows) != r.samples_sha256:
                raise EvidenceError(
                    f"step {step!r} of {r.from_[:12]} does not match the hashes in {receipt.sha256[:12]}"
                )
            return rec, rows
        found = receipt.step(step)
        if found is None:
            raise EvidenceError(f"receipt {receipt.sha256[:12]} has no step {step!r}")
        return found, receipt.samples.get(step)

    def verify(self) -> VerifyReport:
        return verify_store(self)


def _read_receipt(path: Path) -> bytes:
    try:
        return safejson.read_receipt(path)  # a link or a huge file is refused before reading
    except OSError as exc:
        raise EvidenceError(f"receipt file {path} cannot be read: {exc.strerror or exc}") from None


def _fresh_step(d: dict[str, Any]) -> StepRecord:
    if d.get("outcome") not in STEP_OUTCOMES:
        raise EvidenceError(f"fresh step {d.get('name')!r}: outcome must be one of {STEP_OUTCOMES}")
    return StepRecord.of(0, d, at=utc_now())


_SUMMARY_STR = ("hash", "run_id", "command", "outcome", "reason", "started_at", "finished_at")
_SUMMARY_OPT = ("pair", "previous", "derived_from")


def _owner_of(host: Any) -> str | None:
    """`user@machine` of a receipt's or journal's host record (what leases name as owner)."""
    if isinstance(host, dict) and isinstance(host.get("user"), str) and isinstance(host.get("hostname"), str):
        return f"{host['user']}@{host['hostname']}"
    return None


def _summary_ok(summary: Any) -> bool:
    """An index entry is a cache: any field of the wrong type means rebuild it from the receipt."""
    return (
        isinstance(summary, dict)
        and all(isinstance(summary.get(k), str) for k in _SUMMARY_STR)
        and all(summary.get(k) is None or isinstance(summary.get(k), str) for k in _SUMMARY_OPT)
    )
