"""The acceptance suite on the real model beside the tiny one (issue 28): wall time of
`pairctl accept` (every check) on profile `lab` (the generated 0.5 MB model) and `lab-real`
(SmolLM2-135M-Instruct, production shape), alternating, in one run on one machine, so the ratio
is measured side by side under the same load. Target: the real-model suite within 3 minutes.

Each round deploys the baseline on the profile (acceptance skipped; not timed) and then times
one `accept`. The machine's load average is recorded with every sample: the figures mean little
without it. Home: PAIRCTL_HOME, else the test session's (.state/test); inventory:
PAIRCTL_BENCH_INVENTORY (default `lab`). Rounds: PAIRCTL_BENCH_ROUNDS (default 2).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
INVENTORY = os.environ.get("PAIRCTL_BENCH_INVENTORY", "lab")
PAIR = os.environ.get("PAIRCTL_BENCH_PAIR", "lab")
ROUNDS = int(os.environ.get("PAIRCTL_BENCH_ROUNDS", "2"))
PROFILES = ("lab", "lab-real")
TARGET_S = 180.0


def _pairctl(home: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "orchestrator", "--home", home, "--inventory", INVENTORY, "--json", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PAIRCTL_HOME=home), timeout=3600)


def _baseline(home: str) -> str:
    from orchestrator.lab.source import BASELINE_TAG, ensure_source
    from orchestrator.paths import Home
    from tests.plugins.packages import build_package

    ensure_source(Home.resolve(home))
    return build_package(Path(home), BASELINE_TAG).id


def run() -> dict[str, Any]:
    home = os.environ.get("PAIRCTL_HOME") or str(REPO / ".state" / "test")
    pkg = _baseline(home)
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in PROFILES}
    for _ in range(ROUNDS):
        for profile in PROFILES:
            d = _pairctl(home, "deploy", "--pair", PAIR, "--native", pkg, "--rpc", pkg, "--profile", profile,
                         "--skip-accept")  # fmt: skip
            if d.returncode != 0:
                raise RuntimeError(f"deploy on {profile} failed (exit {d.returncode}): {d.stderr[-1500:]}")
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            a = _pairctl(home, "accept", "--pair", PAIR)
            wall = time.monotonic() - t0
            doc = json.loads(a.stdout) if a.stdout.strip().startswith("{") else {}
            samples[profile].append({
                "wall_s": round(wall, 1),
                "exit": a.returncode,
                "load_before": round(load, 2),
                "load_after": round(os.getloadavg()[0], 2),
                "checks": {c["name"]: [c["verdict"], c.get("duration_s")] for c in doc.get("checks", [])},
                "request_budget": doc.get("request_budget"),
            })  # fmt: skip
    med = {p: statistics.median(s["wall_s"] for s in samples[p]) for p in PROFILES}
    ratio = med["lab-real"] / med["lab"] if med["lab"] else None
    ok = all(s["exit"] == 0 for p in PROFILES for s in samples[p]) and med["lab-real"] <= TARGET_S
    return {
        "rounds": ROUNDS,
        "median_wall_s": med,
        "real_over_tiny": round(ratio, 2) if ratio else None,
        "target_s": TARGET_S,
        "passed": ok,
        "samples": samples,
        "line": (
            f"acceptance_real: whole suite median {med['lab-real']:.0f} s on the real model vs {med['lab']:.0f} s "
            f"on the tiny one ({ratio:.1f}x), target {TARGET_S:.0f} s: {'ok' if ok else 'MISSED'}"
        ),
    }
