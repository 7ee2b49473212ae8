"""Issue 31 item 4 by simulation: the sequential design's error rates and pairs used, against a fixed run.

The plan of benchmarks/qualify_sim.py (lab shape, random order, calibrated floor; +5% gain gate with
power 0.8 at +30%, -20% non-regression with power 0.9 at 0) given 12 pairs, run fixed or with
`sequential: {looks: 3}` (looks at 4, 8, 12 pairs) under each spending; per noise model of
tests/unit/qualify_sim.py, seeded runs each judged by its own simulated calibration as the command
does (a plan its calibration cannot resolve at the last look's level is refused, exit 9), through
the real `analyze` (which takes the looks). Three truths: identical code (false gain passes,
non-regression fails), a +30% candidate (gain passes), a -40% candidate (runs that fail, and missed
regressions: non-regression gates that pass). Rates per gate except "run fails"; a run stopped by one
decisive fail leaves its other gates undecided (inconclusive), so per run is the measure there. Pure CPU:

    nice .venv/bin/python -m benchmarks qualify_seq_sim    # QUALIFY_SEQ_SIM_RUNS (default 200)

writes benchmarks/results/qualify_seq_sim.json; `python -m benchmarks.qualify_seq_sim` prints the table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULT = REPO / "benchmarks" / "results" / "qualify_seq_sim.json"
PAIRS = 12
DESIGNS: tuple[tuple[str, dict[str, Any] | None], ...] = (
    ("fixed", None),
    ("bonferroni, 3 looks", {"looks": 3, "spending": "bonferroni"}),
    ("obrien-fleming, 3 looks", {"looks": 3, "spending": "obrien-fleming"}),
)
TRUTHS = (("aa", 0.0, 31), ("gain_30", 0.30, 32), ("slowed_40", -0.40, 33))


def _plan(design: dict[str, Any] | None):
    from benchmarks.qualify_sim import _plan as base
    from orchestrator.qualify.plan import Sequential

    plan = base("random").model_copy(update={"pairs": PAIRS})
    return plan.model_copy(update={"sequential": None if design is None else Sequential(**design)})


def _tally(plan: Any, model: Any, *, gain: float, runs: int, seed: int) -> dict[str, Any]:
    import numpy as np

    from orchestrator.errors import Inconclusive
    from tests.unit import qualify_sim as sim

    rng = np.random.default_rng(seed)
    t: dict[str, Any] = dict.fromkeys(
        ("runs", "refused", "gain_gates", "gain_pass", "nr_gates", "nr_fail", "nr_pass", "drift", "pairs_used"), 0
    )
    t["decided_at"] = {}
    for _ in range(runs):
        t["runs"] += 1
        try:
            noise = sim.calibrate(plan, model, rng, refuse=True)
        except Inconclusive:
            t["refused"] += 1
            continue
        r = sim.qualify(plan, model, rng, gain=gain, noise=noise)
        for g in r.gates:
            if g.kind == "gain":
                t["gain_gates"] += 1
                t["gain_pass"] += g.verdict == "pass"
            else:
                t["nr_gates"] += 1
                t["nr_fail"] += g.verdict == "fail"
                t["nr_pass"] += g.verdict == "pass"
        t["drift"] += bool(r.drift and r.drift["flagged"])
        t[f"run_{r.verdict}"] = t.get(f"run_{r.verdict}", 0) + 1
        used = r.sequential["pairs_used"] if r.sequential else plan.pairs
        t["pairs_used"] += used
        t["decided_at"][str(used)] = t["decided_at"].get(str(used), 0) + 1
    return t


def run() -> dict[str, Any]:
    from tests.unit import qualify_sim as sim

    runs = int(os.environ.get("QUALIFY_SEQ_SIM_RUNS", "200"))
    only = os.environ.get("QUALIFY_SEQ_SIM_MODELS")  # e.g. "iid,ar1": a part, to run parts side by side
    rows = []
    for m in (sim.IID, sim.AR1, sim.WAVE, sim.SLOW_WAVE):
        if only and m.name not in only.split(","):
            continue
        for name, design in DESIGNS:
            plan = _plan(design)
            row: dict[str, Any] = {"model": m.name, "design": name, "sequential": plan.sequential_design()}
            for key, gain, seed in TRUTHS:
                row[key] = _tally(plan, m, gain=gain, runs=runs if key == "aa" else runs // 2, seed=seed)
            rows.append(row)
    out = {"runs_per_cell": runs, "pairs": PAIRS, "rows": rows}
    dest = Path(os.environ.get("QUALIFY_SEQ_SIM_OUT") or RESULT)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    seq = [r for r in rows if r["design"] != "fixed"]
    worst = max(r["aa"]["gain_pass"] / max(r["aa"]["gain_gates"], 1) for r in seq)
    missed = sum(r["slowed_40"]["nr_pass"] for r in seq)
    out["line"] = (
        f"qualify seq sim: {len(rows)} cells x {runs} runs; sequential worst A/A gain-pass rate {worst:.3f}, "
        f"missed -40% regressions {missed}"
    )
    return out


def _pct(a: int, b: int) -> str:
    return "n/a" if not b else f"{100 * a / b:.1f}% ({a}/{b})"


def _mean_pairs(t: dict[str, Any]) -> str:
    decided = t["runs"] - t["refused"]
    return "n/a" if not decided else f"{t['pairs_used'] / decided:.1f}"


def table(path: Path = RESULT) -> str:
    data = json.loads(path.read_text())
    lines = [
        "| noise | design | refused | A/A: +5% gain passes | A/A: -20% nr fails | A/A: mean pairs "
        "| +30%: gain passes | +30%: mean pairs | -40%: run fails | -40%: nr gate passes (missed) | -40%: mean pairs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        a, g, s = r["aa"], r["gain_30"], r["slowed_40"]
        lines.append(
            f"| {r['model']} | {r['design']} | {a['refused']}/{a['runs']} | {_pct(a['gain_pass'], a['gain_gates'])} | "
            f"{_pct(a['nr_fail'], a['nr_gates'])} | {_mean_pairs(a)} | {_pct(g['gain_pass'], g['gain_gates'])} | "
            f"{_mean_pairs(g)} | {_pct(s.get('run_fail', 0), s['runs'] - s['refused'])} | "
            f"{_pct(s['nr_pass'], s['nr_gates'])} | "
            f"{_mean_pairs(s)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
