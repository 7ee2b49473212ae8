"""Group-sequential qualification (opt-in, pure): pre-planned looks that stop a run once it failed.

The run is looked at after ceil(k N / K) of its N pairs, each look with a fixed run's interval. A
look before the last decides only a **fail whose whole interval is below the threshold**; a
**pass is decided only at the last look**, as a fixed run decides it. Early passes were tried:
under a periodic load a few counterbalanced pairs can line up with it, and identical code passed
a +5% gate in 16% of decided gates (benchmarks/qualify_seq_sim.py).

The early fails spend the one-sided alpha over the K - 1 early looks: equally (`bonferroni`) or
by the Lan-DeMets O'Brien-Fleming-type function (`obrien-fleming`: strict at first); by the union
bound a good candidate is failed early with probability at most alpha.
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
    """Per look, its interval's two-sided confidence: 1 - 2 alpha_k early, the alpha_k summing to
    the one-sided alpha; the plan's confidence at the last look."""
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
    reason = f"not decided at {where} (passes wait for the last look): {v.reason}"
    return replace(v, verdict="inconclusive", reason=reason)


def settled(verdicts: Sequence[GateVerdict]) -> bool:
    """Whether a look before the last ends the run: a gate failed decisively."""
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
