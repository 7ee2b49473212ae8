"""When two_lane_near_full runs its two lanes a second time (checks/near_full._numerics_only).

An H100 baseline's lane parted from its solo run at 1.51 nats in one suite run and at 0.34, 0.17
and below 0 in four others (docs/gpu-validation.md): the two lanes are separate requests, so each
run draws another batch composition. Only a first run that failed by a parting alone, on a pair
whose measured floor is above 0, is run again; everything else is judged on the first run."""

from __future__ import annotations

from orchestrator.checks.near_full import _numerics_only
from orchestrator.checks.parting import Tolerance, Walk

PARTED = Walk(compared=34, problem="parted at token 34 (margin 1.511 nats), above the tolerance 1.032 nats")
CLEAN = Walk(compared=56)
GPU = Tolerance(1.032427, "measured on this pair: twin lanes against solo moved 0.516 nats")
CPU = Tolerance(0.0, "measured on this pair: twin lanes against solo moved 0 nats")


def test_a_parting_alone_on_a_device_with_numerics_is_run_again() -> None:
    assert _numerics_only(["lane 1: output differs from the same request run alone: ..."], [CLEAN, PARTED], GPU)


def test_a_floor_of_zero_demands_agreement_the_first_time() -> None:
    assert not _numerics_only(["lane 1: output differs ..."], [CLEAN, PARTED], CPU)


def test_any_other_problem_is_judged_on_the_first_run() -> None:
    assert not _numerics_only(
        ["lane 0: answer contains lane 1's nonce", "lane 1: output differs ..."], [CLEAN, PARTED], GPU
    )
    assert not _numerics_only([], [CLEAN, CLEAN], GPU)
    unfit = Tolerance(2.0, "measured", problem="the same prompt in two slots at once moved a logprob 2.51 nats")
    assert not _numerics_only([unfit.problem or "", "lane 1: output differs ..."], [CLEAN, PARTED], unfit)
