"""Two xdist workers at once, on purpose: each has its own lab addresses, ports and state folder, and
they share the package store, where the baseline package is built once (tests/plugins/workers.py)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]


def test_two_workers_share_no_lab_address_port_state_folder_or_build(pairctl_home, lab_packages, tmp_path):
    env = dict(
        os.environ,
        PROBE_DIR=str(tmp_path),
        PAIRCTL_TEST_HOME=str(pairctl_home),
        # blocks 6 and 7 of the worker range: clear of the workers of a `make test` running this
        PAIRCTL_TEST_WORKER_OFFSET="6",
    )
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PAIRCTL_TEST_LAB_INVENTORY", "PAIRCTL_INVENTORY"):
        env.pop(var, None)
    argv = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q",
            "-p", "no:cacheprovider", "-o", "addopts=", "tests/integration/probe_workers.py"]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("gw*.json"))]
    assert [r["worker"] for r in recs] == ["gw0", "gw1"], recs
    a, b = recs
    assert a["home"] != b["home"] and str(Path(pairctl_home).resolve()) not in (a["home"], b["home"])
    assert not Path(a["home"]).is_relative_to(b["home"]) and not Path(b["home"]).is_relative_to(a["home"])
    assert a["inventory"] != b["inventory"]
    for key in ("hosts", "services"):
        ends = [{tuple(e) for e in r[key]} for r in recs]
        assert not ends[0] & ends[1], f"shared {key}: {ends[0] & ends[1]}"
    addresses = [{h[0] for h in r["hosts"]} for r in recs]
    assert not addresses[0] & addresses[1]
    assert not {s[0] for s in a["sshd"]} & {s[0] for s in b["sshd"]}, "one sshd serving both workers"
    # the package store is shared: the same package, one folder, compiled at most once across the homes
    assert a["package"] == b["package"] == [lab_packages.id, str(lab_packages.path.resolve())]
    logs = list(itertools.chain.from_iterable(
        (Path(r["home"]) / "logs" / "build").glob(f"{lab_packages.id}-*.log") for r in recs))  # fmt: skip
    assert len(logs) == 0, f"a worker compiled a package the store already held: {logs}"
