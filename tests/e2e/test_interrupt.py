"""Signals during commands that hold leases (orchestrator/interrupt.py), on the real lab pair.

A real `pairctl` child process is paused at a step or check boundary by the test-only fault
hook (orchestrator/faults.py), signalled, and resumed: the run must stop at its next bounded point and
end like a failure: the previous pair active and verified (`pairctl status`), no lease left on
either host, the receipt `interrupted` naming the signal, exit 130 (docs/reference/exit-codes.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.evidence.store import EvidenceStore
from tests.plugins.pairs import deploy_baseline, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PAIR = "lab"
CHECKS = "two_lane_near_full,one_lane_near_full"


@pytest.fixture
def baseline(lab, lab_packages, cli) -> Any:
    deploy_baseline(cli, lab_packages.id, PAIR)
    assert is_active(lab_status(cli, PAIR), lab_packages.id)
    return lab


def _run_signalled(home: Path, tmp_path: Path, hook: str, sig: signal.Signals, *args: str) -> tuple[int, str, str]:
    """`pairctl --json ARGS` paused at `hook`, sent `sig` there, resumed; (exit, stdout, stderr)."""
    env = dict(
        os.environ,
        PAIRCTL_HOME=str(home),
        PAIRCTL_ENABLE_FAULT_HOOKS="1",
        PAIRCTL_FAULT_HOOK=f"{hook}:pause",
        PAIRCTL_FAULT_DIR=str(tmp_path),
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    argv = [sys.executable, "-m", "orchestrator", "--home", str(home), "--json", *args]
    with open(out, "w") as o, open(err, "w") as e:
        child = subprocess.Popen(argv, env=env, stdout=o, stderr=e)
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "paused").exists():
                assert child.poll() is None, err.read_text()[-3000:]
                assert time.monotonic() < deadline, f"never reached {hook}: {err.read_text()[-3000:]}"
                time.sleep(0.05)
            child.send_signal(sig)
            time.sleep(0.3)  # the handler has run: the run only records the signal
            assert child.poll() is None, "the signal killed pairctl instead of stopping the run"
            (tmp_path / "resume").write_text("")
            code = child.wait(timeout=240)
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
    return code, out.read_text(), err.read_text()


def _no_leases(cli) -> None:
    shown = json.loads(cli("--json", "lease", "show", PAIR).stdout)
    assert len(shown) == 2 and all(s["state"] == "free" for s in shown), shown


def _latest(home: Path) -> Any:
    return EvidenceStore(Path(home) / "evidence").latest(PAIR)


def test_sigterm_during_acceptance_rolls_back_and_releases(baseline, lab_packages, lab_packages_b, cli, tmp_path):
    a, b = lab_packages.id, lab_packages_b.id
    code, out, err = _run_signalled(
        baseline.home.root,
        tmp_path,
        "check:two_lane_near_full",
        signal.SIGTERM,
        "deploy", "--pair", PAIR, "--packages", b, b, "--checks", CHECKS,
    )  # fmt: skip
    assert code == 130, (code, err[-3000:])
    assert "SIGTERM received" in err and "rolled back" in err, err[-3000:]
    doc = json.loads(out)
    assert doc["error"]["exit_code"] == 130 and "SIGTERM" in doc["error"]["message"], doc["error"]
    assert is_active(lab_status(cli, PAIR), a)  # the previous pair, verified by status
    _no_leases(cli)
    rec = _latest(baseline.home.root)
    assert rec.command == "deploy" and rec.outcome == "interrupted" and "SIGTERM" in rec.reason, rec.reason
    assert rec.step("check:two_lane_near_full").outcome == "passed"  # the check in flight finished
    assert rec.step("check:one_lane_near_full") is None  # the next one never started
    assert rec.extra_fields()["final_state"]["state"] == "restored"


def test_sigint_before_activation_changes_nothing(baseline, lab_packages, lab_packages_b, cli, tmp_path):
    a, b = lab_packages.id, lab_packages_b.id
    before = lab_status(cli, PAIR)
    code, out, err = _run_signalled(
        baseline.home.root, tmp_path, "upload", signal.SIGINT, "deploy", "--pair", PAIR, "--packages", b, b
    )
    assert code == 130, (code, err[-3000:])
    st = lab_status(cli, PAIR)
    assert is_active(st, a) and st["route"]["revision"] == before["route"]["revision"], st
    _no_leases(cli)
    rec = _latest(baseline.home.root)
    assert rec.outcome == "interrupted" and "SIGINT" in rec.reason, rec.reason
    assert rec.step("upload").outcome == "skipped" and rec.step("stop-native") is None
    assert json.loads(out)["error"]["kind"] == "Interrupted"


def test_sigterm_during_accept_leaves_no_lease(baseline, lab_packages, cli, tmp_path):
    code, out, err = _run_signalled(
        baseline.home.root,
        tmp_path,
        "check:two_lane_near_full",
        signal.SIGTERM,
        "accept", "--pair", PAIR, "--checks", CHECKS,
    )  # fmt: skip
    assert code == 130, (code, err[-3000:])
    _no_leases(cli)
    assert is_active(lab_status(cli, PAIR), lab_packages.id)
    rec = _latest(baseline.home.root)
    assert rec.command == "accept" and rec.outcome == "interrupted" and "SIGTERM" in rec.reason, rec.reason


def test_sigterm_during_qualify_restores_and_leaves_no_lease(baseline, lab_packages, lab_packages_b, cli, tmp_path):
    """The GPU run's case: a qualify stopped by SIGTERM kept its leases (2 h) before."""
    a, b = lab_packages.id, lab_packages_b.id
    plan = str(Path(__file__).resolve().parents[1] / "unit" / "data" / "qualify" / "lab-uncalibrated.yaml")
    code, out, err = _run_signalled(
        baseline.home.root,
        tmp_path,
        "verify",  # the first arm's deploy, after it started its pair
        signal.SIGTERM,
        "qualify", "--pair", PAIR, "--baseline", a, a, "--candidate", b, b, "--plan", plan,
    )  # fmt: skip
    assert code == 130, (code, err[-3000:])
    _no_leases(cli)
    assert is_active(lab_status(cli, PAIR), a)
    doc = json.loads(out)
    sha = doc.get("receipt") or doc["error"]["receipt"]
    rec = EvidenceStore(Path(baseline.home.root) / "evidence").load(sha)
    assert rec.command == "qualify" and rec.outcome == "interrupted" and "SIGTERM" in rec.reason, rec.reason
    assert rec.step("restore").outcome == "passed"
