"""One lab run of the lab plan with its sequential design on (issue 31, item 4).

The lab plan plus `sequential: {looks: 2, spending: bonferroni}`, given the pairs its gates need at
the last look's level (judged by the newest calibration line of benchmarks/results/qualify_noise.jsonl:
run this right after a qualify_noise chunk, on the same home), and the slowed candidate
(`--candidate-profile lab-draft-other`: every draft rejected) against the baseline. One JSON line per
run is appended to benchmarks/results/qualify_seq_lab.jsonl: which look decided, the pairs used,
every gate and the load average. About 5-10 minutes on the lab:

    PAIRCTL_HOME=HOME PAIRCTL_INVENTORY=INVENTORY nice .venv/bin/python -m benchmarks qualify_seq_lab
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LINES = REPO / "benchmarks" / "results" / "qualify_seq_lab.jsonl"
NOISE_LINES = REPO / "benchmarks" / "results" / "qualify_noise.jsonl"
MAX_PAIRS = int(os.environ.get("QUALIFY_SEQ_MAX_PAIRS", "20"))


def _calibration() -> dict[str, Any] | None:
    rows = [json.loads(x) for x in NOISE_LINES.read_text().splitlines() if x.strip()] if NOISE_LINES.exists() else []
    cals = [r for r in rows if r["kind"] == "calibration" and (r.get("calibration") or {}).get("families")]
    return cals[-1] if cals else None


def _plan(cal: dict[str, Any], dest: Path) -> tuple[Path | None, dict[str, Any]]:
    """The lab plan with the sequential design and the pairs its gates need (None: more than MAX_PAIRS)."""
    import yaml

    from orchestrator.config.loader import validate
    from orchestrator.qualify.calibration import needs
    from orchestrator.qualify.plan import QualifyPlan, load_plan

    src = load_plan("lab")
    data = yaml.safe_load(src.path.read_text())
    for f in data["fixtures"]:
        f["path"] = str(src.fixture_paths[f["name"]])
    data["sequential"] = {"looks": 2, "spending": "bonferroni"}
    plan = validate(QualifyPlan, data, source="seq plan")
    need = [g["needed_pairs"] for g in needs(plan, cal)]
    if any(n is None or n > MAX_PAIRS for n in need):
        return None, {"needed": need}
    data["pairs"] = max(plan.pairs, *need)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest, {"needed": need, "pairs": data["pairs"]}


def run() -> dict[str, Any]:
    from benchmarks.qualify_aa import _pairctl, _setup

    home = Path(os.environ.get("PAIRCTL_HOME") or REPO / ".state" / "test")
    os.environ["PAIRCTL_HOME"] = str(home)
    cal_row = _calibration()
    if cal_row is None:
        return {"line": "qualify_seq_lab: no calibration line in qualify_noise.jsonl (run qualify_noise first)"}
    pkg = _setup(home)
    with tempfile.TemporaryDirectory(prefix="qualify-seq-") as tmp:
        plan, sized = _plan(cal_row["calibration"], Path(tmp) / "lab-sequential.yaml")
        row: dict[str, Any] = {
            "calibration": cal_row["receipt"],
            "sized": sized,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if plan is not None:
            t0 = time.monotonic()
            code, out, err = _pairctl(
                home, "qualify", "--pair", "lab", "--baseline", pkg, pkg, "--candidate", pkg, pkg,
                "--plan", str(plan), "--candidate-profile", "lab-draft-other", "--calibration", cal_row["receipt"],
            )  # fmt: skip
            out = out or {}
            row |= {
                "kind": "slowed",
                "exit": code,
                "verdict": out.get("verdict"),
                "receipt": out.get("receipt"),
                "sequential": {
                    k: (out.get("sequential") or {}).get(k)
                    for k in (
                        "pairs_at",
                        "confidence_at",
                        "decided_at_look",
                        "pairs_used",
                        "stopped_early",
                        "looks_taken",
                    )
                },
                "gates": [
                    {k: g.get(k) for k in ("kind", "family", "verdict", "gain", "low", "high", "spread", "reason")}
                    for g in out.get("gates") or []
                ],
                "stderr": err if code not in (0, 1, 9) else "",
                "wall_s": round(time.monotonic() - t0, 1),
                "load_average": os.getloadavg(),
            }
        else:
            row |= {"kind": "too_noisy", "load_average": os.getloadavg()}
    LINES.parent.mkdir(parents=True, exist_ok=True)
    with LINES.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
    q = row.get("sequential") or {}
    row["line"] = (
        f"qualify_seq_lab: {row['kind']} exit {row.get('exit')}, verdict {row.get('verdict')}, looks at "
        f"{q.get('pairs_at')}, decided at look {q.get('decided_at_look')} ({q.get('pairs_used')} pairs"
        f"{', stopped early' if q.get('stopped_early') else ''})"
        if plan is not None
        else f"qualify_seq_lab: the calibration needs more than {MAX_PAIRS} pairs: {sized}"
    )
    return row
