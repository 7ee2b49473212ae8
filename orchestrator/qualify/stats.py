"""Paired statistics for qualification (pure numpy on plain floats), over per-pair log ratios:
the unit of evidence is a pair of arms measured back to back, never a request.

The **Student-t interval** decides: its coverage is honest at 3 to 5 pairs for about-normal log
ratios. The **percentile bootstrap** (exact over all n**n resamples when few, else seeded) is
shown for comparison only: at small n it treats the pairs as the population and is far too narrow.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

EXACT_LIMIT = 100_000  # enumerate all n**n resamples up to this many (n <= 6)
DEFAULT_RESAMPLES = 20_000
DEFAULT_SEED = 0
# Two numbers closer than this are equal when a gate compares them (float noise from exp/log:
# ratios of exactly 1.05 give a gain of 0.05000000000000004, which must not change a verdict).
TIE_TOLERANCE = 1e-9


DECIDING_METHOD = "student-t"


@dataclass(frozen=True)
class Interval:
    """An interval of the paired geometric gain (fractions, 0.05 = 5%)."""

    low: float
    high: float
    confidence: float
    method: Literal["exact", "seeded", "student-t"]
    resamples: int = 0
    seed: int | None = None
    df: int | None = None  # student-t: degrees of freedom (pairs - 1)
    sd_log: float | None = None  # student-t: the sd that made the interval (the larger of the two below)
    sd_own: float | None = None  # student-t: the run's own sample sd of the per-pair log ratios
    sd_floor: float | None = None  # student-t: the calibrated floor (None: no calibration)
    spread: Literal["own", "calibrated"] | None = None  # student-t: which sd decided


@dataclass(frozen=True)
class GainEstimate:
    """Paired geometric gain, the deciding Student-t interval (None below 2 pairs) and the
    bootstrap beside it; `ratios`: per pair, candidate over baseline."""

    gain: float
    interval: Interval | None
    ratios: tuple[float, ...]
    bootstrap: Interval | None = None

    @property
    def n(self) -> int:
        return len(self.ratios)


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive finite numbers (the only kind a ratio of speeds can be)."""
    arr = _positive(values, "geomean")
    return float(np.exp(np.log(arr).mean()))


def ratios(candidate: Sequence[float], baseline: Sequence[float]) -> NDArray[np.float64]:
    """Per-pair ratios candidate/baseline; both sequences are indexed by pair."""
    c, b = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if c.shape != b.shape:
        raise ValueError(f"paired ratios need equal lengths, got {c.size} candidate and {b.size} baseline")
    _positive(c, "candidate"), _positive(b, "baseline")
    return c / b


def geometric_gain(pair_ratios: Sequence[float]) -> float:
    """Geometric mean of the paired ratios minus 1 (0.05 = candidate 5% faster)."""
    return geomean(pair_ratios) - 1.0


def combine_families(per_family: Sequence[Sequence[float]]) -> NDArray[np.float64]:
    """Per pair p, the geometric mean over families f of `per_family[f][p]`: a pair stays one unit
    of evidence however many families it holds."""
    arr = np.asarray(per_family, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError("combine_families needs a non-empty families x pairs table")
    _positive(arr.ravel(), "family ratios")
    return np.asarray(np.exp(np.log(arr).mean(axis=0)), dtype=np.float64)  # numpy types mean() as Any


def bootstrap_distribution(
    pair_ratios: Sequence[float],
    *,
    exact_limit: int = EXACT_LIMIT,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[np.ndarray, Literal["exact", "seeded"]]:
    """Geometric gains of every bootstrap resample: all n**n ordered resamples when at most
    `exact_limit`, else `resamples` draws seeded with `seed`."""
    logs = np.log(_positive(pair_ratios, "ratios"))
    n = logs.size
    if n**n <= exact_limit:
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
    seed_used = None if method == "exact" else seed
    return Interval(float(low), float(high), confidence, method, resamples=int(dist.size), seed=seed_used)


@lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The p quantile of Student's t with `df` degrees of freedom (numpy has none, scipy is a
    test dependency only): bisection on the CDF, which is the regularized incomplete beta."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def t_cdf(t: float, df: int) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2, 0.5, x)
    return 1 - tail if t >= 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) by its continued fraction (modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * f / a


def t_interval(
    pair_ratios: Sequence[float], *, confidence: float = 0.95, floor_sd: float | None = None
) -> Interval | None:
    """exp(mean +- t(n-1) * sd / sqrt(n)) - 1 of the per-pair log ratios; None below two pairs.
    With `floor_sd` (the calibration's upper bound) the sd is the larger of the two: a run's own
    sd is blind to noise correlated across its pairs (a load coming and going over minutes)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if floor_sd is not None and not (math.isfinite(floor_sd) and floor_sd >= 0):
        raise ValueError(f"floor_sd must be a finite sd >= 0, got {floor_sd}")
    logs = np.log(_positive(pair_ratios, "ratios"))
    n = logs.size
    if n < 2:
        return None
    mean, own = float(logs.mean()), float(logs.std(ddof=1))
    calibrated = floor_sd is not None and floor_sd > own
    sd = floor_sd if calibrated and floor_sd is not None else own
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    low, high = math.expm1(mean - half), math.expm1(mean + half)
    spread: Literal["own", "calibrated"] = "calibrated" if calibrated else "own"
    return Interval(
        low, high, confidence, "student-t", df=n - 1, sd_log=sd, sd_own=own, sd_floor=floor_sd, spread=spread
    )


def estimate_gain(
    pair_ratios: Sequence[float],
    *,
    confidence: float = 0.95,
    exact_limit: int = EXACT_LIMIT,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    floor_sd: float | None = None,
) -> GainEstimate:
    r = tuple(float(x) for x in _positive(pair_ratios, "ratios"))
    boot = bootstrap_interval(r, confidence=confidence, exact_limit=exact_limit, resamples=resamples, seed=seed)
    return GainEstimate(geometric_gain(r), t_interval(r, confidence=confidence, floor_sd=floor_sd), r, boot)


def robust_centre(values: Sequence[float]) -> tuple[float, float | None]:
    """An arm's value from its repeats: the median, and as dispersion the sd of the logs (None for
    one value). The sd, not a MAD: with 3 repeats a MAD ignores the one wild request."""
    arr = _positive(values, "repeats")
    med = float(np.median(arr))
    if arr.size < 2:
        return med, None
    return med, float(np.log(arr).std(ddof=1))


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
