"""Paired statistics for qualification: geometric gain and a bootstrap interval over pairs.

The unit of evidence is a *pair* (one baseline arm and one candidate arm measured back to back),
so everything is resampled by pair, never by request. With few pairs every one of the n**n
resamples is enumerated, which makes the interval exact and identical on every run (the field
report's five pairs give 3125); more pairs fall back to a seeded resample.

Everything here is pure numpy on plain floats: no samples, plans or receipts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

import numpy as np

EXACT_LIMIT = 100_000  # enumerate all n**n resamples up to this many (n <= 6)
DEFAULT_RESAMPLES = 20_000
DEFAULT_SEED = 0
# Two numbers closer than this are equal when a gate compares them (float noise from exp/log:
# ratios of exactly 1.05 give a gain of 0.05000000000000004, which must not change a verdict).
TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval of the paired geometric gain (fractions, 0.05 = 5%)."""

    low: float
    high: float
    confidence: float
    method: Literal["exact", "seeded"]
    resamples: int
    seed: int | None = None


@dataclass(frozen=True)
class GainEstimate:
    """Paired geometric gain with its interval; `ratios` are per pair, candidate over baseline."""

    gain: float
    interval: Interval
    ratios: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.ratios)


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive finite numbers (the only kind a ratio of speeds can be)."""
    arr = _positive(values, "geomean")
    return float(np.exp(np.log(arr).mean()))


def ratios(candidate: Sequence[float], baseline: Sequence[float]) -> np.ndarray:
    """Per-pair ratios candidate/baseline; both sequences are indexed by pair."""
    c, b = np.asarray(candidate, dtype=float), np.asarray(baseline, dtype=float)
    if c.shape != b.shape:
        raise ValueError(f"paired ratios need equal lengths, got {c.size} candidate and {b.size} baseline")
    _positive(c, "candidate"), _positive(b, "baseline")
    return c / b


def geometric_gain(pair_ratios: Sequence[float]) -> float:
    """Geometric mean of the paired ratios minus 1 (0.05 = candidate 5% faster)."""
    return geomean(pair_ratios) - 1.0


def combine_families(per_family: Sequence[Sequence[float]]) -> np.ndarray:
    """Per pair, the geometric mean of that pair's ratios over families.

    `per_family[f][p]` is family f's ratio in pair p. The combined result bootstraps these
    per-pair values, so a pair stays one unit of evidence however many families it holds.
    """
    arr = np.asarray(per_family, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError("combine_families needs a non-empty families x pairs table")
    _positive(arr.ravel(), "family ratios")
    return np.exp(np.log(arr).mean(axis=0))


def bootstrap_distribution(
    pair_ratios: Sequence[float],
    *,
    exact_limit: int = EXACT_LIMIT,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[np.ndarray, Literal["exact", "seeded"]]:
    """Geometric gains of every bootstrap resample of the pairs.

    n**n <= exact_limit: all ordered resamples (index tuples), each once, so the percentile
    interval is that of the exact bootstrap distribution. Otherwise `resamples` draws from
    numpy's PCG64 seeded with `seed`.
    """
    logs = np.log(_positive(pair_ratios, "ratios"))
    n = logs.size
    if n ** n <= exact_limit:
        idx = np.array(list(itertools.product(range(n), repeat=n)), dtype=np.intp)
        method: Literal["exact", "seeded"] = "exact"
    else:
        idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
        method = "seeded"
    return np.exp(logs[idx].mean(axis=1)) - 1.0, method


def bootstrap_interval(
    pair_ratios: Sequence[float],
    *,
    confidence: float = 0.95,
    exact_limit: int = EXACT_LIMIT,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Percentile interval (numpy's linear percentile, as scipy's `method='percentile'`)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    dist, method = bootstrap_distribution(pair_ratios, exact_limit=exact_limit, resamples=resamples, seed=seed)
    alpha = (1 - confidence) / 2
    low, high = np.percentile(dist, [100 * alpha, 100 * (1 - alpha)])
    return Interval(
        low=float(low),
        high=float(high),
        confidence=confidence,
        method=method,
        resamples=int(dist.size),
        seed=None if method == "exact" else seed,
    )


def estimate_gain(
    pair_ratios: Sequence[float],
    *,
    confidence: float = 0.95,
    exact_limit: int = EXACT_LIMIT,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> GainEstimate:
    r = tuple(float(x) for x in _positive(pair_ratios, "ratios"))
    return GainEstimate(
        gain=geometric_gain(r),
        interval=bootstrap_interval(r, confidence=confidence, exact_limit=exact_limit, resamples=resamples, seed=seed),
        ratios=r,
    )


def at_least(value: float, threshold: float) -> bool:
    """value >= threshold, with ties inside TIE_TOLERANCE counting as equal (so: True)."""
    return value >= threshold or math.isclose(value, threshold, rel_tol=0.0, abs_tol=TIE_TOLERANCE)


def above(value: float, threshold: float) -> bool:
    """value > threshold strictly; a tie inside TIE_TOLERANCE is not above."""
    return value > threshold and not math.isclose(value, threshold, rel_tol=0.0, abs_tol=TIE_TOLERANCE)


def acceptance_rate(draft_n: Iterable[int | None], accepted: Iterable[int | None]) -> float | None:
    """Accepted draft tokens over drafted tokens, summed over requests; None when nothing was drafted."""
    d = sum(x or 0 for x in draft_n)
    a = sum(x or 0 for x in accepted)
    return None if d == 0 else a / d


def _positive(values: Iterable[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    if arr.size == 0:
        raise ValueError(f"{what}: no values")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{what}: every value must be positive and finite, got {arr.tolist()}")
    return arr
