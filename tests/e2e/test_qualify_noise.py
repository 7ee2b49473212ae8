"""Issue 31 on the real lab, one short instance: a qualification of identical code under an
injected, scheduled CPU load (benchmarks/_loadwave.py), judged by a calibration measured under
the same load. The repeated proof (15 runs and a slowed candidate) is the benchmark
`python -m benchmarks qualify_noise` (docs/qualify-calibration.md); this is its smallest piece:
about 3-4 minutes (a calibration of 8 pairs and one A/A run on 8 or more)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks._loadwave import LoadWave, Schedule
from orchestrator.evidence.store import EvidenceStore
from tests.plugins.packages import run_pairctl
from tests.plugins.qualify import MAX_E2E_PAIRS, sized_plan

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(1200),
    # about 4 minutes of a qualification under load: kept out of CI's 90 (`make test`); the same proof,
    # repeated, is `python -m benchmarks qualify_noise` (docs/qualify-calibration.md)
    pytest.mark.skipif(
        os.environ.get("PAIRCTL_TEST_SLOW") != "1", reason="a qualification under load: PAIRCTL_TEST_SLOW=1"
    ),
]

PAIR = "lab"


def test_identical_code_under_an_injected_load_passes_no_gain_gate(
    deployed_lab, lab, lab_packages, pairctl_home, tmp_path
):
    a = lab_packages.manifest.id
    store = EvidenceStore(lab.home.evidence)
    with LoadWave(Schedule(workers=1, on_s=15, off_s=15, duration_s=900)) as wave:
        cal = run_pairctl(
            pairctl_home, "--json", "qualify", "--calibrate", "--pair", PAIR, "--baseline", a, a, "--plan", "lab",
            timeout=900,
        )  # fmt: skip
        assert cal.stdout.strip(), cal.stderr[-3000:]
        c = json.loads(cal.stdout)
        needed = [g["needed_pairs"] for g in c["calibration"]["gates"]]
        too_noisy = any(n is None or n > MAX_E2E_PAIRS for n in needed)
        # Under the injected load the lab may be too noisy for the plan's gates at any pair count a
        # test can afford: then the plan at its own pairs must be refused before the first sample.
        plan = "lab" if too_noisy else str(sized_plan(c["calibration"], tmp_path / "lab-calibrated.yaml"))
        before = store.hashes()
        p = run_pairctl(
            pairctl_home, "--json", "qualify", "--pair", PAIR, "--baseline", a, a, "--candidate", a, a,
            "--plan", plan, "--calibration", c["receipt"], timeout=900,
        )  # fmt: skip
    assert wave.record()["workers"][0]["cpu_s"] > 1.0  # the load really ran
    if too_noisy:
        assert p.returncode == 9 and "refused before the first sample" in p.stderr + p.stdout, (needed, p.stderr)
        assert store.hashes() == before  # nothing ran
        return
    out = json.loads(p.stdout)
    assert p.returncode in (1, 9), p.stderr[-3000:]  # identical code: never a pass
    assert not [g for g in out["gates"] if g["kind"] == "gain" and g["verdict"] == "pass"], out["gates"]
    for g in out["gates"]:  # every gate names the spread that decided, with both figures
        assert g["spread"] in ("own", "calibrated") and g["sd_own"] > 0 and g["sd_calibrated"] > 0, g
        assert max(g["sd_own"], g["sd_calibrated"]) == pytest.approx(
            next(c_["tg"]["interval"]["sd_log"] for c_ in out["cells"] if c_["family"] == g["family"])
        )
    assert out["noise"]["receipt"] == c["receipt"] and out["rules"]["floor"] == "sigma_upper"
    rules = store.load(out["receipt"]).extra_fields()["qualify_rules"]
    assert rules["order"] == "random" and isinstance(rules["order_seed"], int)
    if out["drift"]["flagged"]:
        assert p.returncode == 9 and "drift" in out["reason"], out["reason"]
    md = Path(out["report"], "report.md").read_text()
    assert "## Drift and arm order" in md and f"random (seed {rules['order_seed']}) order" in md
    assert "Spread that decided" in md and "position effect (second arm of a pair vs first)" in md
