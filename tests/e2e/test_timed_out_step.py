"""Issue 33 item 4 on the real lab pair: a remote step whose exec timed out kept running on the
host and acted later (paused at restart-rpc, the exec timed out at 80 s, the deploy rolled back
"verified"; resumed, the step switched the RPC `current` link to the failed release 2 s later).

Here the host helper's `restart` process on the RPC host is SIGSTOPped as soon as it appears
(a real `pairctl deploy` child); the exec times out, and the host's own bound must kill it
before the rollback touches that host. Continued afterwards, nothing of it may act: the RPC
host keeps the restored pair's `current` link and service.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.plugins.pairs import is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PAIR = "lab"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _stop_restart_step(rpc_root: str, found: list[int], until: threading.Event) -> None:
    """SIGSTOP the helper's `restart` shell on the RPC host (argv: sh ROOT/bin/pairctl-svc restart ROOT ...)."""
    svc = os.path.join(rpc_root, "bin", "pairctl-svc")
    while not until.is_set() and not found:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = _cmdline(int(entry.name))
                if len(argv) > 3 and argv[0] == "sh" and argv[1] == svc and argv[2] == "restart":
                    os.kill(int(entry.name), signal.SIGSTOP)
                    found.append(int(entry.name))
                    return
        time.sleep(0.005)


def test_a_step_that_timed_out_is_killed_before_the_rollback_and_never_acts(
    deployed_lab, lab_packages, lab_packages_b, cli, restore_baseline
):
    a, b = lab_packages.id, lab_packages_b.id
    rpc_root = deployed_lab.roots()["rpc"]
    found: list[int] = []
    done = threading.Event()
    watcher = threading.Thread(target=_stop_restart_step, args=(rpc_root, found, done), daemon=True)
    watcher.start()
    home = str(deployed_lab.home)
    argv = [sys.executable, "-m", "orchestrator", "--home", home, "--json", "deploy", "--pair", PAIR]
    argv += ["--packages", b, b, "--skip-accept"]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=dict(os.environ, PAIRCTL_HOME=home))
    took = time.monotonic() - t0
    done.set()
    watcher.join(timeout=5)
    assert found, f"the restart step was never seen on the RPC host (exit {p.returncode}): {p.stderr[-2000:]}"
    pid = found[0]
    try:
        assert p.returncode == 7, p.stderr[-3000:]  # rolled back, verified
        assert "timed out" in p.stderr and "killed there" in p.stderr, p.stderr[-3000:]
        assert not _alive(pid), "the timed-out step still lives on the host after pairctl gave up on it"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGCONT)  # what the trial did: the paused step resumes
    time.sleep(3.0)
    link = os.readlink(os.path.join(rpc_root, "run", "current")).rsplit("/", 1)[-1]
    assert link == a, f"the RPC host's current names {link} after the rollback to {a}"
    st = lab_status(cli)
    assert is_active(st, a), json.dumps(st)[-3000:]
    print(f"restart-rpc stopped on the host: deploy rolled back in {took:.1f} s; the step was killed there")
