"""A rollout over the three lab3 pairs: `--serial 3` (one wave, pairs in parallel) vs `--serial 1`.

Each round deploys a revision on all three pairs through `ops.rollout.rollout` (the code behind
`pairctl deploy --rev REV --all`), acceptance skipped (identity verified), alternating the
baseline and lab-b so every pair really changes; the rounds run serial 3, 1, 1, 3 (ABBA, so a
drift in the machine's load hits both arms alike). Reported per round: wall time, the status
reads that decide skips, each wave's time, the sum of the pairs' own deploy times, and the
fleet's own overhead (wall minus the pairs' deploys: status reads, receipts, thread start-up),
also per pair. On 2 shared cores the parallel wave is bounded by CPU (each deploy hashes 47 MB
per host and starts two servers), so serial 3 is expected to gain less than 3x.

Home: PAIRCTL_HOME, else the test session's home (.state/test). Needs the lab3 hosts
(127.0.0.12-17; brought up if needed) and the lab's two packages (built if missing).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks.deploy import _home, _packages

ORDER = (3, 1, 1, 3)


def _round(home: Any, inv: Any, rev: str, serial: int) -> dict[str, Any]:
    from orchestrator.ops.revision import resolve_commit, resolve_packages
    from orchestrator.ops.rollout import RolloutOptions, rollout

    pairs = sorted(inv.pairs)
    commit = resolve_commit(home, rev)
    packages = resolve_packages(home, inv, pairs, rev, commit)
    res = rollout(
        home,
        inv,
        pairs,
        command="deploy",
        packages=packages,
        rev=rev,
        commit=commit,
        options=RolloutOptions(serial=serial, max_fail=len(pairs), skip_accept=True),
        argv=["benchmarks.rollout", rev, f"--serial={serial}"],
    )
    outcomes = {p.pair: p.outcome for p in res.pairs}
    if set(outcomes.values()) != {"passed"}:
        raise RuntimeError(f"rollout of {rev} with serial {serial}: {outcomes}")
    pair_s = {p.pair: round(p.wall_s, 3) for p in res.pairs}
    deploys = sum(pair_s.values()) if serial == 1 else sum(res.timings["waves_s"])
    overhead = res.wall_s - deploys
    return {
        "serial": serial,
        "rev": rev,
        "wall_s": round(res.wall_s, 3),
        "status_reads_s": res.timings["status_s"],
        "waves_s": res.timings["waves_s"],
        "pair_deploy_s": pair_s,
        "pair_deploy_sum_s": round(sum(pair_s.values()), 3),
        "fleet_overhead_s": round(overhead, 3),
        "fleet_overhead_per_pair_s": round(overhead / len(pairs), 3),
        "receipt": res.receipt,
    }


def run() -> dict[str, Any]:
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lab.lab import Lab
    from orchestrator.lab.source import BASELINE_TAG
    from tests.plugins.packages import REV_B_TAG

    home = _home()
    inv = load_inventory("lab3", {"PAIRCTL_HOME": str(home.root)})
    Lab(home, inv).up()
    _packages(home)
    revs = (REV_B_TAG, BASELINE_TAG)
    rounds = []
    # start from the baseline everywhere (untimed; pairs already on it are skipped by the rollout itself)
    from orchestrator.ops.revision import resolve_commit, resolve_packages
    from orchestrator.ops.rollout import RolloutOptions, rollout

    pairs = sorted(inv.pairs)
    commit = resolve_commit(home, BASELINE_TAG)
    rollout(
        home, inv, pairs, command="deploy", packages=resolve_packages(home, inv, pairs, BASELINE_TAG, commit),
        rev=BASELINE_TAG, commit=commit, options=RolloutOptions(serial=3, max_fail=3, skip_accept=True),
        argv=["benchmarks.rollout", "setup"],
    )  # fmt: skip
    for i, serial in enumerate(ORDER):
        rounds.append(_round(home, inv, revs[i % 2], serial))
    by = {s: [r for r in rounds if r["serial"] == s] for s in (3, 1)}
    med = {s: statistics.median(r["wall_s"] for r in by[s]) for s in by}
    over = {s: statistics.median(r["fleet_overhead_per_pair_s"] for r in by[s]) for s in by}
    speedup = med[1] / med[3]
    line = (
        f"rollout (3 lab3 pairs, acceptance skipped): serial 3 {med[3]:.2f} s vs serial 1 {med[1]:.2f} s "
        f"({speedup:.2f}x); fleet overhead per pair {over[1]:.2f} s (serial 1), {over[3]:.2f} s (serial 3)"
    )
    return {
        "rounds": rounds,
        "median_wall_s": {f"serial_{s}": round(v, 3) for s, v in med.items()},
        "speedup_serial3_vs_serial1": round(speedup, 3),
        "median_fleet_overhead_per_pair_s": {f"serial_{s}": round(v, 3) for s, v in over.items()},
        "line": line,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
