"""Session fixture `lab_calibration`: one A/A calibration of the lab plan on the lab pair.

The lab plan (manifests/plans/lab.yaml) needs a calibration of this pair, baseline package,
profile and plan measurement before it qualifies anything; measuring it once per session
(about a minute: the plan's calibration pairs of fresh baseline arms) serves every qualify
e2e test. The baseline is deployed first if it is not what runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build.store import Package
from tests.plugins.packages import run_pairctl

PAIR = "lab"


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
    p = run_pairctl(
        pairctl_home,
        "--json",
        "qualify",
        "--calibrate",
        "--pair",
        PAIR,
        "--baseline",
        a,
        a,
        "--plan",
        "lab",
        timeout=900,
    )
    assert p.stdout.strip(), f"calibration printed nothing (exit {p.returncode}): {p.stderr[-3000:]}"
    out = json.loads(p.stdout)
    return Calibration(p.returncode, out["receipt"], out.get("calibration") or {}, out, p.stderr)
