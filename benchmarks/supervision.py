"""Crash -> healthy without an operator (issue 18): the hosts' supervisors against a redeploy by hand.

On the lab pair (real llama-server + ggml-rpc-server, deployed by the engine), ROUNDS times each,
alternating: kill -9 llama-server, kill -9 ggml-rpc-server (both must come back: llama-server is
restarted once the RPC port listens again) and, fewer times, SIGSTOP llama-server (restarted as
hung after the inventory's `supervision.hang_after_s`). Each figure is the time from the signal
to a new pid of the killed service answering, and llama-server's /health answering 200. Side by
side in the same run: what an operator does without supervision, a redeploy of the same release
(`pairctl deploy`, acceptance skipped), timed from its start to its end. The lab inventory's
supervision values (0.2 s first backoff) set the floor; production defaults (1 s) add about 1 s.

Home: PAIRCTL_HOME, else the test session's home (.state/test). Needs the lab hosts (brought up
if needed) and the lab's baseline package (built if missing).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.deploy import _deploy, _home, _packages

ROUNDS = 5
HANG_ROUNDS = 2
WITHIN_S = 60.0


def _pid(root: Path, name: str) -> int | None:
    try:
        return int((root / "run" / f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _back(root: Path, name: str, old: int, url: str, t0: float) -> float:
    while time.monotonic() - t0 < WITHIN_S:
        new = _pid(root, name)
        if new is not None and new != old and _alive(new) and _healthy(url):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"{name} (pid {old}) not back and healthy within {WITHIN_S} s")


def _fault(root: Path, name: str, sig: int, url: str) -> float:
    old = _pid(root, name)
    if old is None or not _alive(old):
        raise RuntimeError(f"{name} is not running under {root}")
    t0 = time.monotonic()
    os.kill(old, sig)
    took = _back(root, name, old, url, t0)
    time.sleep(0.5)  # let the supervisor settle (its state file) before the next fault
    return took


def run() -> dict[str, Any]:
    from orchestrator.config.inventory import load_inventory
    from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER
    from orchestrator.lab.lab import Lab

    home = _home()
    inv = load_inventory("lab", {"PAIRCTL_HOME": str(home.root)})
    Lab(home, inv).up()
    pkg, _ = _packages(home)
    _deploy(home, inv, pkg)  # start from the baseline active (untimed)
    p = inv.pair("lab")
    nroot, rroot = Path(inv.host(p.native).install_root), Path(inv.host(p.rpc).install_root)
    url = f"http://{inv.host(p.native).address}:{p.server_port}"
    rows: dict[str, list[float]] = {"kill_llama_server": [], "kill_rpc_server": [], "redeploy_by_hand": []}
    for _ in range(ROUNDS):
        rows["kill_llama_server"].append(_fault(nroot, LLAMA_SERVER, signal.SIGKILL, url))
        rows["kill_rpc_server"].append(_fault(rroot, RPC_SERVER, signal.SIGKILL, url))
        res = _deploy(home, inv, pkg)  # the operator's way back, same release (already uploaded)
        rows["redeploy_by_hand"].append(res.wall_s)
    rows["sigstop_llama_server"] = [_fault(nroot, LLAMA_SERVER, signal.SIGSTOP, url) for _ in range(HANG_ROUNDS)]
    med = {k: statistics.median(v) for k, v in rows.items()}
    sup = inv.supervision
    line = (
        f"supervision (lab pair): kill -9 llama-server -> healthy {med['kill_llama_server']:.2f} s, "
        f"kill -9 rpc-server -> both healthy {med['kill_rpc_server']:.2f} s, SIGSTOP -> restarted "
        f"{med['sigstop_llama_server']:.2f} s (hung after {sup.hang_after_s} s); a redeploy by hand "
        f"{med['redeploy_by_hand']:.2f} s ({med['redeploy_by_hand'] / med['kill_llama_server']:.1f}x the llama-server "
        f"recovery), and that only once someone notices"
    )
    return {
        "seconds": {k: [round(x, 3) for x in v] for k, v in rows.items()},
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "ratio_redeploy_vs_supervised_llama_server": round(med["redeploy_by_hand"] / med["kill_llama_server"], 2),
        "supervision": sup.model_dump(),
        "line": line,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
