"""Group-sequential qualification (opt-in): pre-planned looks that may stop a run once decided.

A plan with `sequential: {looks: K, spending: ...}` is looked at after ceil(k N / K) of its N
pairs (k = 1..K). Each look decides with the same Student-t interval (floored at the calibrated
noise) as a fixed run, but at its own, wider confidence: the one-sided error the plan allows,
alpha = (1 - confidence) / 2, is split over the looks by a spending function, and look k's
interval has one-sided tails of alpha_k with sum(alpha_k) = alpha. By the union bound the chance
that ANY look passes a gain gate on identical code (or passes a non-regression gate for a
candidate below the floor) is then at most alpha, whatever the correlation between looks: the
design is conservative, never optimistic. (Exact group-sequential boundaries use that
correlation and are less conservative; they are not built.)

- `bonferroni`: alpha / K at every look (the Pocock-like flat split);
- `obrien-fleming`: the Lan-DeMets O'Brien-Fleming-type spending function
  alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)) at the information fraction t = n_k / N: almost
  nothing early, most of alpha at the last look (little power lost when the run goes the distance).

At a look before the last a gate is *decided* only when its answer cannot be changed by more
pairs at this look's level: a pass, or a fail whose whole interval is below the threshold (the
candidate is confidently short of the gate). Anything else continues. The run stops at the first
look where every gate is decided or one has failed that way (the verdict is settled); the last
look decides as a fixed run does. Pure: plain numbers and GateVerdicts, no samples or hosts.
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
    """Per look, the two-sided confidence of its interval: 1 - 2 alpha_k, where alpha_k is the
    one-sided alpha the spending function gives that look (the alpha_k sum to (1 - confidence) / 2)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    alpha = (1 - confidence) / 2
    n, k = pairs_at[-1], len(pairs_at)
    cum = [spent(p / n, alpha, spending, i + 1, k) for i, p in enumerate(pairs_at)]
    cum[-1] = alpha  # exactly the whole alpha at the last look
    shares = [cum[0], *(b - a for a, b in zip(cum, cum[1:], strict=False))]
    if any(s <= 0 for s in shares):
        raise ValueError(f"spending {spending} gives a look no alpha: {shares}")
    return [1 - 2 * s for s in shares]


def decided(v: GateVerdict) -> bool:
    """At a look before the last: a pass, or a fail with the whole interval below the threshold."""
    if v.verdict == "pass":
        return True
    return v.verdict == "fail" and v.high is not None and v.high < v.threshold


def at_look(v: GateVerdict, look: int, looks: int, pairs: int) -> GateVerdict:
    """The gate as judged at `look` (1-based): the last look as a fixed run; earlier looks keep a
    decided verdict (saying which look decided) and leave everything else open (inconclusive)."""
    where = f"look {look} of {looks} ({pairs} pairs)"
    if look == looks:
        return replace(v, reason=f"{v.reason}; decided at the last {where}")
    if decided(v):
        return replace(v, reason=f"{v.reason}; decided at {where}")
    return replace(v, verdict="inconclusive", reason=f"not decided at {where}: {v.reason}")


def settled(verdicts: Sequence[GateVerdict]) -> bool:
    """Whether a look ends the run: every gate decided, or one failed decisively (the run fails
    whatever the others say)."""
    return bool(verdicts) and (
        all(decided(v) for v in verdicts) or any(v.verdict == "fail" and decided(v) for v in verdicts)
    )


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
