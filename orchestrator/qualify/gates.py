"""Gate decisions: pure functions of an estimate, so their edges are tested exactly. Missing data
is never a pass (fewer valid pairs than planned: inconclusive). The Student-t interval decides;
the bootstrap's bounds are carried beside it, never deciding."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from orchestrator.qualify.stats import DECIDING_METHOD, GainEstimate, Interval, above, at_least

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
    method: str = DECIDING_METHOD
    bootstrap_low: float | None = None
    bootstrap_high: float | None = None
    # which sd made the deciding interval: "own", "calibrated" or "own (no calibration)"
    spread: str | None = None
    sd_own: float | None = None
    sd_calibrated: float | None = None
    drift: str | None = None  # set when drift overrode (or left) this verdict: why


def spread_text(iv: Interval) -> str:
    """One phrase naming the sd that decided, with both figures."""
    own = f"own sd {100 * (iv.sd_own or 0.0):.2f}%"
    if iv.sd_floor is None:
        return f"{own} (no calibrated floor)"
    cal = f"calibrated sd {100 * iv.sd_floor:.2f}%"
    return f"{cal} decided ({own})" if iv.spread == "calibrated" else f"{own} decided ({cal})"


def decide_gain(est: GainEstimate, threshold: float) -> tuple[Verdict, str]:
    """Pass iff gain >= threshold and the deciding interval's lower bound is above 0 (strictly)."""
    iv = _deciding(est)
    ok_gain = at_least(est.gain, threshold)
    ok_low = above(iv.low, 0.0)
    if ok_gain and ok_low:
        return "pass", f"gain {_pct(est.gain)} >= {_pct(threshold)} and {iv.method} lower bound {_pct(iv.low)} > 0"
    why = []
    if not ok_gain:
        why.append(f"gain {_pct(est.gain)} < {_pct(threshold)}")
    if not ok_low:
        why.append(f"{iv.method} lower bound {_pct(iv.low)} is not above 0")
    return "fail", "; ".join(why)


def decide_non_regression(est: GainEstimate, threshold: float) -> tuple[Verdict, str]:
    """Pass iff the deciding interval's lower bound is >= threshold (e.g. -1%)."""
    iv = _deciding(est)
    if at_least(iv.low, threshold):
        return "pass", f"{iv.method} lower bound {_pct(iv.low)} >= {_pct(threshold)}"
    return "fail", f"{iv.method} lower bound {_pct(iv.low)} < {_pct(threshold)}"


def _deciding(est: GainEstimate) -> Interval:
    if est.interval is None:
        raise ValueError("no deciding interval (fewer than 2 pairs); decide() reports this as inconclusive")
    return est.interval


def decide(
    kind: str, family: str, threshold: float, est: GainEstimate | None, *, valid_pairs: int, planned_pairs: int
) -> GateVerdict:
    iv = est.interval if est else None
    boot = est.bootstrap if est else None

    def verdict(v: Verdict, reason: str) -> GateVerdict:
        if iv is not None and iv.spread is not None and v != "inconclusive":
            reason = f"{reason}; {spread_text(iv)}"
        return GateVerdict(
            kind,
            family,
            threshold,
            v,
            reason,
            gain=est.gain if est else None,
            low=iv.low if iv else None,
            high=iv.high if iv else None,
            valid_pairs=valid_pairs,
            planned_pairs=planned_pairs,
            bootstrap_low=boot.low if boot else None,
            bootstrap_high=boot.high if boot else None,
            spread=None if iv is None else (iv.spread if iv.sd_floor is not None else "own (no calibration)"),
            sd_own=iv.sd_own if iv else None,
            sd_calibrated=iv.sd_floor if iv else None,
        )

    if est is None or iv is None or valid_pairs < planned_pairs:
        why = f"{valid_pairs} of {planned_pairs} planned pairs valid"
        if est is not None and iv is None:
            why += " (a Student-t interval needs at least 2)"
        return verdict("inconclusive", why)
    fn = {"gain": decide_gain, "non_regression": decide_non_regression}[kind]
    return verdict(*fn(est, threshold))


def under_drift(v: GateVerdict, why: str) -> GateVerdict:
    """A drifted run is not the run the plan was sized for: a pass becomes inconclusive, and so
    does a fail unless its whole interval is on the failing side (no drift makes that qualify)."""
    if v.verdict == "inconclusive":
        return replace(v, drift=why)
    decisive = (
        v.verdict == "fail"
        and v.high is not None
        and ((v.kind == "non_regression" and v.high < v.threshold) or (v.kind == "gain" and v.high < 0))
    )
    if decisive:
        return replace(v, drift=f"{why}; kept: the whole interval is on the failing side")
    reason = f"drift: {why} (the numbers said {v.verdict}: {v.reason})"
    return replace(v, verdict="inconclusive", reason=reason, drift=why)


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
