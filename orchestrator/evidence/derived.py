"""A derived record's outcome is computed, never granted: it passes only when every required step
is reused from a passed step or run fresh and passed against the original's identities; else it
is `incomplete`, which nothing counts as a pass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.evidence.receipt import Receipt, StepRecord

# Identity fields that name *what* ran, compared between the original and the fresh steps.
_IDENTITY_KEYS = ("sha256", "build_info", "revision", "package")


@dataclass
class Coverage:
    required: list[str]
    reused: list[str]
    fresh: list[str]
    missing: list[str] = field(default_factory=list)
    failed_fresh: list[str] = field(default_factory=list)
    identity_mismatch: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.missing or self.failed_fresh or self.identity_mismatch)

    def why(self) -> str:
        parts = (
            ("not covered by a reused or fresh passed step", self.missing),
            ("fresh step(s) did not pass", self.failed_fresh),
            ("fresh steps not shown to run against the original's identities", self.identity_mismatch),
        )
        return "; ".join(f"{what}: {', '.join(names)}" for what, names in parts if names)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}


def required_steps(original: Receipt) -> list[str]:
    """What the original set out to do: its recorded plan (unreached steps too), the acceptance
    checks it set out to run, every step it ran not skipped by its own judgement, and the steps
    a derived original covered by reference."""
    names: list[str] = []
    extra = original.extra_fields()
    plan = extra.get("plan")
    if isinstance(plan, list):
        names += [p["name"] for p in plan if isinstance(p, dict) and isinstance(p.get("name"), str)]
    ran = {s.name: s for s in original.steps}
    checks = extra.get("acceptance_plan")
    if isinstance(checks, list):
        names += [n for n in checks if isinstance(n, str) and not _skipped_by_itself(ran.get(n))]
    names += [s.name for s in original.steps if not _skipped_by_itself(s)]
    names += list(original.reused_steps)
    return list(dict.fromkeys(names))


def _skipped_by_itself(step: StepRecord | None) -> bool:
    """A step that ran and decided it does not apply (no draft model: no speculative check)."""
    return step is not None and step.outcome == "skipped" and not (step.data or {}).get("not_run")


def _identity_leaves(data: Any, path: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    stack: list[tuple[Any, str]] = [(data, path)]
    while stack:
        obj, p = stack.pop()
        if isinstance(obj, dict):
            for k, v in obj.items():
                key = f"{p}.{k}" if p else str(k)
                if isinstance(v, (dict, list)):
                    stack.append((v, key))
                elif any(str(k).endswith(w) for w in _IDENTITY_KEYS):
                    out[key] = v
        elif isinstance(obj, list):
            stack.extend((v, f"{p}[{i}]") for i, v in enumerate(obj) if isinstance(v, (dict, list)))
    return out


def coverage(
    original: Receipt, reused: list[str], fresh: list[StepRecord], fresh_identities: list[tuple[str, dict[str, Any]]]
) -> Coverage:
    """Reused steps were already checked to have passed in the original (derive refuses others)."""
    required = required_steps(original)
    fresh_passed = {s.name for s in fresh if s.outcome == "passed"}
    cov = Coverage(required=required, reused=list(reused), fresh=[s.name for s in fresh])
    cov.missing = [n for n in required if n not in reused and n not in fresh_passed]
    cov.failed_fresh = [s.name for s in fresh if s.outcome in ("failed", "aborted")]
    if fresh_passed & set(required):
        latest = dict(fresh_identities)
        for host in dict.fromkeys(i.host for i in original.identities):
            want = _identity_leaves(original.identity_of(host))
            got = _identity_leaves(latest.get(host)) if host in latest else None
            if not want:
                continue
            if got is None:
                cov.identity_mismatch.append(f"{host} (no fresh identity recorded)")
                continue
            differ = sorted(k for k, v in want.items() if got.get(k) != v)
            if differ:
                cov.identity_mismatch.append(f"{host} ({', '.join(differ[:4])})")
    return cov


def derived_outcome(cov: Coverage, requested: str | None) -> str:
    """`requested` may lower the outcome (inconclusive, failed), never raise it to passed."""
    if cov.failed_fresh:
        return "failed"
    computed = "passed" if cov.complete else "incomplete"
    return computed if requested in (None, "passed") else requested
