"""Three lab pairs (six real sshd hosts) accepted concurrently, one broken on purpose.

Issue 9: `accept --all --parallel 3` gives two passes and one failure with the right exit code and
three receipts; `status --all` reports per pair; the textfile output parses with Prometheus' parser.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.lab.lab import stop_supervisors
from tests.plugins.pairs import deploy_baseline

pytestmark = pytest.mark.e2e

CHECKS = "identity,cached_continuation"


def _kill_server(root: str) -> int:
    stop_supervisors(Path(root))  # dead for good: its supervisor would restart it (issue 18)
    pid = int(Path(root, "run", "llama-server.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    return pid


def test_three_pairs_accepted_concurrently_one_broken(cli, lab3, lab_packages, pairctl_home):
    inv = str(lab3.inventory_path)
    pkg = lab_packages.id
    for p in ("lab1", "lab2", "lab3"):
        deploy_baseline(cli, pkg, pair=p, inventory=inv)

    # lab2's llama-server dies behind pairctl's back
    _kill_server(lab3.inventory.host(lab3.inventory.pair("lab2").native).install_root)

    before = {p: cli("--json", "receipts", "list", "--pair", p).stdout for p in ("lab1", "lab2", "lab3")}
    r = cli("--json", "accept", "--all", "--parallel", "3", "--only", CHECKS, inventory=inv)
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    verdict = {p["pair"]: p["ok"] for p in out["pairs"]}
    assert verdict == {"lab1": True, "lab2": False, "lab3": True}

    # one new accept receipt per pair, each with its own outcome
    for p, ok in verdict.items():
        rows = json.loads(cli("--json", "receipts", "list", "--pair", p).stdout)
        new = [x for x in rows if x["hash"] not in before[p] and x["command"] == "accept"]
        assert len(new) == 1, (p, new)
        assert new[0]["outcome"] == ("passed" if ok else "failed")

    # status --all names the broken pair, per pair
    st = cli("--json", "status", "--all", "--parallel", "3", inventory=inv)
    assert st.exit_code == 1
    rows = {row["pair"]: row for row in json.loads(st.stdout)["pairs"]}
    assert rows["lab2"]["problems"] and not rows["lab1"]["problems"] and not rows["lab3"]["problems"]
    assert rows["lab1"]["last_acceptance"] == "passed"

    # monitoring: one textfile per pair, parsed by Prometheus' own parser
    metrics = {}
    for p in ("lab1", "lab3"):
        text = (pairctl_home / "metrics" / f"pairctl_{p}.prom").read_text()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                metrics[(p, s.name, s.labels.get("check"))] = s.value
        assert metrics[(p, "pairctl_acceptance_passed", None)] == 1.0
        assert metrics[(p, "pairctl_acceptance_last_success_timestamp_seconds", None)] > time.time() - 600

    # put lab2 back for whoever comes next
    deploy_baseline(cli, pkg, pair="lab2", inventory=inv)
