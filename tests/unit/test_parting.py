"""The parting walk (checks/parting.py) and the twin-lane floor figures (checks/batch_floor.py):
two greedy runs may part only at a near-tie within the pair's measured tolerance.

The fake server here is pure logic standing in for a deterministic greedy model: each position's
distribution is a function of the prefix, and a "batched" run adds a perturbation, as a GPU does.
"""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest

from orchestrator.checks import batch_floor
from orchestrator.checks.parting import Tolerance, first_difference, margin_of, pooled, summary, walk

ROOT = Path(__file__).resolve().parents[2]
VOCAB = range(6)


def dist(prefix: list[int], *, tie_at: set[int] = frozenset(), noise: float = 0.0) -> dict[int, float]:
    """A log-softmax over six tokens: token (len(prefix) * 7) % 6 wins by 3 nats, except at
    `tie_at` positions where the runner-up is only 0.1 nats behind; `noise` shifts the runner-up up."""
    pos = len(prefix)
    best = (pos * 7 + sum(prefix)) % 6
    second = (best + 1) % 6
    logits = {t: 0.0 for t in VOCAB}
    logits[best] = 3.0
    logits[second] = (2.9 if pos in tie_at else 0.0) + noise
    z = math.log(sum(math.exp(v) for v in logits.values()))
    return {t: v - z for t, v in logits.items()}


def greedy(prefix: list[int], n: int, **kw: object) -> list[int]:
    out = list(prefix)
    for _ in range(n):
        d = dist(out, **kw)  # type: ignore[arg-type]
        out.append(max(d, key=lambda t: d[t]))
    return out[len(prefix) :]


def test_first_difference_and_margin():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([1, 9, 3], [1, 2, 3], start=2) is None
    d = {1: -0.1, 2: -0.3, 3: -5.0}
    assert margin_of(d, 1, 2) == pytest.approx((0.2, 0.2))
    m, at_least = margin_of(d, 1, 7)  # not listed: at least down to the smallest listed
    assert m is None and at_least == pytest.approx(4.9)
    assert margin_of(d, 2, 1)[0] == pytest.approx(-0.2)  # the probe itself preferred ours


def test_identical_runs_pass_without_a_request():
    ref = greedy([], 20)
    w = walk(ref, list(ref), probe=lambda p: pytest.fail("no probe"), reanchor=lambda p, n: [], side="reference",
             tolerance=0.0)  # fmt: skip
    assert w.problem is None and w.partings == [] and w.compared == 20 and w.requests == 0


def test_a_near_tie_flipped_by_batch_noise_passes_and_the_walk_goes_on():
    """The GPU case: beside another lane the runner-up at a 0.1-nat tie wins; the solo side is
    re-run from the lane's prefix, and the rest is still compared."""
    tie = {5, 12}
    ref = greedy([], 20, tie_at=tie)
    batched = greedy([], 20, tie_at=tie, noise=0.2)  # flips both ties, nothing else
    assert batched != ref
    calls: list[str] = []

    def probe(prefix: list[int]) -> dict[int, float]:
        calls.append("probe")
        return dist(prefix, tie_at=tie)

    def reanchor(prefix: list[int], left: int) -> list[int]:
        calls.append("reanchor")
        return greedy(prefix, left, tie_at=tie)

    w = walk(batched, ref, probe=probe, reanchor=reanchor, side="reference", tolerance=0.3)
    assert w.problem is None, w.problem
    assert [p.position for p in w.partings] == [5, 12]
    assert all(p.within and p.margin == pytest.approx(0.1) for p in w.partings)
    assert w.compared == 20 and calls == ["probe", "reanchor", "probe", "reanchor"]
    # the same parting under the CPU's tolerance (floor 0) fails, naming position and margin
    strict = walk(batched, ref, probe=probe, reanchor=reanchor, side="reference", tolerance=0.0)
    assert strict.problem is not None and "token 5" in strict.problem and "margin 0.1" in strict.problem


def test_a_confident_parting_fails_whatever_follows():
    """What a steered lane or an unverified draft looks like: it leaves the reference where the
    reference was sure (3 nats), far above a GPU's floor."""
    ref = greedy([], 20)
    steered = ref[:7] + [(ref[7] + 1) % 6] + ref[8:]
    w = walk(steered, ref, probe=dist, reanchor=lambda p, n: greedy(p, n), side="reference", tolerance=0.54)
    assert w.problem is not None and "token 7" in w.problem
    assert w.partings[0].margin == pytest.approx(3.0) and not w.partings[0].within


def test_a_token_outside_the_top_k_fails_with_a_lower_bound():
    ref = greedy([], 10)
    other = ref[:3] + [99] + ref[4:]
    w = walk(other, ref, probe=dist, reanchor=lambda p, n: greedy(p, n), side="subject", tolerance=1.0)
    assert w.problem is not None and "not in the top K" in w.problem


def test_subject_side_reanchor_takes_the_references_token():
    """Speculative: the drafted side continues from the reference's prefix."""
    tie = {4}
    ref = greedy([], 12, tie_at=tie)
    drafted = greedy([], 12, tie_at=tie, noise=0.2)
    seen: list[list[int]] = []

    def reanchor(prefix: list[int], left: int) -> list[int]:
        seen.append(list(prefix))
        return greedy(prefix, left, tie_at=tie)

    w = walk(drafted, ref, probe=lambda p: dist(p, tie_at=tie), reanchor=reanchor, side="subject", tolerance=0.2)
    assert w.problem is None and seen == [ref[:5]]


def test_more_near_ties_than_the_measured_parting_rate_explains_fail():
    """Review of issue 42: the walk stopped comparing after MAX_PARTINGS near-ties and passed, so a
    shift that parts the runs at every tie (each within the tolerance) was accepted. A walk may hold
    as many near-ties as the long twins' measured parting rate explains; one more fails, naming it."""
    tie = set(range(1, 30, 2))
    ref = greedy([], 30, tie_at=tie)
    batched = greedy([], 30, tie_at=tie, noise=0.2)
    w = walk(batched, ref, probe=lambda p: dist(p, tie_at=tie), reanchor=lambda p, n: greedy(p, n, tie_at=tie),
             side="reference", tolerance=0.3, max_partings=(3, "measured"))  # fmt: skip
    assert w.stopped_early and len(w.partings) == 4
    assert w.problem is not None and "parted 4 times" in w.problem and "(3: measured)" in w.problem
    s = summary([w], Tolerance(0.3, "declared"))
    assert s["partings"] == 4 and s["stopped_early"] and s["max_parting_margin"] == pytest.approx(0.1)
    # the default bound (no rate measured) no longer passes a walk that keeps parting either
    w8 = walk(batched, ref, probe=lambda p: dist(p, tie_at=tie), reanchor=lambda p, n: greedy(p, n, tie_at=tie),
              side="reference", tolerance=0.3)  # fmt: skip
    assert w8.problem is not None and len(w8.partings) == 9
    # a measuring walk (no tolerance) stops at the bound without a problem
    wm = walk(batched, ref, probe=lambda p: dist(p, tie_at=tie), reanchor=lambda p, n: greedy(p, n, tie_at=tie),
              side="reference", tolerance=math.inf, max_partings=(3, "measuring"))  # fmt: skip
    assert wm.problem is None and wm.stopped_early and len(wm.partings) == 3


def _h100_receipts() -> list[dict[str, Any]]:
    with tarfile.open(ROOT / "docs/gpu-real-raw.tgz") as tf:
        return [json.load(tf.extractfile(m)) for m in tf.getmembers()  # type: ignore[arg-type]
                if m.name.endswith(("receipt-deploy-base.json", "receipt-candidate-sm90.json"))]  # fmt: skip


def test_the_parting_bound_pools_every_twin_and_fails_a_healthy_walk_rarely():
    """Issue 42: the bound came from one sample (the long twins' partings in ~112 tokens), so a pair
    whose long twins happened not to part allowed 2, which a healthy GPU walk may exceed. Now every
    twin is pooled and the bound holds the rate's uncertainty: at any true rate, the chance that a
    healthy walk exceeds the bound set from a healthy measurement is below FALSE_FAIL (computed
    exactly over the measurement's Poisson outcomes), and more evidence of no partings tightens it."""
    from orchestrator.checks.parting import FALSE_FAIL, MAX_PARTINGS, parting_limit

    exposure, tokens = 400, 56
    for rate in (0.0005, 0.005, 0.02, 0.05, 0.1):
        mu = rate * exposure
        p_seen = [math.exp(-mu + k * math.log(mu) - math.lgamma(k + 1)) for k in range(200)]
        fail = sum(ps * _poisson_above(parting_limit(k, exposure, tokens), rate * tokens)
                   for k, ps in enumerate(p_seen))  # fmt: skip
        assert fail < FALSE_FAIL, rate
    assert parting_limit(0, 400, 56) == 6 and parting_limit(0, 2000, 56) == 3 and parting_limit(0, 400, 16) == 3
    assert parting_limit(9, 354, 56) > parting_limit(1, 354, 56) > parting_limit(0, 354, 56)
    assert Tolerance(0.5, "declared").parting_bound(64)[0] == MAX_PARTINGS  # no rate measured


def _poisson_above(n: int, mean: float) -> float:
    return 1.0 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(n + 1))


def test_every_twin_is_pooled_and_no_healthy_h100_walk_exceeds_its_bound():
    """The H100 run (docs/gpu-real-raw.tgz): short twins parted 4 times (at 7, 7, 16, 16: 8 + 17 tokens
    each, 8 more twins 24 unparted), long twins 5 times in 112: 9 in 354. Every walk of the healthy
    baseline and candidate (up to 7 partings in 56 tokens) stays within its bound."""
    walks = 0
    for receipt in _h100_receipts():
        for step in receipt["steps"]:
            raw = (step.get("data") or {}).get("raw") or {}
            if "tolerance" not in raw:
                continue
            tol = Tolerance(raw["tolerance"]["nats"], "receipt", raw["tolerance"])
            assert pooled(raw["tolerance"]) == (9, 354)
            for w in raw.get("walks") or [raw["walk"]]:
                n, why = tol.parting_bound(w["compared"])
                assert len(w["partings"]) <= n and "9 times in 354 tokens" in why
                walks += 1
    assert walks == 12


def test_the_bound_fails_a_walk_that_parts_more_naming_it():
    tie = set(range(1, 30, 2))
    ref = greedy([], 30, tie_at=tie)
    batched = greedy([], 30, tie_at=tie, noise=0.2)
    short = [{"round": r, "parted_at": None} for r in range(12)]
    long = [{"partings": [], "compared": 64}] * 2
    cpu = Tolerance(0.3, "measured", {"twins": short, "twin_generate": 24, "long_twin_walks": long})
    assert pooled(cpu.figures) == (0, 12 * 24 + 128)
    bound = cpu.parting_bound(30)
    w = walk(batched, ref, probe=lambda p: dist(p, tie_at=tie), reanchor=lambda p, n: greedy(p, n, tie_at=tie),
             side="reference", tolerance=0.3, max_partings=bound)  # fmt: skip
    assert w.stopped_early and len(w.partings) == bound[0] + 1
    assert w.problem is not None and "twins parted 0 times in 416 tokens compared" in w.problem


def test_a_short_run_is_a_problem():
    ref = greedy([], 10)
    w = walk(ref[:6], ref, probe=dist, reanchor=lambda p, n: [], side="reference", tolerance=1.0)
    assert w.problem is not None and "6 and 10 tokens" in w.problem


def test_twin_figures_measure_movement_and_parting_margin():
    solo_toks = greedy([], 8, tie_at={3})
    solo_pos = [dist(solo_toks[:i], tie_at={3}) for i in range(8)]
    same = batch_floor.twin_figures((solo_toks, solo_pos), (solo_toks, solo_pos))
    assert same["moved"] == 0.0 and same["parted_at"] is None and same["compared_positions"] == 8
    moved_pos = [{t: v + (0.05 if t == 0 else 0.0) for t, v in p.items()} for p in solo_pos]
    moved = batch_floor.twin_figures((solo_toks, moved_pos), (solo_toks, solo_pos))
    assert moved["moved"] == pytest.approx(0.05)
    twin_toks = greedy([], 8, tie_at={3}, noise=0.2)
    twin_pos = [dist(twin_toks[:i], tie_at={3}, noise=0.2) for i in range(8)]
    parted = batch_floor.twin_figures((twin_toks, twin_pos), (solo_toks, solo_pos))
    assert parted["parted_at"] == 3 and parted["parted_margin"] == pytest.approx(0.1)
    assert parted["moved"] == pytest.approx(0.2, abs=0.05)  # the runner-up moved 0.2 before the tie


def test_a_probe_that_disagrees_with_its_own_run_is_never_a_tie():
    """The reference run's token missing from its own probe's top K, or the probe preferring our
    token by more than the tolerance: the reference side disagrees with itself, not a near-tie."""
    assert margin_of({1: -0.1, 2: -0.3}, 9, 1) == (None, float("inf"))
    ref = greedy([], 10)
    other = ref[:4] + [(ref[4] + 1) % 6] + ref[5:]

    def flipped(prefix: list[int]) -> dict[int, float]:  # the probe prefers our token by 3 nats
        d = dist(prefix)
        if len(prefix) == 4:
            d = {t: v for t, v in d.items()}
            d[ref[4]], d[other[4]] = d[other[4]], d[ref[4]]
        return d

    w = walk(other, ref, probe=flipped, reanchor=lambda p, n: greedy(p, n), side="reference", tolerance=1.0)
    assert w.problem is not None and w.partings[0].margin == pytest.approx(-3.0)
    w = walk(other, ref, probe=lambda p: {99: 0.0}, reanchor=lambda p, n: [], side="reference", tolerance=1.0)
    assert w.problem is not None and "not in its probe's top K" in w.problem
