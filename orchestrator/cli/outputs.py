"""The JSON documents `--json` prints, as pydantic models: `pairctl config schema output.COMMAND`.

Each model names the fields a script may rely on; documents may carry more (extra="allow"), so
a field added later never breaks a reader. On failure the document carries `error` (ErrorInfo):
a dict output gets the key, a list output is wrapped as {"result": [...], "error": {...}}.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from orchestrator.roles import Role


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorInfo(BaseModel):
    """Why the run failed: exit code (docs/reference/exit-codes.md), message, fix, and the receipt it wrote."""

    model_config = ConfigDict(extra="forbid")
    exit_code: int
    kind: str
    message: str
    hint: str | None
    receipt: str | None
    meaning: str


class Failed(_Open):
    """Any failed run's document: at least the error; `result` holds a list output. A deploy or
    rollback that failed after writing its receipt also carries, read back from that receipt,
    `outcome`, `reason`, `steps` (name, hosts, ok, outcome, seconds, error), `final_state` and
    `rollback` (what was restored)."""

    error: ErrorInfo
    result: list[Any] | None = None
    steps: list[dict[str, Any]] | None = None
    final_state: dict[str, Any] | None = None
    rollback: dict[str, Any] | None = None


class StepRow(_Open):
    name: str
    hosts: list[str]
    ok: bool
    seconds: float
    error: str | None


class RunOutput(_Open):
    """deploy, rollback, restart, start and stop (outcome: passed | dry-run | nothing to start)."""

    command: str
    pair: str
    outcome: str
    receipt: str | None
    plan: list[dict[str, Any]]
    steps: list[StepRow]
    uploads: dict[str, Any]
    timings: dict[str, float]
    active: dict[str, Any] | None
    wall_s: float
    error: ErrorInfo | None = None


class FleetPairRow(_Open):
    """One pair of a rollout: passed | skipped | rolled-back | rollback-failed | leased | refused |
    not-started | paused (before a run: the planned `deploy` / `rollback`, or skipped), its own receipt."""

    pair: str
    wave: int | None
    outcome: str
    packages: list[str] | None
    profile: str | None
    reason: str | None
    receipt: str | None
    exit_code: int
    error: str | None
    wall_s: float
    hooks: list[dict[str, Any]]


class FleetRunOutput(_Open):
    """deploy --rev REV (any number of pairs), rollback over several pairs: the plan (waves,
    skipped pairs and why, packages per pair), every pair's row, and the fleet receipt."""

    command: str
    fleet: bool
    dry_run: bool
    rev: str | None
    commit: str | None
    plan: dict[str, Any]
    pairs: list[FleetPairRow]
    outcome: str
    exit_code: int
    receipt: str | None
    hooks: list[dict[str, Any]]
    timings: dict[str, Any]  # status_s (the reads that decide skips), waves_s (one per wave run)
    wall_s: float
    error: ErrorInfo | None = None


class HostStatus(_Open):
    role: Role
    current: str | None
    previous: str | None
    releases: list[str]
    service: str
    running: bool | None  # None: the host did not answer (reachable false)
    pid: int | None
    matches_manifest: bool | None
    leases: list[dict[str, Any]]
    supervisor: dict[str, Any] | None = None  # hosts/supervisor.py SupervisorState.as_dict()
    boot: dict[str, Any] | None = None  # hosts/boot.py read_entry() + starts_at_boot (prepared hosts)
    reachable: bool = True  # false: nothing was read from this host (`error` says why; exit 4)
    error: str | None = None


class StatusOutput(_Open):
    """status --pair P (one pair). A read: no receipt."""

    pair: str
    hosts: dict[str, HostStatus]
    route: dict[str, Any] | None
    problems: list[str]
    warnings: list[str] = Field(default_factory=list)  # exit 0 all the same (e.g. no boot persistence)
    health: str | None = None
    unreachable: dict[str, str] = Field(default_factory=dict)  # host -> why (a partial view, exit 4)
    error: ErrorInfo | None = None


class FleetStatusOutput(_Open):
    """status --all, or several --pair."""

    pairs: list[dict[str, Any]]
    details: list[dict[str, Any]]
    error: ErrorInfo | None = None


class PackageRow(_Open):
    id: str
    revision: str
    target: str
    build_info: str
    content_digest: str
    path: str


class BuildRow(_Open):
    id: str
    status: str
    cached: bool
    duration_s: float
    path: str
    revision: str
    tree: str
    target: str
    content_digest: str
    receipt: str | None


class ReceiptRow(_Open):
    hash: str
    started_at: str
    finished_at: str | None
    command: str
    pair: str | None
    outcome: str
    reason: str | None
    previous: str | None
    derived_from: str | None


class AcceptOutput(_Open):
    """accept --pair P (one pair): the suite's summary and the receipt."""

    receipt: str | None
    error: ErrorInfo | None = None


class LeaseTakeOutput(_Open):
    nonce: str
    leases: list[dict[str, Any]]
    receipt: str | None


class DoctorFinding(_Open):
    check: str
    ok: bool
    detail: str
    fix: str


class ConfigCheckRow(_Open):
    file: str
    ok: bool
    error: str | None


class QualifyOutput(_Open):
    receipt: str
    report: str | None
    verdict: str
    gates: list[dict[str, Any]]
    error: ErrorInfo | None = None


class LogFile(_Open):
    host: str
    role: Role
    path: str
    lines: list[str]
    size: int | None  # None: no such file (the service never started there)
    error: str | None  # why nothing was read (the host unreachable: exit 4)
    truncated: bool


class LogsOutput(_Open):
    """logs --pair P (without --follow)."""

    pair: str
    logs: list[LogFile]
    error: ErrorInfo | None = None


class DiffHost(_Open):
    role: Role
    service: str
    running: bool
    current: str | None
    wanted_release: str
    running_argv: list[str]
    wanted_argv: list[str]
    diff: list[str]  # unified diff lines, one flag and its values a line
    same: bool


class DiffOutput(_Open):
    """diff --pair P: what runs against what the profile asks now (exit 1 when not `same`)."""

    pair: str
    profile: str
    same: bool
    hosts: dict[str, DiffHost]
    error: ErrorInfo | None = None


# command -> the type of its success document (a failure is `Failed` or the same with `error`).
OUTPUTS: dict[str, Any] = {
    "error": Failed,
    "deploy": RunOutput,
    "rollback": RunOutput,
    "restart": RunOutput,
    "start": RunOutput,
    "stop": RunOutput,
    "logs": LogsOutput,
    "diff": DiffOutput,
    "deploy-fleet": FleetRunOutput,
    "rollback-fleet": FleetRunOutput,
    "status": StatusOutput,
    "status-fleet": FleetStatusOutput,
    "build": list[BuildRow],
    "packages-list": list[PackageRow],
    "receipts-list": list[ReceiptRow],
    "accept": AcceptOutput,
    "lease-take": LeaseTakeOutput,
    "doctor": list[DoctorFinding],
    "config-check": list[ConfigCheckRow],
    "qualify": QualifyOutput,
}


def output_schema(name: str) -> dict[str, Any]:
    return TypeAdapter(OUTPUTS[name]).json_schema()


def validate_output(name: str, document: Any) -> Any:
    """Check a printed document against its model (the tests do, for real runs)."""
    return TypeAdapter(OUTPUTS[name]).validate_python(document)
