"""Proof by simulation (issue 22): the deciding rule's error rates under log-normal noise.

Per pair, the log TG ratio is N(log(1 + true gain), sigma^2): what per-pair ratios of two
log-normal speeds are. Every simulation is seeded (the same numbers on every run) and pure
numpy; the whole file takes seconds.

- true gain 0: a gain gate passes at most alpha of the time (the Student-t rule: alpha/2);
  the field report's exact percentile bootstrap does not hold that at small n;
- true gain at the gate's power_at, at the pairs calibration says are needed: the gate passes
  at least at the declared power; the same for non-regression gates;
- calibration's noise estimate and the refusal of a plan its noise cannot resolve.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from orchestrator.errors import ConfigError, Inconclusive
from orchestrator.qualify import power, stats
from orchestrator.qualify.analysis import analyze
from orchestrator.qualify.calibration import calibration_of, judge, needs
from orchestrator.qualify.gates import decide
from orchestrator.qualify.plan import Bootstrap, load_plan

ALPHA = 0.05
SIMS = 4000
MC_TOL = 0.02  # about 3 standard errors of a pass rate estimated from SIMS runs


def simulate(kind, threshold, true_gain, sigma, n, *, sims=SIMS, seed=1, method="student-t"):
    """Pass rate of the gate over `sims` simulated qualifications of n pairs each."""
    rng = np.random.default_rng([seed, n, int(1e6 * sigma)])
    logs = rng.normal(math.log1p(true_gain), sigma, size=(sims, n))
    passes = 0
    for row in logs:
        r = np.exp(row)
        if method == "student-t":
            est = stats.GainEstimate(stats.geometric_gain(r), stats.t_interval(r, confidence=1 - ALPHA), tuple(r))
        else:  # the field report's method deciding, for comparison
            est = stats.GainEstimate(
                stats.geometric_gain(r), stats.bootstrap_interval(r, confidence=1 - ALPHA), tuple(r)
            )
        passes += decide(kind, "f", threshold, est, valid_pairs=n, planned_pairs=n).verdict == "pass"
    return passes / sims


# ---- the deciding interval ------------------------------------------------------------------


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 19, 60])
def test_t_quantile_matches_scipy(df):
    for p in (0.6, 0.9, 0.975, 0.995):
        assert stats.t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-9)
    assert stats.t_quantile(0.025, df) == pytest.approx(-stats.t_quantile(0.975, df))


def test_t_interval_known_answer_and_matches_scipy():
    r = [1.031, 1.045, 1.018, 1.052, 1.027]
    iv = stats.t_interval(r)
    logs = np.log(r)
    lo, hi = scipy.stats.t.interval(0.95, 4, loc=logs.mean(), scale=scipy.stats.sem(logs))
    assert (iv.low, iv.high) == pytest.approx((math.expm1(lo), math.expm1(hi)), rel=1e-9)
    assert (iv.method, iv.df) == ("student-t", 4)
    assert stats.t_interval([1.1]) is None  # one pair measures no spread


def test_t_interval_is_wider_than_the_percentile_bootstrap_at_small_n():
    r = [1.031, 1.045, 1.018, 1.052, 1.027]
    t, b = stats.t_interval(r), stats.bootstrap_interval(r)
    assert t.low < b.low and t.high > b.high


# ---- gain gate at no gain: false pass <= alpha ----------------------------------------------


@pytest.mark.parametrize("n,sigma", [(3, 0.05), (4, 0.10), (6, 0.03), (12, 0.20)])
def test_gain_gate_false_pass_at_zero_gain_is_at_most_alpha(n, sigma):
    rate = simulate("gain", 0.0, 0.0, sigma, n)  # threshold 0: only the interval stands between noise and a pass
    assert rate <= ALPHA / 2 + MC_TOL / 2, rate
    assert rate <= ALPHA


def test_percentile_bootstrap_deciding_would_not_hold_alpha_at_three_pairs():
    """Why the bootstrap no longer decides: at 3 pairs its interval is far too narrow."""
    boot = simulate("gain", 0.0, 0.0, 0.05, 3, method="bootstrap")
    t = simulate("gain", 0.0, 0.0, 0.05, 3)
    assert boot > 3 * ALPHA, boot  # it passes identical code well over alpha of the time
    assert t <= ALPHA


# ---- power at the calibrated n ----------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma,threshold,power_at,target", [(0.03, 0.05, 0.10, 0.8), (0.08, 0.05, 0.30, 0.8), (0.05, 0.0, 0.10, 0.9)]
)
def test_gain_gate_reaches_its_power_at_the_calibrated_pairs(sigma, threshold, power_at, target):
    n = power.required_pairs("gain", threshold, power_at, sigma, target, confidence=1 - ALPHA)
    assert n is not None and n >= 2
    assert simulate("gain", threshold, power_at, sigma, n, seed=7) >= target - MC_TOL
    if n > 2:  # and it is the fewest: one pair less falls short
        assert power.pass_probability("gain", threshold, power_at, sigma, n - 1, confidence=1 - ALPHA) < target
    # the false pass at no gain stays bounded at that n too
    assert simulate("gain", threshold, 0.0, sigma, n, seed=8) <= ALPHA


@pytest.mark.parametrize("sigma,threshold,target", [(0.02, -0.01, 0.8), (0.05, -0.05, 0.95), (0.10, -0.10, 0.9)])
def test_non_regression_gate_reaches_its_power_and_catches_a_regression(sigma, threshold, target):
    n = power.required_pairs("non_regression", threshold, 0.0, sigma, target, confidence=1 - ALPHA)
    assert n is not None
    assert simulate("non_regression", threshold, 0.0, sigma, n, seed=3) >= target - MC_TOL  # identical code passes
    # a candidate exactly at the floor passes at most alpha/2 of the time; one well below it fails
    assert simulate("non_regression", threshold, threshold, sigma, n, seed=4) <= ALPHA / 2 + MC_TOL / 2
    assert simulate("non_regression", threshold, 3 * threshold, sigma, n, seed=5) <= 0.05


def test_required_pairs_grows_with_noise_and_gives_up():
    ns = [power.required_pairs("non_regression", -0.05, 0.0, s, 0.8) for s in (0.01, 0.03, 0.06, 0.12)]
    assert ns == sorted(ns) and ns[0] < ns[-1]
    assert power.required_pairs("non_regression", -0.001, 0.0, 0.3, 0.8, max_pairs=50) is None
    assert power.pass_probability("gain", 0.05, 0.2, 0.05, 6) == power.pass_probability("gain", 0.05, 0.2, 0.05, 6)


# ---- calibration: the noise estimate and the refusal ------------------------------------------


@pytest.mark.parametrize("df", [2, 5, 9, 20])
def test_chi2_quantile_close_to_scipy(df):
    for p in (0.2, 0.5, 0.8):
        assert power.chi2_quantile(p, df) == pytest.approx(scipy.stats.chi2.ppf(p, df), rel=0.02)


def test_noise_upper_bound_covers_the_true_sigma_at_its_confidence():
    rng = np.random.default_rng(5)
    sigma = 0.04
    covered = np.mean([power.estimate_noise(rng.normal(0, sigma, 6)).sigma_upper >= sigma for _ in range(4000)])
    assert covered == pytest.approx(0.8, abs=0.03)


def _samples(plan, gains_by_pair, sigma_req, rng, base=1000.0):
    """Raw samples of a run: per pair, arm, fixture, repeat; each request's speed log-normal."""
    out = []
    for p in range(plan.pairs):
        for arm in ("baseline", "candidate"):
            for fx in plan.fixtures:
                for r in range(plan.repeats):
                    tg = base * (gains_by_pair[p] if arm == "candidate" else 1.0) * math.exp(rng.normal(0, sigma_req))
                    out.append(
                        {
                            "pair": p,
                            "arm": arm,
                            "rep": r,
                            "fixture": fx.name,
                            "family": fx.family,
                            "ok": True,
                            "prompt_sha256": "p" + fx.name,
                            "predicted_n": plan.n_predict,
                            "prompt_n": 200,
                            "prompt_tokens": 200,
                            "cache_n": 0,
                            "predicted_per_second": tg,
                            "prompt_per_second": 5000.0,
                            "wall_s": 0.2,
                            "ttft_s": 0.05,
                            "peak_memory_bytes": 1,
                            "draft_n": None,
                            "draft_n_accepted": None,
                        }
                    )
    return out


def test_simulated_calibration_then_aa_runs_through_the_real_analysis():
    """The whole chain on simulated raw samples: calibrate, size the plan, 150 A/A runs."""
    lab = load_plan("lab").plan
    rng = np.random.default_rng(22)
    cal_plan = lab.model_copy(update={"pairs": lab.calibration.pairs})
    cal_result = analyze(cal_plan, _samples(cal_plan, [1.0] * cal_plan.pairs, 0.02, rng))
    cal = calibration_of(lab, cal_result, "prof", {"native": "a", "rpc": "a"}, "lab")
    assert set(cal["families"]) == {"code", "prose", "combined"}
    n = max(g["needed_pairs"] for g in needs(lab, cal))  # the pairs this noise needs
    # (the bootstrap beside the deciding interval costs most of the time here: a small seeded one)
    plan = lab.model_copy(update={"pairs": max(n, lab.pairs), "bootstrap": Bootstrap(exact_limit=1, resamples=1000)})
    noise = judge(plan, ("c" * 64, cal), calibrate_hint="x")  # so a plan with that many is not refused
    assert noise is not None and all(g["resolvable"] for g in noise["gates"])
    if n > 2:
        with pytest.raises(Inconclusive):  # and one with a pair less is
            judge(lab.model_copy(update={"pairs": n - 1}), ("c" * 64, cal), calibrate_hint="x")
    verdicts = {"gain": [], "non_regression": []}
    excl = 0
    for _ in range(150):
        res = analyze(plan, _samples(plan, [1.0] * plan.pairs, 0.02, rng))
        for g in res.gates:
            verdicts[g.kind].append(g.verdict)
        excl += sum(
            1 for c in res.cells if c.family != "combined" and not (c.tg.interval.low <= 0 <= c.tg.interval.high)
        )
    assert verdicts["gain"].count("pass") <= 0.05 * 150
    assert verdicts["non_regression"].count("fail") <= 0.05 * 300
    assert excl <= 0.08 * 300  # ~5% of family intervals exclude zero under pure noise


def test_plan_refused_when_noise_cannot_resolve_it_and_when_uncalibrated():
    lab = load_plan("lab").plan
    loud = {"families": {f: {"sigma": 0.8, "sigma_upper": 1.0} for f in ("code", "prose", "combined")}, "pairs": 6}
    with pytest.raises(
        Inconclusive,
        match=r"refused before the first sample: .*non_regression\[code\] -50.00% needs "
        r".* the plan has 8",
    ):
        judge(lab, ("d" * 64, loud), calibrate_hint="pairctl qualify --calibrate")
    with pytest.raises(ConfigError, match="needs an A/A calibration") as e:
        judge(lab, None, calibrate_hint="pairctl qualify --calibrate --pair lab")
    assert "--calibrate" in (e.value.hint or "")
    short = [g for g in needs(lab, loud) if not g["resolvable"]]
    assert short and all(g["needed_pairs"] is None or g["needed_pairs"] > 8 for g in short)


def test_dispersed_arm_is_invalid_and_its_pair_missing():
    lab = load_plan("lab").plan
    rng = np.random.default_rng(1)
    s = _samples(lab, [1.0] * lab.pairs, 0.01, rng)
    wild = next(x for x in s if x["pair"] == 1 and x["arm"] == "candidate" and x["fixture"] == "code" and x["rep"] == 2)
    wild["predicted_per_second"] *= 4.0  # one request 4x as fast: the arm's sd of log TG is ~0.8
    res = analyze(lab, s)
    cells = {c.family: c for c in res.cells}
    assert 1 not in cells["code"].valid_pairs and 1 in cells["prose"].valid_pairs
    assert any("exceeds the plan's max_arm_dispersion" in i["problem"] for i in res.samples_invalid)
    assert {g.verdict for g in res.gates if g.family == "code"} == {"inconclusive"}
    arm = next(a for a in res.arms if (a["pair"], a["arm"], a["fixture"]) == (1, "candidate", "code"))
    assert arm["dispersion"] > lab.max_arm_dispersion and arm["valid"] is False and arm["repeats"] == 3


def test_dispersed_arm_measured_again_uses_the_first_attempt_within_the_bound():
    lab = load_plan("lab").plan
    rng = np.random.default_rng(1)
    s = _samples(lab, [1.0] * lab.pairs, 0.01, rng)
    arm = [x for x in s if x["pair"] == 1 and x["arm"] == "candidate" and x["fixture"] == "code"]
    arm[2]["predicted_per_second"] *= 4.0  # attempt 0 spreads too much ...
    s += [
        {**x, "attempt": 1, "predicted_per_second": 1000.0 * (1 + 0.001 * x["rep"])} for x in arm
    ]  # ... attempt 1 not
    res = analyze(lab, s)
    cells = {c.family: c for c in res.cells}
    assert 1 in cells["code"].valid_pairs
    assert [i["attempt"] for i in res.samples_invalid if "max_arm_dispersion" in i["problem"]] == [0]
    attempts = [a for a in res.arms if (a["pair"], a["arm"], a["fixture"]) == (1, "candidate", "code")]
    assert [(a["attempt"], a["valid"]) for a in attempts] == [(0, False), (1, True)]
