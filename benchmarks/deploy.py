"""Wall time of a lab deploy, split into pairctl's own work and the servers' start-up.

Two deploys on the lab pair `lab` with packages built by `pairctl build` (baseline "A" and
revision lab-b "B"), identity-verified, acceptance skipped:
  fresh     B is not on the hosts (its release directories are removed first): upload + verify
  uploaded  back to A, which is already on the hosts: verify only, 0 package bytes sent
Reported per deploy: wall time, the servers' start-to-ready time (ggml-rpc-server listening,
llama-server /health 200), pairctl's own share (the rest: connect, leases, upload, hashing,
stop, switch, verification), SSH execs (each starts a process and the login shell on the host:
~0.5 s apiece on this machine, where root's .bashrc runs `pyenv init`) and round trips as the
transport counts them, and package bytes sent. The rpc server's start-to-listening time is
measured around the one exec that restarts it, so it includes that exec's overhead. Targets
(issue 4): fresh < 3 s, uploaded < 2 s with 0 bytes.

Home: PAIRCTL_HOME, else the test session's home (.state/test), so the packages the e2e
tests built are reused. The lab is brought up if needed; A stays active afterwards.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FRESH_TARGET_S = 3.0
UPLOADED_TARGET_S = 2.0
INVENTORY = os.environ.get("PAIRCTL_BENCH_INVENTORY", "lab")  # another lab pair (lab3 / lab1) if `lab` is busy
PAIR = os.environ.get("PAIRCTL_BENCH_PAIR", "lab")


def _home():
    from orchestrator.paths import Home

    root = os.environ.get("PAIRCTL_HOME") or str(REPO / ".state" / "test")
    os.environ["PAIRCTL_HOME"] = root
    return Home.resolve(root)


def _packages(home) -> tuple[str, str]:
    """(A, B): baseline and lab-b cpu-lab packages, built with `pairctl build` if missing."""
    from orchestrator.build.store import PackageStore
    from orchestrator.lab.source import BASELINE_TAG, ensure_source
    from tests.plugins.packages import REV_B_TAG, build_package, ensure_rev_b

    repo = ensure_source(home)
    ensure_rev_b(repo)
    a = build_package(home.root, BASELINE_TAG)
    b = build_package(home.root, REV_B_TAG)
    assert PackageStore(home.store).get(a.id).manifest.revision != b.manifest.revision
    return a.id, b.id


class _CountingPool:
    """A TransportPool whose transports count their execs (`run` calls; SFTP requests are not
    execs). The transport's own stats count SFTP requests as commands too."""

    def __init__(self, inventory: Any) -> None:
        from orchestrator.remote.pool import TransportPool

        self._pool = TransportPool(inventory)
        self.execs: dict[str, int] = {}

    def get(self, host: str) -> Any:
        t = self._pool.get(host)
        if not getattr(t, "_bench_counted", False):
            inner = t.run

            def run(cmd: Any, **kw: Any) -> Any:
                self.execs[host] = self.execs.get(host, 0) + 1
                return inner(cmd, **kw)

            t.run = run  # run_idempotent calls run, so it is counted once
            t._bench_counted = True
        return t

    def stats(self) -> dict[str, Any]:
        return {h: {**s, "execs": self.execs.get(h, 0)} for h, s in self._pool.stats().items()}

    def close(self) -> None:
        self._pool.close()


def _deploy(home: Any, inv: Any, pkg: str) -> Any:
    from orchestrator.engine.deploy import deploy

    pool = _CountingPool(inv)
    try:
        return deploy(home, inv, PAIR, (pkg, pkg), profile_name="lab", skip_accept=True, pool=pool)
    finally:
        pool.close()


def _measure(res: Any) -> dict[str, Any]:
    t = res.timings
    servers = t.get("server_start_to_healthy_s", 0.0)  # after the start exec returned: model load + /health
    rts = sum(s.get("round_trips", 0) for s in res.transport.values())
    execs = sum(s.get("execs", 0) for s in res.transport.values())
    return {
        "wall_s": round(res.wall_s, 3),
        "servers_start_to_ready_s": round(servers, 3),
        "llama_server_start_to_healthy_s": round(t.get("server_start_to_healthy_s", 0.0), 3),
        "rpc_restart_exec_s": round(t.get("rpc_restart_to_listening_s", 0.0), 3),  # stop+switch+start+listen, one exec
        "pairctl_own_s": round(res.wall_s - servers, 3),
        "pairctl_parts_s": {k: round(v, 3) for k, v in t.items() if k != "server_start_to_healthy_s"},
        "steps_s": {s["name"]: s["seconds"] for s in res.steps},
        "ssh_round_trips": rts,  # as the transport counts them: execs + SFTP requests + file puts/gets
        "ssh_execs": execs,  # each starts a process (and the login shell) on the host: the expensive kind
        "ssh_execs_by_host": {h: s.get("execs", 0) for h, s in res.transport.items()},
        "ssh_round_trips_by_host": {h: s.get("round_trips", 0) for h, s in res.transport.items()},
        "package_bytes_sent": sum(u.get("bytes_sent", 0) for u in res.uploads.values()),
        "receipt": res.receipt,
    }


def run() -> dict[str, Any]:
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lab.lab import Lab

    home = _home()
    inv = load_inventory(INVENTORY, {"PAIRCTL_HOME": str(home.root)})
    Lab(home, inv).up()
    a, b = _packages(home)
    _deploy(home, inv, a)  # start from A active (untimed)
    p = inv.pair(PAIR)
    for h in (p.native, p.rpc):  # B is new to the hosts: remove its release if an earlier run left it
        rel = Path(inv.host(h).install_root) / "releases" / b
        if rel.exists():
            shutil.rmtree(rel)
    fresh = _measure(_deploy(home, inv, b))
    uploaded = _measure(_deploy(home, inv, a))
    passed = (
        fresh["wall_s"] < FRESH_TARGET_S
        and uploaded["wall_s"] < UPLOADED_TARGET_S
        and uploaded["package_bytes_sent"] == 0
        and fresh["package_bytes_sent"] > 0
    )
    line = (
        f"deploy: fresh {fresh['wall_s']:.2f} s (servers {fresh['servers_start_to_ready_s']:.2f} s, "
        f"{fresh['ssh_execs']} execs/{fresh['ssh_round_trips']} round trips, {fresh['package_bytes_sent']} bytes) "
        f"target <{FRESH_TARGET_S:.0f} s; already uploaded {uploaded['wall_s']:.2f} s "
        f"({uploaded['ssh_execs']} execs/{uploaded['ssh_round_trips']} round trips, "
        f"{uploaded['package_bytes_sent']} bytes) "
        f"target <{UPLOADED_TARGET_S:.0f} s: {'PASS' if passed else 'FAIL'}"
    )
    return {
        "fresh": fresh,
        "uploaded": uploaded,
        "targets": {"fresh_s": FRESH_TARGET_S, "uploaded_s": UPLOADED_TARGET_S},
        "passed": passed,
        "line": line,
        "packages": {"A": a, "B": b},
        "pair": f"{INVENTORY}/{PAIR}",
        "load_average": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
