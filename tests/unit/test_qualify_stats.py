"""Paired bootstrap statistics and gate decisions: known answers, exact enumeration, edges."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from orchestrator.qualify import stats
from orchestrator.qualify.gates import GateVerdict, decide, decide_gain, decide_non_regression, overall


def test_geomean_and_gain_known_answer():
    assert stats.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert stats.geometric_gain([1.1, 1.1, 1.1]) == pytest.approx(0.1)
    # ratios 2 and 0.5 cancel exactly: geometric, not arithmetic (arithmetic would say +25%)
    assert stats.geometric_gain([2.0, 0.5]) == pytest.approx(0.0, abs=1e-15)


def test_ratios_are_candidate_over_baseline_and_reject_bad_values():
    assert stats.ratios([60.0, 66.0], [50.0, 60.0]).tolist() == pytest.approx([1.2, 1.1])
    with pytest.raises(ValueError, match="equal lengths"):
        stats.ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive and finite"):
        stats.ratios([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="positive and finite"):
        stats.geomean([1.0, float("nan")])


def test_exact_enumeration_two_pairs_known_answer():
    """n=2, log ratios 0 and 0.2: the 4 resamples have mean logs 0, .1, .1, .2."""
    r = [1.0, math.exp(0.2)]
    dist, method = stats.bootstrap_distribution(r)
    assert method == "exact"
    assert sorted(dist.tolist()) == pytest.approx([0.0, math.exp(0.1) - 1, math.exp(0.1) - 1, math.exp(0.2) - 1])
    iv = stats.bootstrap_interval(r)
    v = sorted(dist.tolist())
    # numpy linear percentile over 4 sorted points: position q*(n-1)
    assert iv.low == pytest.approx(v[0] + 0.075 * (v[1] - v[0]))
    assert iv.high == pytest.approx(v[2] + 0.925 * (v[3] - v[2]))
    assert (iv.method, iv.resamples, iv.seed) == ("exact", 4, None)


def test_exact_enumeration_five_pairs_is_3125_and_matches_brute_force():
    r = [1.031, 1.045, 1.018, 1.052, 1.027]
    dist, method = stats.bootstrap_distribution(r)
    assert method == "exact" and dist.size == 3125 == 5**5
    brute = sorted(math.exp(sum(math.log(r[i]) for i in idx) / 5) - 1 for idx in itertools.product(range(5), repeat=5))
    assert sorted(dist.tolist()) == pytest.approx(brute, abs=1e-14)
    iv = stats.bootstrap_interval(r)
    assert iv.low == pytest.approx(float(np.percentile(brute, 2.5)))
    assert iv.high == pytest.approx(float(np.percentile(brute, 97.5)))
    # deterministic: identical on every call
    assert stats.bootstrap_interval(r) == iv


def test_exact_limit_boundary_and_seeded_fallback():
    six = [1.01, 1.02, 1.03, 1.04, 1.05, 1.06]
    assert stats.bootstrap_interval(six).method == "exact"  # 6**6 = 46656 <= 100000
    assert stats.bootstrap_interval(six, exact_limit=46655).method == "seeded"
    seven = [1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07]  # 7**7 = 823543 > 100000
    a = stats.bootstrap_interval(seven, seed=3)
    assert (a.method, a.resamples, a.seed) == ("seeded", stats.DEFAULT_RESAMPLES, 3)
    assert stats.bootstrap_interval(seven, seed=3) == a  # same seed, same interval
    assert stats.bootstrap_interval(seven, seed=4) != a


@pytest.mark.parametrize("n", [5, 8])
def test_matches_scipy_bootstrap_percentile_paired(n):
    rng = np.random.default_rng(n)
    base = rng.uniform(55, 60, n)
    cand = base * rng.normal(1.03, 0.01, n)
    ours = stats.bootstrap_interval(stats.ratios(cand, base), resamples=200_000, seed=1)
    res = scipy.stats.bootstrap(
        (cand, base),
        lambda c, b, axis=-1: np.exp(np.mean(np.log(c / b), axis=axis)) - 1,
        paired=True,
        vectorized=True,
        method="percentile",
        confidence_level=0.95,
        n_resamples=200_000,
        rng=7,
    )
    assert ours.low == pytest.approx(res.confidence_interval.low, abs=5e-4)
    assert ours.high == pytest.approx(res.confidence_interval.high, abs=5e-4)


def test_combined_is_per_pair_geomean_over_families():
    code, prose = [1.1, 1.2], [1.0, 1.2]
    combined = stats.combine_families([code, prose])
    assert combined.tolist() == pytest.approx([math.sqrt(1.1), 1.2])


def test_acceptance_rate():
    assert stats.acceptance_rate([3, 3, None], [3, 1, None]) == pytest.approx(4 / 6)
    assert stats.acceptance_rate([None, 0], [None, 0]) is None


# ---- gate edges ----------------------------------------------------------------------------


def est(rs):
    return stats.estimate_gain(rs)


def test_gain_exactly_at_threshold_passes():
    e = est([1.05] * 5)  # exp/log noise gives 0.05000000000000004 or 0.04999999999999993
    assert e.gain == pytest.approx(0.05)
    assert decide_gain(e, 0.05)[0] == "pass"


def test_gain_just_below_threshold_fails():
    v, why = decide_gain(est([1.0499] * 5), 0.05)
    assert v == "fail" and "< 5.00%" in why


def test_lower_bound_exactly_zero_fails_gain_but_passes_non_regression_at_zero():
    e = est([1.0] * 5)
    assert e.interval.low == 0.0
    v, why = decide_gain(e, 0.0)
    assert v == "fail" and "not above 0" in why
    assert decide_non_regression(e, 0.0)[0] == "pass"


def test_gain_with_interval_crossing_zero_fails_even_with_big_point_gain():
    e = est([0.85, 0.9, 1.3, 1.3, 1.3])
    assert e.gain == pytest.approx(0.1094, abs=1e-4)
    assert e.bootstrap.low == pytest.approx(-0.0640, abs=1e-4)  # the field report's interval
    assert e.interval.low == pytest.approx(-0.1537, abs=1e-4)  # the deciding Student-t one is wider
    v, why = decide_gain(e, 0.05)
    assert v == "fail" and why == "student-t lower bound -15.37% is not above 0"


def test_non_regression_edges():
    assert decide_non_regression(est([0.99] * 5), -0.01)[0] == "pass"  # lower bound exactly -1%
    assert decide_non_regression(est([0.9899] * 5), -0.01)[0] == "fail"


def test_missing_pairs_make_a_gate_inconclusive_never_pass():
    e = est([1.2] * 4)
    g = decide("gain", "code", 0.05, e, valid_pairs=4, planned_pairs=5)
    assert g.verdict == "inconclusive" and "4 of 5" in g.reason
    assert decide("gain", "code", 0.05, None, valid_pairs=0, planned_pairs=5).verdict == "inconclusive"
    assert decide("gain", "code", 0.05, est([1.2] * 5), valid_pairs=5, planned_pairs=5).verdict == "pass"


def _gv(v):
    return GateVerdict("gain", "x", 0.05, v, "")


def test_overall_verdict():
    assert overall([_gv("pass"), _gv("pass")]) == "pass"
    assert overall([_gv("pass"), _gv("inconclusive")]) == "inconclusive"
    assert overall([_gv("inconclusive"), _gv("fail")]) == "fail"
    assert overall([]) == "inconclusive"
