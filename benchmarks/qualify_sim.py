"""Issue 31's rates by simulation: the real analysis under correlated noise, each rule and order.

For each noise model of tests/unit/qualify_sim.py, each arm order (alternating B C C B, seeded
random) and each spread rule (the run's own sd; own floored at the calibration's sigma_upper),
`QUALIFY_SIM_RUNS` (default 200) seeded A/A qualifications, each judged by its own simulated
calibration exactly as the command does (a plan the calibration cannot resolve is refused, exit 9),
plus the same with a true +30% gain and a -40% candidate. Pure CPU, no lab:

    nice .venv/bin/python -m benchmarks qualify_sim

writes benchmarks/results/qualify_sim.json; `table()` renders the Markdown table in
docs/qualify-calibration.md from that file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "benchmarks" / "results" / "qualify_sim.json"


def _plan(order: str):
    from orchestrator.qualify.plan import Gate, load_plan
    from tests.unit import qualify_sim as sim

    lab = load_plan("lab").plan
    gates = [
        Gate(kind="gain", family="*", threshold=0.05, power_at=0.3),
        Gate(kind="non_regression", family="*", threshold=-0.2, power_at=0.0, power=0.9),
    ]
    return sim.fast(lab.model_copy(update={"order": order, "gates": gates}))


def _tally(plan: Any, model: Any, *, gain: float, runs: int, floor: bool, seed: int) -> dict[str, int]:
    import numpy as np

    from orchestrator.errors import Inconclusive
    from tests.unit import qualify_sim as sim

    rng = np.random.default_rng(seed)
    t = dict.fromkeys(
        (
            "runs",
            "refused",
            "gain_gates",
            "gain_pass",
            "nr_gates",
            "nr_fail",
            "nr_pass",
            "intervals",
            "excl",
            "drift",
            "calibrated",
        ),
        0,
    )
    for _ in range(runs):
        t["runs"] += 1
        try:
            noise = sim.calibrate(plan, model, rng, refuse=True)
        except Inconclusive:
            t["refused"] += 1
            continue
        r = sim.qualify(plan, model, rng, gain=gain, noise=noise, floor=floor)
        for g in r.gates:
            if g.kind == "gain":
                t["gain_gates"] += 1
                t["gain_pass"] += g.verdict == "pass"
            else:
                t["nr_gates"] += 1
                t["nr_fail"] += g.verdict == "fail"
                t["nr_pass"] += g.verdict == "pass"
            t["calibrated"] += g.spread == "calibrated"
        for c in r.cells:
            if c.family != "combined" and c.tg and c.tg.interval:
                t["intervals"] += 1
                t["excl"] += not (c.tg.interval.low <= 0 <= c.tg.interval.high)
        t["drift"] += bool(r.drift and r.drift["flagged"])
    return t


def run() -> dict[str, Any]:
    from tests.unit import qualify_sim as sim

    runs = int(os.environ.get("QUALIFY_SIM_RUNS", "200"))
    rows = []
    models = (sim.IID, *sim.CORRELATED, sim.STEP, sim.TREND)
    for order in ("alternating", "random"):
        plan = _plan(order)
        for m in models:
            for floor in (False, True):
                row = {"model": m.name, "order": order, "rule": "own+calibrated floor" if floor else "own only"}
                row["aa"] = _tally(plan, m, gain=0.0, runs=runs, floor=floor, seed=31)
                if order == "random" and floor:
                    row["gain_30"] = _tally(plan, m, gain=0.30, runs=runs // 2, floor=floor, seed=32)
                    row["slowed_40"] = _tally(plan, m, gain=-0.40, runs=runs // 2, floor=floor, seed=33)
                rows.append(row)
    out = {"runs_per_cell": runs, "models": [m.__dict__ for m in models], "rows": rows}
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    aa = [r for r in rows if r["order"] == "random" and r["rule"].startswith("own+")]
    worst = max(r["aa"]["gain_pass"] / max(r["aa"]["gain_gates"], 1) for r in aa if r["model"] != "confound")
    out["line"] = f"qualify sim: {len(rows)} cells x {runs} runs; worst A/A gain-pass rate (random, floor) {worst:.3f}"
    return out


def _pct(a: int, b: int) -> str:
    return "n/a" if not b else f"{100 * a / b:.1f}% ({a}/{b})"


def table(path: Path = RESULT) -> str:
    """Markdown: per model, order and rule, the A/A rates; then gains found and slowed candidates."""
    data = json.loads(path.read_text())
    lines = [
        "| noise | order | spread rule | refused (exit 9) | +5% gain gate passes | intervals excl. 0 "
        "| -20% non-regression fails | drift (exit 9) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        a = r["aa"]
        lines.append(
            f"| {r['model']} | {r['order']} | {r['rule']} | {a['refused']}/{a['runs']} | "
            f"{_pct(a['gain_pass'], a['gain_gates'])} | {_pct(a['excl'], a['intervals'])} | "
            f"{_pct(a['nr_fail'], a['nr_gates'])} | {a['drift']}/{a['runs'] - a['refused']} |"
        )
    lines += [
        "",
        "| noise (random order, floored) | +30%: gain gate passes | +30%: drift | -40%: non-regression fails "
        "| -40%: non-regression passes |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        if "gain_30" not in r:
            continue
        g, s = r["gain_30"], r["slowed_40"]
        lines.append(
            f"| {r['model']} | {_pct(g['gain_pass'], g['gain_gates'])} | {g['drift']}/{g['runs'] - g['refused']} | "
            f"{_pct(s['nr_fail'], s['nr_gates'])} | {s['nr_pass']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
