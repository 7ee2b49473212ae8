"""Simulated qualifications with correlated noise, through the real analysis code (issue 31).

A run is the plan's arm order (`QualifyPlan.arm_order`, alternating or seeded random); every arm
gets a log-speed level from a noise model evaluated at its position in the run, every measured
request that level plus per-request noise, and the samples have exactly the fields the runner
writes (`pair`, `arm`, `seq`, `rep`, ...). `analyze` then decides as it does on the lab.

Noise (all on log TG, so 0.05 is about 5%):

- `white`: independent per arm (an activation's luck);
- `ar_rho`, `ar_sd`: AR(1) across arms in run order, stationary sd `ar_sd` (load that lingers);
- `wave_amp`, `wave_period`: a square load wave, on for half of `wave_period` arms, off for the
  other half, random phase per run (a neighbour's periodic job; with a fixed arm order it can
  line up with the candidate arms);
- `trend`: a linear change over the run; `step`: a level change at a random arm in the middle
  half (drift, which the run must flag);
- `position`: the second arm of every pair this much faster (log), whichever arm it is;
- `confound_sd`: a per-run offset of the candidate arms only, N(0, confound_sd) (what a run's
  own spread cannot see: something tied to the arm's identity, a cold page cache of the
  candidate's files, that differs from run to run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.qualify.analysis import QualifyResult, analyze, rules_for
from orchestrator.qualify.calibration import calibration_of, judge, needs
from orchestrator.qualify.plan import Bootstrap, QualifyPlan


@dataclass(frozen=True)
class NoiseModel:
    name: str
    white: float = 0.05
    per_request: float = 0.02
    ar_rho: float = 0.0
    ar_sd: float = 0.0
    wave_amp: float = 0.0
    wave_period: float = 4.0
    trend: float = 0.0
    step: float = 0.0
    confound_sd: float = 0.0
    position: float = 0.0  # log offset of the second arm of every pair (a warm page cache, say)


IID = NoiseModel("iid")
AR1 = NoiseModel("ar1", white=0.02, ar_rho=0.8, ar_sd=0.08)
WAVE = NoiseModel("load-wave", white=0.02, wave_amp=0.25, wave_period=4.0)
SLOW_WAVE = NoiseModel("slow-wave", white=0.03, wave_amp=0.25, wave_period=12.0)
CONFOUND = NoiseModel("confound", white=0.04, confound_sd=0.05)
STEP = NoiseModel("step", white=0.03, step=-0.35)
TREND = NoiseModel("trend", white=0.03, trend=-0.35)
CORRELATED = (AR1, WAVE, SLOW_WAVE, CONFOUND)


def arm_levels(model: NoiseModel, n_arms: int, rng: np.random.Generator) -> np.ndarray:
    """Log-speed offset of each arm position in run order."""
    k = np.arange(n_arms, dtype=float)
    x = rng.normal(0.0, model.white, n_arms) if model.white else np.zeros(n_arms)
    if model.ar_sd:
        innov = model.ar_sd * math.sqrt(1 - model.ar_rho**2)
        a = rng.normal(0.0, model.ar_sd)
        for i in range(n_arms):
            a = a if i == 0 else model.ar_rho * a + rng.normal(0.0, innov)
            x[i] += a
    if model.wave_amp:
        phase = rng.uniform(0, model.wave_period)
        x += np.where(((k + phase) % model.wave_period) < model.wave_period / 2, -model.wave_amp, 0.0)
    if model.trend:
        x += model.trend * k / max(n_arms - 1, 1)
    if model.step:
        at = rng.integers(n_arms // 4, 3 * n_arms // 4 + 1)
        x += np.where(k >= at, model.step, 0.0)
    return x


def samples(
    plan: QualifyPlan,
    model: NoiseModel,
    rng: np.random.Generator,
    *,
    gain: float = 0.0,
    order_seed: int | None = None,
    base_tg: float = 50.0,
) -> list[dict[str, Any]]:
    order = plan.arm_order(order_seed)
    levels = arm_levels(model, len(order), rng)
    confound = rng.normal(0.0, model.confound_sd) if model.confound_sd else 0.0
    out = []
    for seq, (p, arm) in enumerate(order):
        shift = levels[seq] + (math.log1p(gain) + confound if arm == "candidate" else 0.0)
        shift += model.position if seq % 2 == 1 else 0.0
        for r in range(plan.repeats):
            for fx in plan.fixtures:
                tg = base_tg * math.exp(shift + rng.normal(0.0, model.per_request))
                out.append(
                    {
                        "pair": p,
                        "arm": arm,
                        "seq": seq,
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


def fast(plan: QualifyPlan) -> QualifyPlan:
    """The same plan with a small seeded bootstrap (it decides nothing and costs most of the time)."""
    return plan.model_copy(update={"bootstrap": Bootstrap(exact_limit=1, resamples=1000)})


def calibrate(
    plan: QualifyPlan, model: NoiseModel, rng: np.random.Generator, *, refuse: bool = False
) -> dict[str, Any]:
    """An A/A calibration under `model` (no confound: the baseline is in both arms), as the
    runner records it, and the `qualify_noise` record judge() would hand the run; `refuse`:
    judge() itself, raising Inconclusive where the command would refuse the plan (exit 9)."""
    assert plan.calibration is not None
    cal_plan = plan.model_copy(update={"pairs": plan.calibration.pairs, "sequential": None})  # as the runner
    seed = int(rng.integers(2**31)) if plan.order == "random" else None
    aa = NoiseModel(**{**model.__dict__, "confound_sd": 0.0})
    res = analyze(cal_plan, samples(cal_plan, aa, rng, order_seed=seed), rules=rules_for(cal_plan, None, seed))
    cal = calibration_of(plan, res, "prof", {"native": "a", "rpc": "a"}, "sim")
    if refuse:  # as the command does before the first sample: Inconclusive when a gate is unresolvable
        noise = judge(plan, ("sim", cal), calibrate_hint="(simulated)")
        assert noise is not None
        return noise
    return {"receipt": "sim", "pairs": cal["pairs"], "families": cal["families"], "gates": needs(plan, cal)}


def qualify(
    plan: QualifyPlan,
    model: NoiseModel,
    rng: np.random.Generator,
    *,
    gain: float = 0.0,
    noise: dict[str, Any] | None = None,
    floor: bool = True,
) -> QualifyResult:
    """One simulated qualification decided under recorded rules (`floor=False`: the calibrated
    floor switched off, i.e. the run's own sd only, as before issue 31)."""
    p = plan
    if not floor and plan.calibration is not None:
        p = plan.model_copy(update={"calibration": plan.calibration.model_copy(update={"floor": "none"})})
    seed = int(rng.integers(2**31)) if p.order == "random" else None
    return analyze(p, samples(p, model, rng, gain=gain, order_seed=seed), noise=noise, rules=rules_for(p, noise, seed))
