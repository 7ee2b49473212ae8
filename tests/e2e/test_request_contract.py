"""`request_contract` (issue 47) on the deployed baseline: every probe of the declared request
surface holds on the tiny lab model (`lab`) and on the real one (`lab-real`, marked), and the
receipt lists the declared request fields checked (by which probe) and those not checked.
The contract mutants that this check must reject are in tests/mutants."""

from __future__ import annotations

import json

import pytest

from orchestrator.checks import contract
from orchestrator.config.request_surface import DEFAULT_SURFACE
from orchestrator.evidence.store import EvidenceStore
from tests.mutants.test_mutants import REAL_MARKS, REAL_PROFILE
from tests.plugins.pairs import PAIR, PROFILE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _judge(rec) -> None:
    step = rec.step(f"check:{contract.NAME}")
    assert step is not None and step.outcome == "passed", step.data if step else rec.steps
    surface = rec.extra_fields()["acceptance"]["request_surface"]
    assert surface["declared"] == list(DEFAULT_SURFACE)
    assert set(surface["checked"]) == set(DEFAULT_SURFACE) - {"tools", "seed"}, surface
    assert all(v["verdict"] == "passed" for v in surface["checked"].values()), surface
    # seed is the sampling check's, which did not run here; tools has no probe
    assert surface["unchecked"] == {"seed": "sampling did not run", "tools": "no probe for this field"}, surface
    assert set(surface["not_declared"]) == {"frequency_penalty", "presence_penalty"}


@pytest.mark.parametrize("profile", [PROFILE, pytest.param(REAL_PROFILE, marks=REAL_MARKS)])
def test_the_baseline_keeps_the_request_contract(profile, deployed_lab, restore_baseline, cli):
    pkg = deployed_lab.package_id
    if profile == PROFILE:  # the baseline is active on `lab`: accept it
        r = cli("--json", "accept", "--pair", PAIR, "--checks", contract.NAME)
    else:  # the same package on the real model, accepted by deploy (restore_baseline puts `lab` back)
        r = cli("--json", "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", profile,
                "--checks", contract.NAME)  # fmt: skip
    assert r.exit_code == 0, r.output[-4000:]
    rec = EvidenceStore(deployed_lab.home / "evidence").load(json.loads(r.stdout)["receipt"])
    _judge(rec)
