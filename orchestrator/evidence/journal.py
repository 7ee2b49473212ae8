"""The journal: a run's receipt written as it happens, one fsynced JSON line per event. A killed
run's journal is replayed (`replay`) into an `aborted` receipt by the same reducer
(`JournalState.apply`) that builds a finished run's, so the two cannot drift apart."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from orchestrator import interrupt
from orchestrator import log as logging_setup  # the module: log.py imports evidence.masking
from orchestrator.errors import EvidenceError, Inconclusive
from orchestrator.evidence import jsonable, safejson
from orchestrator.evidence.masking import MASK, is_secret_key, mask_data, mask_text, may_hold_secret
from orchestrator.evidence.receipt import (
    NO_PAIR,
    OUTCOMES,
    RESERVED_FIELDS,
    STEP_OUTCOMES,
    FieldSet,
    HostInfo,
    Identity,
    Note,
    Receipt,
    ReusedStep,
    StepRecord,
    canonical_text,
    seal_bytes,
    utc_now,
)


class JournalState:
    """Everything a journal has recorded so far; pure, rebuilt from events."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.open_steps: dict[int, dict[str, Any]] = {}
        self.steps: dict[int, StepRecord] = {}
        self.identities: list[Identity] = []
        self.samples_text: dict[str, list[str]] = {}  # step -> canonical JSON of each call's rows, no brackets
        self.samples_count: dict[str, int] = {}
        self.notes: list[Note] = []
        self.fields: dict[str, Any] = {}
        self.fields_set: list[FieldSet] = []
        self.first_sample_at: str | None = None
        self.derive: dict[str, Any] | None = None
        self.finish: dict[str, Any] | None = None
        self.last_at: str | None = None
        self.last_seq = -1

    @property
    def run_id(self) -> str:
        run_id = self.header["run_id"]
        if not isinstance(run_id, str):  # the store checks this when it reads a journal; a header is untrusted
            raise EvidenceError(f"journal header: run_id is {type(run_id).__name__}, not a string")
        return run_id

    @property
    def chain(self) -> str:
        return self.header.get("pair") or NO_PAIR

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev["ev"]
        self.last_seq = ev.get("seq", self.last_seq)
        self.last_at = ev.get("at", self.last_at)
        if kind == "begin":
            self.header = {k: v for k, v in ev.items() if k not in ("ev", "seq", "at")}
            self.header["started_at"] = ev["at"]
        elif kind == "step_start":
            self.open_steps[ev["seq"]] = ev
        elif kind == "step_end":
            start = self.open_steps.pop(ev["start_seq"])
            self.steps[ev["start_seq"]] = StepRecord.of(
                ev["start_seq"],
                {**ev, "name": start["name"], "host": start.get("host"), "started_at": start["at"]},
                at=ev["at"],
            )
        elif kind == "step":
            self.steps[ev["seq"]] = StepRecord.of(ev["seq"], ev, at=ev["at"])
        elif kind == "identity":
            self.identities.append(Identity(host=ev["host"], at=ev["at"], data=ev["data"]))
        elif kind == "samples":  # replayed from a file; a live journal calls add_samples directly
            self.add_samples(ev["step"], canonical_text(ev["rows"])[1:-1], len(ev["rows"]), ev["at"], ev["seq"])
        elif kind == "note":
            self.notes.append(Note(at=ev["at"], text=ev["text"]))
        elif kind == "set":
            self.fields[ev["key"]] = ev["value"]
            self.fields_set.append(FieldSet(key=ev["key"], at=ev["at"], seq=ev["seq"]))
        elif kind == "derive":
            self.derive = ev
        elif kind == "finish":
            self.finish = ev
        else:
            raise EvidenceError(f"unknown journal event {kind!r}")

    def add_samples(self, step: str, rows_text: str, n: int, at: str, seq: int) -> None:
        self.samples_text.setdefault(step, []).append(rows_text)
        self.samples_count[step] = self.samples_count.get(step, 0) + n
        if self.first_sample_at is None and n:
            self.first_sample_at = at
        self.last_seq, self.last_at = seq, at

    def seal(
        self, *, outcome: str, reason: str, previous: str | None, recovered: bool = False
    ) -> tuple[str, bytes, Receipt]:
        """(sha256, bytes, receipt without samples) of the receipt this journal makes."""
        receipt = self.to_receipt(outcome=outcome, reason=reason, previous=previous, recovered=recovered)
        sha, data = seal_bytes(receipt, self.samples_text)
        return sha, data, receipt

    def to_receipt(self, *, outcome: str, reason: str, previous: str | None, recovered: bool = False) -> Receipt:
        """The receipt without its samples (they are spliced in as text by `seal`)."""
        steps = dict(self.steps)
        for seq, start in self.open_steps.items():  # only on recovery: killed during these steps
            steps[seq] = StepRecord(
                seq=seq,
                name=start["name"],
                host=start.get("host"),
                started_at=start["at"],
                finished_at=None,
                outcome="aborted",
                error="the run was killed while this step was in progress",
            )
        h = self.header
        derive = self.derive or {}
        return Receipt(
            schema_version=h.get("schema_version", 1),
            run_id=h["run_id"],
            command=h["command"],
            argv=h["argv"],
            operator=h.get("operator"),
            host=HostInfo(**h["host"]),
            started_at=h["started_at"],
            finished_at=(self.finish or {}).get("at") or self.last_at or h["started_at"],
            pair=h.get("pair"),
            inputs=h.get("inputs") or {},
            identities=self.identities,
            steps=[steps[k] for k in sorted(steps)],
            samples={},
            notes=self.notes,
            fields_set=self.fields_set,
            first_sample_at=self.first_sample_at,
            outcome=outcome,
            reason=reason,
            previous=previous,
            derived_from=derive.get("derived_from"),
            reused_steps={k: ReusedStep.model_validate(v) for k, v in (derive.get("reused_steps") or {}).items()},
            fresh_steps=derive.get("fresh_steps") or [],
            recovered=recovered,
            **self.fields,
        )


def replay(path: Path) -> tuple[JournalState, list[str]]:
    """Rebuild a journal's state from its file; a torn last line (killed mid-write) is dropped."""
    state = JournalState()
    problems: list[str] = []
    # a journal becomes a receipt: bounded as one (a regular file, not a link; safejson)
    lines = safejson.read_bounded(path, safejson.MAX_RECEIPT_BYTES).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i, line in enumerate(lines):
        try:
            ev = json.loads(line)
        except RecursionError:
            raise EvidenceError(f"journal {path} line {i + 1} is nested too deeply") from None
        except ValueError:
            if i == len(lines) - 1:
                problems.append(f"the journal's last line was incomplete ({len(line)} bytes) and was dropped")
                break
            raise EvidenceError(f"journal {path} line {i + 1} is not JSON") from None
        state.apply(ev)
    if not state.header:
        raise EvidenceError(f"journal {path} has no begin event")
    return state, problems


class _SkipStep(Exception):
    pass


class StepHandle:
    """What `with journal.step(...) as step:` gives: `data` to fill, `skip()`, `fail()`."""

    def __init__(self, name: str, host: str | None) -> None:
        self.name = name
        self.host = host
        self.data: dict[str, Any] = {}
        self.outcome: str | None = None
        self.message: str | None = None

    def skip(self, reason: str) -> None:
        """Mark the step skipped and leave the `with` block."""
        self.outcome, self.message = "skipped", reason
        raise _SkipStep(reason)

    def fail(self, message: str) -> None:
        """Mark the step failed without raising (a check that records its failure and goes on)."""
        self.outcome, self.message = "failed", message


class ChainLock(Protocol):
    """The lock on the pair's evidence chain that a journal holds for its whole run."""

    def release(self) -> None: ...


class Seal(Protocol):
    """The store's sealing of a finished journal (chains the receipt, removes the file): its hash."""

    def __call__(self, state: JournalState, journal_path: Path, *, outcome: str, reason: str) -> str: ...


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
# Receipt fields that are also log events: a deploy's rollback and the state it left the pair in.
_LOGGED_FIELDS = {"rollback": "rollback", "final_state": "final state"}


class Journal:
    """An open run, from `EvidenceStore.begin`; sealed by `finish` through the store's `seal`."""

    def __init__(self, path: Path, lock: ChainLock | None, *, seal: Seal, header: dict[str, Any]) -> None:
        self.path = path
        self._lock = lock
        self._seal = seal
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._state = JournalState()
        self._seq = 0
        self._mutex = threading.RLock()  # fan-out threads (a pair's two hosts) share one journal
        self._pending = bytearray()  # events not yet on disk (the operator's disk was full)
        self._no_room: str | None = None  # why the first write found no room
        self.receipt_hash: str | None = None
        self.recovered: list[str] = []  # receipts sealed from dead runs when this one began
        try:
            self._emit("begin", **header)
        except BaseException:
            self.close_unfinished()  # also releases the lock
            path.unlink(missing_ok=True)
            raise
        self._log("run started", argv=header.get("argv"))

    # -- the JSON log: one info event per step, check, rollback and outcome (audit, alerting) -------
    def _log(self, event: str, **fields: Any) -> None:
        """An info event in pairctl's JSON log naming this run (run id, pair, command)."""
        try:
            logging_setup.audit(
                event, run_id=self.run_id, pair=self.pair, command=self._state.header.get("command"), **fields
            )
        except Exception:  # a log that cannot be written never fails the run (the receipt is the record)
            pass

    def _log_step(self, name: str, outcome: str, duration_s: float | None, error: str | None, host: str | None) -> None:
        kind, _, bare = name.partition(":") if name.startswith("check:") else ("step", "", name)
        self._log(kind, **{kind: bare}, outcome=outcome, host=host, duration_s=duration_s, error=error)

    # -- writing -----------------------------------------------------------------------------
    def _emit(self, kind: str, **fields: Any) -> int:
        return self._append(kind, fields)

    def _append(self, kind: str, fields: dict[str, Any], rows: tuple[str, int] | None = None) -> int:
        """Append one event; `rows`: a samples event's canonical rows text and count, spliced in."""
        with self._mutex:
            if self._fd is None:
                raise EvidenceError(f"journal {self._state.header.get('run_id') or self.path.name} is already finished")
            seq, at = self._seq, utc_now()
            text = jsonable.dumps({"ev": kind, "seq": seq, "at": at, **fields})
            self._seq += 1

            def keep() -> None:
                if rows is None:
                    self._state.apply(json.loads(text))
                else:
                    self._state.add_samples(fields["step"], rows[0][1:-1], rows[1], at, seq)

            try:
                self._write(((text if rows is None else f'{text[:-1]},"rows":{rows[0]}}}') + "\n").encode("utf-8"))
            except EvidenceError:
                if self._no_room is None:
                    raise
                keep()  # kept (written once there is room): part of the run
                raise
            keep()
            return seq

    def _write(self, data: bytes) -> None:
        """Append (fsync'd). On a full disk the first such write raises EvidenceError (its step
        fails, the run rolls back); later events are kept in memory and appended once there is
        room, so the rollback is never stopped by evidence it cannot write yet."""
        assert self._fd is not None
        self._pending += data
        try:
            while self._pending:
                n = os.write(self._fd, self._pending)
                del self._pending[:n]
            os.fsync(self._fd)
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
            if self._no_room is None:
                self._no_room = exc.strerror or str(exc)
                raise EvidenceError(
                    f"the evidence of this run cannot be written: {self._no_room} ({self.path}); a run that cannot "
                    "keep its evidence cannot accept a pair",
                    hint=f"free space under {self.path.parent.parent}; the run's events are kept and written "
                    "there once there is room",
                ) from None

    @property
    def run_id(self) -> str:
        return self._state.run_id

    @property
    def pair(self) -> str | None:
        return self._state.header.get("pair")

    @property
    def finished(self) -> bool:
        return self._fd is None

    @property
    def state(self) -> JournalState:
        return self._state

    @contextmanager
    def step(self, name: str, host: str | None = None) -> Iterator[StepHandle]:
        """Record one step: start, end, duration, outcome, error text (re-raised), `step.data`."""
        handle = StepHandle(name, host)
        start_seq = self._emit("step_start", name=name, host=host)
        t0 = time.monotonic()
        error: str | None = None
        try:
            yield handle
        except _SkipStep:
            pass
        except Exception as exc:
            handle.outcome, error = "failed", _error_text(exc)
            self._end_step(start_seq, handle, t0, error)
            raise
        except BaseException as exc:  # KeyboardInterrupt, SystemExit
            handle.outcome, error = "aborted", _error_text(exc) or type(exc).__name__
            self._end_step(start_seq, handle, t0, error)
            raise
        self._end_step(start_seq, handle, t0, None)

    def _end_step(self, start_seq: int, h: StepHandle, t0: float, error: str | None) -> None:
        outcome = h.outcome or "passed"
        if outcome == "failed" and error is None:
            error = h.message
        fields = dict(
            start_seq=start_seq,
            outcome=outcome,
            duration_s=round(time.monotonic() - t0, 6),
            error=error,
            skip_reason=h.message if outcome == "skipped" else None,
        )
        try:
            self._emit("step_end", **fields, data=h.data)
        except TypeError as exc:  # step.data held something that is not JSON: keep the step, say why
            problem = f"step data is not JSON-serialisable: {exc}"
            fields.update(outcome="failed", error=f"{error}; {problem}" if error else problem)
            self._emit("step_end", **fields, data={})
            if error is None:
                raise
        finally:
            same = fields["outcome"] == outcome
            err = error if same else str(fields["error"])
            self._log_step(h.name, outcome if same else "failed", round(time.monotonic() - t0, 6), err, h.host)

    def record_step(
        self,
        name: str,
        outcome: str,
        data: dict[str, Any] | None = None,
        *,
        host: str | None = None,
        error: str | None = None,
        skip_reason: str | None = None,
        started_at: str | None = None,
        finished_at: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """Record a step that did not run inside `with journal.step(...)`."""
        if outcome not in STEP_OUTCOMES:
            raise ValueError(f"step outcome must be one of {STEP_OUTCOMES}, not {outcome!r}")
        self._emit(
            "step",
            name=name,
            outcome=outcome,
            host=host,
            data=data or {},
            error=mask_text(error) if error else None,
            skip_reason=skip_reason,
            started_at=started_at,
            finished_at=finished_at,
            duration_s=duration_s,
        )
        self._log_step(name, outcome, duration_s, mask_text(error) if error else skip_reason, host)

    def identity(self, host: str, data: dict[str, Any]) -> None:
        """What was observed on `host` (binary hashes, build_info, argv, route record...)."""
        self._emit("identity", host=host, data=data)

    def samples(self, step_name: str, rows: list[dict[str, Any]]) -> None:
        """Raw samples, kept whole in the receipt (repeatable per step): serialised once, that text
        goes into the journal and, spliced, the receipt. Non-JSON values and secrets go slower."""
        rows = list(rows)
        try:
            text = canonical_text(rows)
        except TypeError:
            rows = jsonable.plain(rows)
            text = canonical_text(rows)
        if may_hold_secret(text):
            text = canonical_text(mask_data(json.loads(text)))
        if jsonable.has_lone_surrogate(text):
            text = canonical_text(jsonable.escape_surrogates(json.loads(text)))
        self._append("samples", {"step": step_name}, (text, len(rows)))

    def note(self, text: str) -> None:
        self._emit("note", text=mask_text(text))

    def set(self, key: str, value: Any) -> None:
        """A command-specific top-level receipt field (e.g. `plan_sha256`), time-stamped."""
        if key in RESERVED_FIELDS or key.startswith("_"):
            raise ValueError(f"{key!r} is a reserved receipt field")
        self._emit("set", key=key, value=MASK if is_secret_key(key) and value is not None else value)
        if key in _LOGGED_FIELDS:  # what a rollback left: an event of its own, for alerting
            self._log(_LOGGED_FIELDS[key], **{key: value})

    def record_derivation(self, derived_from: str, reused_steps: dict[str, Any], fresh_steps: list[str]) -> None:
        """Mark this run as a derived record: steps reused by reference from `derived_from`."""
        self._emit("derive", derived_from=derived_from, reused_steps=reused_steps, fresh_steps=fresh_steps)

    def finish(self, outcome: str, reason: str) -> str:
        """Seal the receipt (chained to the pair's previous one) and return its hash."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        signal_name = interrupt.received()
        if signal_name is not None and outcome in ("failed", "aborted", "inconclusive"):
            # a run that did not pass after a signal stopped it says so, whatever path sealed it
            outcome, reason = "interrupted", f"interrupted by {signal_name}: {reason}"
        with self._mutex:
            try:
                self._emit("finish", outcome=outcome, reason=mask_text(reason))
            except EvidenceError:
                if self._no_room is None or self._fd is None:
                    raise
                # the first write without room: reported below, with what the run did
            fd, self._fd = self._fd, None
        try:
            if self._pending:
                raise OSError(28, self._no_room or "No space left on device")
            self.receipt_hash = self._seal(self._state, self.path, outcome=outcome, reason=mask_text(reason))
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
            raise EvidenceError(
                f"{reason}\nbut its receipt could not be written: {exc.strerror or exc} under "
                f"{self.path.parent.parent}; its journal {self.path} holds its events up to then",
                hint="free space there; the next pairctl command for this pair seals that journal as the run's "
                "receipt (the chain stays intact)",
            ) from None
        finally:
            if fd is not None:
                os.close(fd)
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            self._log("outcome", outcome=outcome, reason=mask_text(reason), receipt=self.receipt_hash,
                      signal=signal_name)  # fmt: skip
        return self.receipt_hash

    def close_unfinished(self) -> None:
        """Drop the file handle without sealing (the journal stays for recovery)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __del__(self) -> None:  # dropped without finish(): seal now, not hold the pair's lock forever
        if getattr(self, "_fd", None) is None:
            return
        try:
            self.finish("aborted", "the run's journal was dropped without finish() (a pairctl bug)")
        except Exception:
            self.close_unfinished()

    # -- context manager ---------------------------------------------------------------------
    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.finished:
            return
        if exc is None:
            failed = [s.name for s in self._state.steps.values() if s.outcome == "failed"]
            if failed:
                self.finish("failed", f"step(s) failed: {', '.join(failed)}")
            else:
                self.finish("passed", "all steps completed")
        elif isinstance(exc, Inconclusive):
            self.finish("inconclusive", _error_text(exc))
        elif isinstance(exc, Exception):
            self.finish("failed", _error_text(exc))
        else:
            self.finish("aborted", f"interrupted ({type(exc).__name__})")


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return mask_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
