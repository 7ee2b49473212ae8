"""The test suite's own numbers (issue 45): wall time per tier and the slowest tests.

`python -m benchmarks suite` reads what the last runs of `make check`, `make test` and `make
test-unit` kept under `.state/runs/<run>/` (`junit.xml` from pytest's `--junitxml`,
`durations.json` from tests/plugins/durations.py) and prints, for each run: its wall time, the
machine's load when it ended, pass/fail/skip counts, the wall and CPU seconds per tier (the marker
groups of tests/plugins/durations.py: unit, unit_slow, integration, e2e, faults, mutants, real_model,
install), the 20 slowest tests, and the tests whose CPU time grew by more than half against the
run before (`durations.prev.json`). CPU seconds are kept because the machine is shared: wall time
moves with the neighbours' load, a test's own CPU much less.

SUITE_RUNS=DIR reads another folder (default: `.state/runs` of this checkout). Nothing runs a test
here; the numbers are those of the runs as they happened.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SLOWEST = 20
GREW = 1.5  # CPU ratio against the previous run that is worth a line
GREW_MIN_S = 0.5  # ...for tests that take at least this much CPU


def _runs_dir() -> Path:
    return Path(os.environ.get("SUITE_RUNS") or REPO / ".state" / "runs")


def junit_counts(path: Path) -> dict[str, Any]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time_s": 0.0}
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(s.get(k, 0))
        out["time_s"] += float(s.get("time", 0.0))
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    out["time_s"] = round(out["time_s"], 1)
    return out


def per_tier(tests: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Tests, wall, CPU and (where the durations file has it) the whole process tree's CPU per tier."""
    keys = ("wall_s", "cpu_s", "tree_cpu_s")
    tiers: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, **dict.fromkeys(keys, 0.0)})
    for row in tests.values():
        t = tiers[row.get("tier", "other")]
        t["tests"] += 1
        for k in keys:
            t[k] += row.get(k, 0.0)
    return {k: {"tests": int(v["tests"]), **{f: round(v[f], 1) for f in keys}}
            for k, v in sorted(tiers.items(), key=lambda kv: -kv[1]["wall_s"])}  # fmt: skip


def slowest(tests: dict[str, dict[str, Any]], n: int = SLOWEST) -> list[dict[str, Any]]:
    rows = sorted(tests.items(), key=lambda kv: -kv[1].get("wall_s", 0.0))[:n]
    return [{"test": k, **{f: v[f] for f in ("wall_s", "cpu_s", "tier", "outcome") if f in v}} for k, v in rows]


def grew(now: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for k, row in now.items():
        old = before.get(k)
        if not old or row.get("outcome") != "passed" or old.get("outcome") != "passed":
            continue
        cpu, cpu0 = row.get("cpu_s", 0.0), old.get("cpu_s", 0.0)
        if cpu >= GREW_MIN_S and cpu > GREW * max(cpu0, 0.01):
            out.append({"test": k, "cpu_s": cpu, "cpu_s_before": cpu0, "wall_s": row.get("wall_s"),
                        "wall_s_before": old.get("wall_s")})  # fmt: skip
    return sorted(out, key=lambda r: -(r["cpu_s"] - r["cpu_s_before"]))


def read_run(folder: Path) -> dict[str, Any] | None:
    dur = folder / "durations.json"
    if not dur.is_file():
        return None
    doc = json.loads(dur.read_text(encoding="utf-8"))
    tests: dict[str, dict[str, Any]] = doc.get("tests", {})
    run: dict[str, Any] = {k: doc.get(k) for k in ("started_at", "ended_at", "wall_s", "exitstatus", "markexpr",
                                                   "loadavg_end", "cpus", "host")}  # fmt: skip
    run["cpu_s"] = round(sum(r.get("cpu_s", 0.0) for r in tests.values()), 1)
    if (folder / "junit.xml").is_file():
        run["junit"] = junit_counts(folder / "junit.xml")
    run["tiers"] = per_tier(tests)
    run["slowest"] = slowest(tests)
    prev = folder / "durations.prev.json"
    if prev.is_file():
        before = json.loads(prev.read_text(encoding="utf-8"))
        run["previous_started_at"] = before.get("started_at")
        run["cpu_grew"] = grew(tests, before.get("tests", {}))
    return run


def _mmss(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s"


def render(name: str, run: dict[str, Any]) -> list[str]:
    j = run.get("junit") or {}
    load = run.get("loadavg_end") or []
    lines = [
        f"== {name}: {_mmss(run['wall_s'])} wall, {run['cpu_s']} s test CPU, started {run['started_at']}, "
        f"load at end {'/'.join(str(x) for x in load)} on {run.get('cpus')} cpus, exit {run['exitstatus']}"
        + (f", -m {run['markexpr']!r}" if run.get("markexpr") else ""),
    ]
    if j:
        lines.append(f"   {j['tests']} tests: {j['passed']} passed, {j['failures']} failed, {j['errors']} errors, "
                     f"{j['skipped']} skipped")  # fmt: skip
    # the tests' own seconds added up: the run's wall time when serial, more than it under xdist
    # tree cpu s: pytest's and every process it started, servers and sshd included (0: not measured)
    lines.append(f"   {'tier':<12} {'tests':>6} {'sum wall':>9} {'cpu s':>8} {'tree cpu s':>10}")
    for tier, t in run["tiers"].items():
        lines.append(f"   {tier:<12} {t['tests']:>6} {_mmss(t['wall_s']):>9} {t['cpu_s']:>8} {t['tree_cpu_s']:>10}")
    lines.append(f"   slowest {len(run['slowest'])} (wall s, cpu s, tier):")
    for r in run["slowest"]:
        lines.append(f"   {r['wall_s']:8.2f} {r.get('cpu_s', 0.0):7.2f}  {r.get('tier', '?'):<11} {r['test']}")
    if run.get("cpu_grew"):
        lines.append(f"   CPU grew by more than {GREW}x since {run.get('previous_started_at')}:")
        for r in run["cpu_grew"][:SLOWEST]:
            lines.append(f"   {r['cpu_s_before']:7.2f} -> {r['cpu_s']:7.2f} cpu s  {r['test']}")
    return lines


def run() -> dict[str, Any]:
    runs_dir = _runs_dir()
    runs = {}
    for folder in sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []:
        got = read_run(folder)
        if got is not None:
            runs[folder.name] = got
    if not runs:
        return {"runs": {}, "line": f"suite: no run recorded under {runs_dir} (run `make check` or `make test`)"}
    for name, r in runs.items():
        print("\n".join(render(name, r)))
    line = "suite: " + "; ".join(
        f"{name} {_mmss(r['wall_s'])} ({(r.get('junit') or {}).get('tests', len(r['slowest']))} tests, "
        f"load {(r.get('loadavg_end') or ['?'])[0]})"
        for name, r in runs.items()
    )
    return {"runs_dir": str(runs_dir), "runs": runs, "line": line}
