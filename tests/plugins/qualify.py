"""Session fixtures for qualification: `lab_calibration` and `lab_calibrated_plan`.

The lab plan (manifests/plans/lab.yaml) needs a calibration of this pair, baseline package,
profile and plan measurement before it qualifies anything; measuring it once per session
(the plan's 8 calibration pairs of fresh baseline arms, about a minute and a half) serves every
qualify e2e test and is itself tested. The baseline is deployed first if it is not what runs.

`lab_calibrated_plan` is the lab plan given the pairs its calibration says each gate needs
(the calibration's measurement key excludes the pair count, so the same calibration judges it):
on a quiet machine the plan's own 8 pairs, on a loaded one more, up to MAX_E2E_PAIRS; beyond that
the lab is too noisy for the plan's gates and the tests that need it fail saying so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.build.store import Package
from orchestrator.qualify.plan import load_plan
from tests.plugins.packages import run_pairctl

PAIR = "lab"
MAX_E2E_PAIRS = 16


@dataclass(frozen=True)
class Calibration:
    exit_code: int
    receipt: str
    calibration: dict[str, Any]
    output: dict[str, Any]
    stderr: str


@pytest.fixture(scope="session")
def lab_calibration(lab, lab_packages: Package, pairctl_home: Path) -> Calibration:
    a = lab_packages.manifest.id
    st = run_pairctl(pairctl_home, "--json", "status", "--pair", PAIR)
    route = (json.loads(st.stdout) if st.stdout.strip() else {}).get("route") or {}
    if route.get("active_packages") != [a, a]:
        d = run_pairctl(
            pairctl_home, "--json", "deploy", "--pair", PAIR, "--packages", a, a, "--profile", "lab", "--skip-accept"
        )
        assert d.returncode == 0, d.stderr[-3000:]
    args = ("--json", "qualify", "--calibrate", "--pair", PAIR, "--baseline", a, a, "--plan", "lab")
    p = run_pairctl(pairctl_home, *args, timeout=900)
    assert p.stdout.strip(), f"calibration printed nothing (exit {p.returncode}): {p.stderr[-3000:]}"
    out = json.loads(p.stdout)
    return Calibration(p.returncode, out["receipt"], out.get("calibration") or {}, out, p.stderr)


def sized_plan(calibration: dict[str, Any], dest: Path, *, max_pairs: int = MAX_E2E_PAIRS) -> Path:
    """The lab plan with the pairs `calibration` says its gates need (at least its own), written
    to `dest` with absolute fixture paths. Fails when the noise needs more than `max_pairs`."""
    src = load_plan("lab")
    needed = [g["needed_pairs"] for g in calibration.get("gates") or []]
    if not needed or any(n is None or n > max_pairs for n in needed):
        pytest.fail(
            f"the lab is too noisy for the lab plan's gates: pairs needed {needed} (at most {max_pairs} "
            f"in a test); noise {calibration.get('families')}"
        )
    data = yaml.safe_load(src.path.read_text())
    for f in data["fixtures"]:
        f["path"] = str(src.fixture_paths[f["name"]])
    data["pairs"] = max(src.plan.pairs, *needed)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


@pytest.fixture(scope="session")
def lab_calibrated_plan(lab_calibration: Calibration, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sized_plan(lab_calibration.calibration, tmp_path_factory.mktemp("qualify") / "lab-calibrated.yaml")
