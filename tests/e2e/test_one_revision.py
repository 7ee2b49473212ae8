"""Issue 33 item 1: a pair never runs two source revisions, on the real lab pair.

A real `pairctl deploy` child killed just before `switch-native` leaves the two hosts' `current`
links on packages of two revisions (RPC restarted on the new one, native stopped on the old).
Then:
  - `repair --yes` never records that pair: it puts the odd host's link back to the recorded
    pair (one revision) and records it; a deploy afterwards works;
  - a mixed pair that an older pairctl recorded and started (its revision checks switched off
    here, for the commands that made it) is reported by `status` (exit 1) and `accept --checks
    identity` (failed), and `rollback` to a mixed previous pair and `repair` are refused (exit 6)
    with nothing changed; a deploy of one revision is the way out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build import revisions
from tests.plugins.pairs import deploy_baseline, hooked_deploy, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PAIR = "lab"


def _roots(lab) -> dict[str, Path]:
    p = lab.inventory.pair(PAIR)
    return {
        "native": Path(lab.inventory.host(p.native).install_root),
        "rpc": Path(lab.inventory.host(p.rpc).install_root),
    }


def _current(root: Path) -> str:
    return os.readlink(root / "run" / "current").rsplit("/", 1)[-1]


def _free_dead_runs(cli, st: dict[str, Any]) -> None:
    for run in sorted({s["run_id"] for s in st.get("stale_leases") or []}):
        r = cli("--json", "lease", "release", PAIR, "--dead-run", run)
        assert r.exit_code == 0, r.stderr[-2000:]


def _kill_before_switch_native(lab, cli, pkg: str, tmp_path: Path) -> None:
    child = hooked_deploy(lab.home.root, pkg, "switch-native:kill", tmp_path / "hook")
    child.wait(timeout=300)
    assert child.returncode == -9, (child.returncode, child.stderr.read() if child.stderr else "")
    _free_dead_runs(cli, lab_status(cli))


def _deploy(cli, pkg: str) -> Any:
    return cli("--json", "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", "lab", "--skip-accept")


def test_repair_puts_back_one_revision_after_a_kill_before_switch_native(
    lab, lab_packages, lab_packages_b, cli, tmp_path, restore_baseline
):
    a, b = lab_packages.id, lab_packages_b.id
    assert lab_packages.manifest.revision != lab_packages_b.manifest.revision
    roots = _roots(lab)
    deploy_baseline(cli, a)
    assert _deploy(cli, b).exit_code == 0  # active B, previous A: both releases on both hosts
    _kill_before_switch_native(lab, cli, a, tmp_path)
    assert (_current(roots["native"]), _current(roots["rpc"])) == (b, a)  # two revisions

    r = cli("--json", "repair", "--pair", PAIR, "--yes")
    assert r.exit_code == 0, r.stderr[-2000:]
    rec = json.loads(r.stdout)["record"]
    assert (rec["active"]["native_package"], rec["active"]["rpc_package"]) == (b, b), rec
    assert (_current(roots["native"]), _current(roots["rpc"])) == (b, b)  # the odd link went back
    assert rec["previous"] is None or rec["previous"]["native_package"] == rec["previous"]["rpc_package"]

    r = _deploy(cli, a)
    assert r.exit_code == 0, r.stderr[-3000:]
    assert is_active(lab_status(cli), a)


def test_a_mixed_pair_is_reported_and_refused(
    lab, lab_packages, lab_packages_b, cli, tmp_path, monkeypatch, restore_baseline
):
    a, b = lab_packages.id, lab_packages_b.id
    roots = _roots(lab)
    deploy_baseline(cli, a)
    assert _deploy(cli, b).exit_code == 0
    _kill_before_switch_native(lab, cli, a, tmp_path)  # native B (stopped), rpc A (running)

    # what an older pairctl did from here (no revision checks): repair recorded the links (active
    # B+A, previous A+B) and rollback started the previous pair: native A with RPC B, "verified"
    with monkeypatch.context() as m:
        m.setattr(revisions, "differ", lambda x, y: False)
        r = cli("--json", "repair", "--pair", PAIR, "--yes")
        assert r.exit_code == 0, r.stderr[-2000:]
        r = cli("--json", "rollback", "--pair", PAIR)
        assert r.exit_code == 0, r.stderr[-3000:]
    assert (_current(roots["native"]), _current(roots["rpc"])) == (a, b)

    st = cli("--json", "status", "--pair", PAIR)
    assert st.exit_code == 1, st.stdout[-2000:]
    assert any("two source revisions" in p for p in json.loads(st.stdout)["problems"]), st.stdout[-2000:]

    acc = cli("--json", "accept", "--pair", PAIR, "--checks", "identity")
    assert acc.exit_code != 0, acc.stdout[-2000:]
    assert "two source revisions" in acc.stdout + acc.stderr

    route = {r: (root / "run" / "route.json").read_bytes() for r, root in roots.items()}
    rb = cli("--json", "rollback", "--pair", PAIR)  # its previous pair is B+A
    assert rb.exit_code == 6, rb.stderr[-2000:]
    assert "one source revision" in rb.stderr and "nothing was started" in rb.stderr
    rp = cli("--json", "repair", "--pair", PAIR, "--yes")
    assert rp.exit_code == 6, rp.stderr[-2000:]
    assert {r: (root / "run" / "route.json").read_bytes() for r, root in roots.items()} == route
    assert (_current(roots["native"]), _current(roots["rpc"])) == (a, b)

    st = lab_status(cli)
    _free_dead_runs(cli, st)
    r = _deploy(cli, a)  # the way out: one revision to both hosts
    assert r.exit_code == 0, r.stderr[-3000:]
    assert is_active(lab_status(cli), a)
