"""A healthy build whose numerics move with the batch, as a GPU's do, is accepted (issue 42).

CUDA is not batch-invariant: on an H100 the pinned baseline's two-lane and drafted runs parted from
the same request alone at near-ties, and acceptance, demanding equal text, rolled back a healthy
pair. tests/numerics/batch-jitter is the CPU lab's stand-in for those numerics: when a ubatch has
several outputs (two lanes at once, a verification batch), every logit moves by up to 0.12,
deterministically; one sequence alone is untouched. On a pair of its own (its first deploy, so it is
its own reference, as a GPU pair is), the whole suite passes at deploy and twice more at `accept`, and
the comparison checks' receipts show the floor they measured on it (above 0, under the cap) and the
tolerance they used. The mutants these checks exist for are still rejected (tests/mutants, on the
baseline's floor of 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.evidence.store import EvidenceStore
from tests.faults.harness import FaultPair, fresh_pair
from tests.plugins.packages import build_package

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

NAME = "jitter"
PORTS = (8191, 50191)
JITTER = Path(__file__).resolve().parents[1] / "numerics" / "batch-jitter"
COMPARISONS = ("check:two_lane_near_full", "check:speculative", "check:cached_continuation")


@pytest.fixture(scope="module")
def jitter_pair(request: Any, pairctl_home: Path):
    with fresh_pair(request, pairctl_home, NAME, PORTS) as fp:  # never deployed: its own reference
        yield fp


def _tolerances(fp: FaultPair, receipt: str) -> dict[str, dict[str, Any]]:
    rec = EvidenceStore(fp.home.evidence).load(receipt)
    out = {}
    for name in COMPARISONS:
        step = rec.step(name)
        assert step is not None and step.outcome == "passed", (name, step and step.outcome)
        out[name] = step.data["raw"]["tolerance"] if "tolerance" in step.data["raw"] else step.data["raw"]
    return out


def test_a_build_whose_logits_move_with_the_batch_deploys_and_is_accepted_twice(
    jitter_pair: FaultPair, pairctl_home: Path
) -> None:
    fp = jitter_pair
    pkg = build_package(pairctl_home, "baseline", extra=("--patch", str(JITTER)))
    p = fp.cli("--json", "deploy", "--pair", NAME, "--packages", pkg.id, pkg.id)
    assert p.returncode == 0, f"deploy exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    receipts = [json.loads(p.stdout)["receipt"]]
    for _ in range(2):
        a = fp.cli("--json", "accept", "--pair", NAME)
        assert a.returncode == 0, f"accept exit {a.returncode}\n{a.stdout[-3000:]}\n{a.stderr[-3000:]}"
        receipts.append(json.loads(a.stdout)["receipt"])
    for receipt in receipts:
        tol = _tolerances(fp, receipt)["check:two_lane_near_full"]
        floor = tol["floor_nats"]
        assert 0 < floor <= tol["cap_nats"], tol  # the batch moved logprobs, by numerics' size
        assert tol["origin"].startswith("measured on this pair") and tol["nats"] == pytest.approx(
            min(tol["factor"] * floor, tol["cap_nats"]), rel=1e-6
        )
