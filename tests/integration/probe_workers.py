"""Run by tests/integration/test_workers.py as `pytest -n 2` (not collected on its own: no test_ prefix).

Each item brings up its worker's real lab and gets the baseline package, records what it holds
(home, host addresses and ports, sshd pids, package path) in PROBE_DIR, then waits until the
other worker has recorded too, so the two labs are up at the same time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.lab.sshd import port_answers


@pytest.mark.parametrize("n", [pytest.param(i, marks=pytest.mark.xdist_group(f"probe{i}")) for i in range(2)])
def test_probe(n, lab, lab_packages, pairctl_home):
    out = Path(os.environ["PROBE_DIR"])
    inv = lab.inventory
    record = {
        "worker": os.environ["PYTEST_XDIST_WORKER"],
        "home": str(Path(pairctl_home).resolve()),
        "inventory": str(lab.inventory_path),
        "hosts": [[h.address, h.port] for h in inv.hosts.values()],
        "services": [[inv.host(p.native).address, p.server_port] for p in (inv.pair(name) for name in inv.pairs)]
        + [[inv.host(p.rpc).address, p.rpc_port] for p in (inv.pair(name) for name in inv.pairs)],
        "sshd": [[h.pid, h.address, h.port] for h in lab.status.hosts],
        "package": [lab_packages.id, str(lab_packages.path.resolve())],
    }
    assert all(port_answers(a, p) for _, a, p in record["sshd"]), record
    (out / f"{record['worker']}.json").write_text(json.dumps(record))
    # bounded by the parent test's timeout on this whole run
    while len(list(out.glob("gw*.json"))) < 2:
        time.sleep(0.2)
    assert all(port_answers(a, p) for _, a, p in record["sshd"]), "a lab went down while the other came up"
