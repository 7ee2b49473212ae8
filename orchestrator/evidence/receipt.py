"""The receipt: what one command did, sealed as canonical JSON and named by its sha256.
`previous` chains receipts of one pair; `derived_from`/`reused_steps` let a later record reuse
valid parts of a failed run. Command-specific top-level fields are extra keys, and `fields_set`
records when each was set (so "declared before the first sample" can be shown)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from orchestrator.errors import EvidenceError
from orchestrator.hashing import canonical_json, sha256_bytes, sha256_json

SCHEMA_VERSION = 1

# `incomplete`: a derived record whose reused and fresh steps do not cover what the original required.
Outcome = Literal["passed", "failed", "aborted", "inconclusive", "incomplete", "interrupted"]
# `interrupted`: a signal stopped the run at a bounded point (orchestrator/interrupt.py); reason names it.
OUTCOMES: tuple[str, ...] = ("passed", "failed", "aborted", "inconclusive", "incomplete", "interrupted")
# `aborted` for a step only when the run was killed while the step was in progress.
StepOutcome = Literal["passed", "failed", "skipped", "aborted"]
STEP_OUTCOMES: tuple[str, ...] = ("passed", "failed", "skipped", "aborted")

# Chain key for receipts that belong to no pair (build, lab): they form one chain of their own.
NO_PAIR = "_no-pair"


def utc_now() -> str:
    """ISO-8601 UTC with microseconds and a Z: sortable as text, stable in canonical JSON."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class HostInfo(_Model):
    """The operator machine that ran the command, and how to tell whether its process still lives."""

    hostname: str
    pid: int
    boot_id: str | None = None
    start_ticks: int | None = None  # /proc/<pid>/stat field 22: tells a reused pid apart
    user: str | None = None
    python: str | None = None
    pairctl: str | None = None


class StepRecord(_Model):
    seq: int
    name: str
    host: str | None = None
    started_at: str
    finished_at: str | None = None
    duration_s: float | None = None
    outcome: StepOutcome
    error: str | None = None
    skip_reason: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    def data_sha256(self) -> str:
        return sha256_json(self.data)

    @classmethod
    def of(cls, seq: int, fields: Mapping[str, Any], *, at: str) -> StepRecord:
        """The one way a step is built from recorded fields (a journal event, a caller's dict):
        absent times are `at`, absent data is empty, unknown keys are ignored."""
        return cls(
            seq=seq,
            name=fields["name"],
            host=fields.get("host"),
            started_at=fields.get("started_at") or at,
            finished_at=fields.get("finished_at") or at,
            duration_s=fields.get("duration_s"),
            outcome=fields["outcome"],
            error=fields.get("error"),
            skip_reason=fields.get("skip_reason"),
            data=fields.get("data") or {},
        )


class Identity(_Model):
    host: str
    at: str
    data: dict[str, Any]


class Note(_Model):
    at: str
    text: str


class FieldSet(_Model):
    """When a command-specific top-level field was set, relative to the samples."""

    key: str
    at: str
    seq: int


class ReusedStep(_Model):
    """A step of another receipt taken by reference: its hash and the hashes of its raw data."""

    from_: str = Field(alias="from")
    data_sha256: str
    samples_sha256: str | None = None
    samples: int = 0
    outcome: StepOutcome = "passed"


class Receipt(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_version: int = SCHEMA_VERSION
    run_id: str
    command: str
    argv: list[str]
    operator: str | None = None
    host: HostInfo
    started_at: str
    finished_at: str
    pair: str | None = None
    inputs: dict[str, str] = Field(default_factory=dict)
    identities: list[Identity] = Field(default_factory=list)
    steps: list[StepRecord] = Field(default_factory=list)
    samples: dict[str, list[Any]] = Field(default_factory=dict)
    notes: list[Note] = Field(default_factory=list)
    fields_set: list[FieldSet] = Field(default_factory=list)
    first_sample_at: str | None = None
    outcome: Outcome
    reason: str
    previous: str | None = None
    derived_from: str | None = None
    reused_steps: dict[str, ReusedStep] = Field(default_factory=dict)
    fresh_steps: list[str] = Field(default_factory=list)
    recovered: bool = False  # sealed from a journal by a later process (the run was killed)

    _sha256: str | None = PrivateAttr(default=None)

    @property
    def sha256(self) -> str:
        """The receipt's hash (its file name): set when it is sealed or loaded."""
        if self._sha256 is None:
            raise EvidenceError("this receipt has no hash yet: it was neither sealed nor loaded")
        return self._sha256

    @property
    def chain(self) -> str:
        return self.pair or NO_PAIR

    def step(self, name: str) -> StepRecord | None:
        """The last record of the step called `name` (a step may be retried)."""
        return next((s for s in reversed(self.steps) if s.name == name), None)

    def identity_of(self, host: str) -> dict[str, Any] | None:
        """The latest identity observed on `host`."""
        return next((i.data for i in reversed(self.identities) if i.host == host), None)

    def extra_fields(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def to_json_obj(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.to_json_obj())


def canonical_text(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def seal_bytes(receipt: Receipt, samples_text: dict[str, list[str]] | None = None) -> tuple[str, bytes]:
    """(sha256, canonical bytes). With `samples_text` (step -> each call's rows as the journal
    wrote them, brackets stripped) the samples are spliced in as text, not serialised again (a
    100k-sample receipt in under a second); the bytes equal `canonical_json` of the whole."""

    if samples_text is None:
        data = receipt.canonical_bytes()
        return sha256_bytes(data), data
    top = receipt.model_dump(mode="json", by_alias=True, exclude={"samples"})
    parts = []
    for key in sorted([*top, "samples"]):
        if key == "samples":
            steps = ",".join(
                f"{canonical_text(step)}:[{','.join(c for c in samples_text[step] if c)}]"
                for step in sorted(samples_text)
            )
            parts.append(f'"samples":{{{steps}}}')
        else:
            parts.append(f"{canonical_text(key)}:{canonical_text(top[key])}")
    data = ("{" + ",".join(parts) + "}").encode("utf-8")
    return sha256_bytes(data), data


def samples_sha256(rows: list[Any] | None) -> str | None:
    return None if rows is None else sha256_json(rows)


SUMMARY_FIELDS = "started_at finished_at command pair outcome reason previous derived_from recovered run_id".split()


def summary_of(r: Receipt, sha: str | None = None) -> dict[str, Any]:
    """The few fields `receipts list` and status need, without the samples."""
    return {"hash": sha or r.sha256, **{k: getattr(r, k) for k in SUMMARY_FIELDS}}


RESERVED_FIELDS = frozenset(Receipt.model_fields) | {"sha256", "chain"}
