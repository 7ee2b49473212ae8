"""Noise and power: how many pairs a gate needs before its verdict means anything.

An A/A run's per-pair log ratios are pure noise; their sd `sigma` is the noise floor. A gate's
pass probability at a true gain is simulated with the deciding rule itself (mean normal, variance
a scaled chi-square, fixed seed, common draws across n). A gate is *resolvable* at n pairs when it
passes with the declared power at its `power_at`; a gain gate's false pass at no gain is bounded
by the interval itself (alpha / 2 one-sided), whatever n."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

from orchestrator.qualify.stats import t_quantile

GateKind = Literal["gain", "non_regression"]
POWER_DRAWS = 40_000
POWER_SEED = 22
MAX_PAIRS = 1000


@dataclass(frozen=True)
class Noise:
    """Noise of the per-pair log TG ratio from `pairs` A/A pairs. Pairs are planned on sigma_upper,
    the chi-square upper bound of the sd: a lucky quiet calibration would leave a plan underpowered."""

    sigma: float
    sigma_upper: float
    pairs: int
    upper_confidence: float
    mean_log: float  # the A/A mean log ratio (should be about 0: a bias between arm positions)


def estimate_noise(log_ratios: Sequence[float], *, upper_confidence: float = 0.8) -> Noise:
    x = np.asarray(log_ratios, dtype=float)
    if x.size < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"noise needs at least 2 finite A/A log ratios, got {x.tolist()}")
    df = x.size - 1
    sd = float(x.std(ddof=1))
    upper = sd * math.sqrt(df / chi2_quantile(1 - upper_confidence, df))
    return Noise(
        sigma=sd, sigma_upper=upper, pairs=int(x.size), upper_confidence=upper_confidence, mean_log=float(x.mean())
    )


def chi2_quantile(p: float, df: int) -> float:
    """Wilson-Hilferty: chi2_p(k) ~ k (1 - 2/(9k) + z_p sqrt(2/(9k)))^3, within about 1% for
    k >= 2 at the quantiles used here (checked against scipy in the unit tests)."""
    z = NormalDist().inv_cdf(p)
    c = 2 / (9 * df)
    return max(df * (1 - c + z * math.sqrt(c)) ** 3, 1e-12)


def pass_probability(
    kind: GateKind,
    threshold: float,
    true_gain: float,
    sigma: float,
    n: int,
    *,
    confidence: float = 0.95,
    draws: int = POWER_DRAWS,
    seed: int = POWER_SEED,
    floor: float | None = None,
) -> float:
    """P(the gate passes) for n pairs whose log ratios are N(log(1 + true_gain), sigma^2), decided
    with the interval's sd floored at `floor` (the calibrated noise, as `stats.t_interval`)."""
    return float(_passes(kind, threshold, true_gain, sigma, n, confidence, _draws(n, draws, seed), floor).mean())


def required_pairs(
    kind: GateKind,
    threshold: float,
    power_at: float,
    sigma: float,
    power: float,
    *,
    confidence: float = 0.95,
    max_pairs: int = MAX_PAIRS,
    floor: float | None = None,
) -> int | None:
    """The fewest pairs (>= 2) at which the gate passes with probability >= `power` at gain
    `power_at` (with the interval's sd `floor`, as the rule that runs); None beyond `max_pairs`."""

    def ok(n: int) -> bool:
        return pass_probability(kind, threshold, power_at, sigma, n, confidence=confidence, floor=floor) >= power

    if ok(2):
        return 2
    lo, hi = 2, 4
    while not ok(hi):
        if hi >= max_pairs:
            return None
        lo, hi = hi, min(2 * hi, max_pairs)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def resolution(sigma: float, n: int, confidence: float = 0.95) -> float:
    """The expected half-width (log ratio) of the deciding interval at n pairs: t(n-1) sigma / sqrt(n)."""
    return t_quantile(1 - (1 - confidence) / 2, n - 1) * sigma / math.sqrt(n)


def _draws(n: int, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, n])
    return rng.standard_normal(draws), rng.chisquare(n - 1, draws)


def _passes(
    kind: GateKind,
    threshold: float,
    true_gain: float,
    sigma: float,
    n: int,
    confidence: float,
    draws: tuple[np.ndarray, np.ndarray],
    floor: float | None = None,
) -> np.ndarray:
    if n < 2:
        return np.zeros(draws[0].size, dtype=bool)
    z, chi2 = draws
    mean = math.log1p(true_gain) + sigma / math.sqrt(n) * z
    sd = sigma * np.sqrt(chi2 / (n - 1))
    if floor is not None:
        sd = np.maximum(sd, floor)
    low = mean - t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    line = math.log1p(threshold)
    if kind == "gain":
        return (mean >= line) & (low > 0)
    return low >= line
