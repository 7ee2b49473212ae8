"""Drift and order, three pure checks: **trend**, the baseline arms' log TG regressed on their
position (a machine whose speed moves during the run; a candidate cannot cause it); **spread**, a
family's own sd far above the calibration's (the pairs were sized for another noise); and
**position**, the effect of being a pair's second arm (L = g + P or g - P), which cancels in the
mean gain when as many pairs ran each way: reported so a reader sees that it did."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestrator.qualify.stats import t_quantile


def trend(
    positions: Sequence[float], log_values: Sequence[float], *, confidence: float, max_trend: float
) -> dict[str, Any]:
    """OLS slope of log_values on positions; `change` = fitted log change from the first to the
    last position. Drift when the slope's interval excludes 0 and |change| > log(1 + max_trend)."""
    x, y = np.asarray(positions, dtype=float), np.asarray(log_values, dtype=float)
    out: dict[str, Any] = {"points": int(x.size), "max_trend": max_trend, "confidence": confidence}
    if x.size < 3 or float(np.ptp(x)) == 0.0:
        return {**out, "measurable": False, "drift": False, "why": f"{x.size} baseline arm(s) in distinct positions"}
    xc = x - x.mean()
    sxx = float((xc**2).sum())
    slope = float((xc * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * xc
    df = x.size - 2
    se = math.sqrt(float((resid**2).sum()) / df / sxx)
    half = t_quantile(1 - (1 - confidence) / 2, df) * se
    span = float(np.ptp(x))
    change = slope * span
    excludes = slope - half > 0 or slope + half < 0
    big = abs(change) > math.log1p(max_trend)
    return {
        **out,
        "measurable": True,
        "slope_per_position": slope,
        "slope_low": slope - half,
        "slope_high": slope + half,
        "change": math.expm1(change),  # fitted change of baseline TG over the run (0.1 = +10%)
        "change_low": math.expm1((slope - half) * span),
        "change_high": math.expm1((slope + half) * span),
        "excludes_zero": excludes,
        "drift": bool(excludes and big),
    }


def spread(own_sd: float | None, calibrated_upper: float | None, *, max_ratio: float) -> dict[str, Any]:
    """The run's own sd against the calibration's upper bound of the same sd."""
    if own_sd is None or calibrated_upper is None or calibrated_upper <= 0:
        return {"own_sd": own_sd, "calibrated_sd_upper": calibrated_upper, "ratio": None, "drift": False}
    ratio = own_sd / calibrated_upper
    return {
        "own_sd": own_sd,
        "calibrated_sd_upper": calibrated_upper,
        "ratio": ratio,
        "max_ratio": max_ratio,
        "drift": ratio > max_ratio,
    }


def position_effect(
    log_ratios: Sequence[float], candidate_second: Sequence[bool], *, confidence: float
) -> dict[str, Any]:
    """Position effect P (log speed of a pair's second arm over its first, net of the candidate)
    and what it does to the plain mean gain: bias = P (n_second - n_first) / n, 0 when balanced."""
    y = np.asarray(log_ratios, dtype=float)
    s = np.asarray(candidate_second, dtype=bool)
    n2, n1 = int(s.sum()), int((~s).sum())
    out: dict[str, Any] = {"candidate_second": n2, "candidate_first": n1, "balanced": n1 == n2}
    if n1 == 0 or n2 == 0:
        return {**out, "effect": None, "why": "every pair ran in the same order: the position effect is confounded"}
    m2, m1 = float(y[s].mean()), float(y[~s].mean())
    p = (m2 - m1) / 2
    df = y.size - 2
    res = {**out, "effect": math.expm1(p), "bias_in_mean": math.expm1(p * (n2 - n1) / y.size)}
    if df < 1:
        return {**res, "low": None, "high": None}
    pooled = (float(((y[s] - m2) ** 2).sum()) + float(((y[~s] - m1) ** 2).sum())) / df
    se = 0.5 * math.sqrt(pooled * (1 / n1 + 1 / n2))
    half = t_quantile(1 - (1 - confidence) / 2, df) * se
    return {**res, "low": math.expm1(p - half), "high": math.expm1(p + half)}
