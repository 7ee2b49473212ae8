"""Gate decisions: pure functions of an estimate, so their edges are tested exactly.

A gate answers pass / fail / inconclusive. Missing data is never a pass: a cell with fewer valid
pairs than the plan declared is inconclusive whatever its numbers say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orchestrator.qualify.stats import GainEstimate, above, at_least

Verdict = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class GateVerdict:
    kind: str
    family: str
    threshold: float
    verdict: Verdict
    reason: str
    gain: float | None = None
    low: float | None = None
    high: float | None = None
    valid_pairs: int = 0
    planned_pairs: int = 0


def decide_gain(est: GainEstimate, threshold: float) -> tuple[Verdict, str]:
    """Pass iff gain >= threshold and the interval's lower bound is above 0 (strictly)."""
    ok_gain = at_least(est.gain, threshold)
    ok_low = above(est.interval.low, 0.0)
    if ok_gain and ok_low:
        return "pass", f"gain {_pct(est.gain)} >= {_pct(threshold)} and lower bound {_pct(est.interval.low)} > 0"
    why = []
    if not ok_gain:
        why.append(f"gain {_pct(est.gain)} < {_pct(threshold)}")
    if not ok_low:
        why.append(f"lower bound {_pct(est.interval.low)} is not above 0")
    return "fail", "; ".join(why)


def decide_non_regression(est: GainEstimate, threshold: float) -> tuple[Verdict, str]:
    """Pass iff the interval's lower bound is >= threshold (e.g. -1%)."""
    if at_least(est.interval.low, threshold):
        return "pass", f"lower bound {_pct(est.interval.low)} >= {_pct(threshold)}"
    return "fail", f"lower bound {_pct(est.interval.low)} < {_pct(threshold)}"


def decide(
    kind: str, family: str, threshold: float, est: GainEstimate | None, *, valid_pairs: int, planned_pairs: int
) -> GateVerdict:
    if est is None or valid_pairs < planned_pairs:
        return GateVerdict(
            kind, family, threshold, "inconclusive",
            f"{valid_pairs} of {planned_pairs} planned pairs valid",
            gain=est.gain if est else None,
            low=est.interval.low if est else None,
            high=est.interval.high if est else None,
            valid_pairs=valid_pairs, planned_pairs=planned_pairs,
        )
    fn = {"gain": decide_gain, "non_regression": decide_non_regression}[kind]
    verdict, reason = fn(est, threshold)
    return GateVerdict(
        kind, family, threshold, verdict, reason,
        gain=est.gain, low=est.interval.low, high=est.interval.high,
        valid_pairs=valid_pairs, planned_pairs=planned_pairs,
    )


def overall(verdicts: list[GateVerdict]) -> Verdict:
    """Any failed gate fails; otherwise any inconclusive gate makes the whole inconclusive."""
    if not verdicts:
        return "inconclusive"
    if any(v.verdict == "fail" for v in verdicts):
        return "fail"
    if any(v.verdict == "inconclusive" for v in verdicts):
        return "inconclusive"
    return "pass"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"
