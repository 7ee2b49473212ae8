"""Group-sequential qualification (opt-in): pre-planned looks that stop a run once it has failed.

A plan with `sequential: {looks: K, spending: ...}` is looked at after ceil(k N / K) of its N pairs
(k = 1..K), each look with the same Student-t interval (floored at the calibrated noise) as a fixed
run. A look before the last decides only a **fail whose whole interval is below the gate's
threshold** (a non-regression gate's floor, a gain gate's threshold): the run stops there, failed.
A **pass is decided only at the last look**, at the plan's own confidence, exactly as a fixed run
decides it; so no sequential run passes anything a fixed run of N pairs would not pass (false gain
passes and missed regressions are at most the fixed design's).

Why passes wait for the last look (issue 31, benchmarks/qualify_seq_sim.py): the first build also
let early looks pass, with alpha split over all looks; under a periodic load that comes and goes
every two pairs identical code passed the +5% gain gate in 16% of the decided gates (fixed run: 0%);
as we read it, 4 pairs of a counterbalanced order line up with the load in 1 of 6 shuffles (every
pair then says the same) and a calibration that saw little of the load floors too low. Pairs are
not independent under such load, and a look with few of them cannot be trusted to pass.

The early fails spend the one-sided alpha, (1 - confidence) / 2, over the K - 1 early looks:
equally (`bonferroni`), or by the Lan-DeMets O'Brien-Fleming-type function
alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)) at t = n_k / N rescaled to the early looks
(`obrien-fleming`: strict at the first look). By the union bound a candidate at or above a
threshold is failed early with probability at most alpha (i.i.d. pairs): the power a calibration
planned is lowered by at most that. Pure: plain numbers and GateVerdicts, no samples or hosts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from statistics import NormalDist
from typing import Any, Literal

from orchestrator.qualify.gates import GateVerdict

Spending = Literal["bonferroni", "obrien-fleming"]
MIN_LOOK_PAIRS = 3  # a look's Student-t interval at 2 pairs (t with 1 df) decides nothing useful


def look_pairs(pairs: int, looks: int) -> list[int]:
    """The pair counts at which the run is looked at: ceil(k * pairs / looks), k = 1..looks."""
    if looks < 1 or pairs < looks:
        raise ValueError(f"{looks} looks need at least {looks} pairs, got {pairs}")
    return [math.ceil(k * pairs / looks) for k in range(1, looks + 1)]


def spent(fraction: float, alpha: float, spending: Spending, look: int, looks: int) -> float:
    """Cumulative one-sided alpha spent by the look at information `fraction` (look of looks)."""
    if spending == "bonferroni":
        return alpha * look / looks
    if fraction >= 1:
        return alpha
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return 2 * (1 - NormalDist().cdf(z / math.sqrt(fraction)))


def look_confidences(pairs_at: Sequence[int], confidence: float, spending: Spending) -> list[float]:
    """Per look, the two-sided confidence of its interval: the early looks 1 - 2 alpha_k, where the
    alpha_k (from the spending function) sum to the one-sided alpha (1 - confidence) / 2; the last
    look the plan's confidence (it decides as a fixed run)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    alpha = (1 - confidence) / 2
    early = list(pairs_at[:-1])
    if not early:
        return [confidence]
    n, k = early[-1], len(early)
    cum = [spent(p / n, alpha, spending, i + 1, k) for i, p in enumerate(early)]
    cum[-1] = alpha  # exactly the whole alpha over the early looks
    shares = [cum[0], *(b - a for a, b in zip(cum, cum[1:], strict=False))]
    if any(s <= 0 for s in shares):
        raise ValueError(f"spending {spending} gives a look no alpha: {shares}")
    return [1 - 2 * s for s in shares] + [confidence]


def decided(v: GateVerdict) -> bool:
    """At a look before the last: only a fail with the whole interval below the threshold."""
    return v.verdict == "fail" and v.high is not None and v.high < v.threshold


def at_look(v: GateVerdict, look: int, looks: int, pairs: int) -> GateVerdict:
    """The gate as judged at `look` (1-based): the last look as a fixed run; earlier looks keep a
    decisive fail (saying which look decided) and leave everything else open (inconclusive)."""
    where = f"look {look} of {looks} ({pairs} pairs)"
    if look == looks:
        return replace(v, reason=f"{v.reason}; decided at the last {where}")
    if decided(v):
        return replace(v, reason=f"{v.reason}; decided at {where}: the whole interval is below the threshold")
    return replace(
        v, verdict="inconclusive", reason=f"not decided at {where} (passes wait for the last look): {v.reason}"
    )


def settled(verdicts: Sequence[GateVerdict]) -> bool:
    """Whether a look before the last ends the run: a gate failed decisively (the run fails
    whatever the others say)."""
    return any(decided(v) for v in verdicts)


def design(pairs: int, looks: int, spending: Spending, confidence: float) -> dict[str, Any]:
    """What a run records before its first sample (`qualify_rules.sequential`)."""
    at = look_pairs(pairs, looks)
    return {
        "looks": looks,
        "spending": spending,
        "pairs_at": at,
        "confidence_at": look_confidences(at, confidence, spending),
        "confidence": confidence,
    }
