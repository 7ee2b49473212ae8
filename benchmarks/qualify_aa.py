"""A/A qualifications on the lab with the calibrated plan (issue 22's "Done when").

The same package as baseline and candidate, `pairctl qualify --plan lab` again and again: every
difference is noise, so a 95% interval should exclude zero about once in twenty, the gain gate
should never pass, and a non-regression gate above the noise floor should not fail. Each run is
the real console script against the real lab pair (fresh activation per arm).

    PAIRCTL_HOME=/work/.state/qualify QUALIFY_AA_RUNS=5 \
        flock /work/.lab.lock .venv/bin/python -m benchmarks qualify_aa

runs a chunk of QUALIFY_AA_RUNS qualifications (default 5, about a minute each) and APPENDS one
JSON line per run to benchmarks/results/qualify_aa.jsonl, so 15 runs can be gathered in chunks
that each hold the lab lock for a few minutes. Before the first run of a chunk the plan's A/A
calibration is looked up and, when there is none for this pair/package/profile/plan
measurement, measured (`pairctl qualify --calibrate`, appended as a `calibration` line); the
runs use the lab plan given the pairs that calibration says its gates need (the "calibrated
plan", as the e2e tests size it; a `too_noisy` line when that is more than MAX_PAIRS).
`QUALIFY_AA_SUMMARY_ONLY=1` only recomputes the summary from the lines. The summary (every
line so far) is what `run()` returns, written by `python -m benchmarks` to
benchmarks/results/qualify_aa.json. Afterwards the lab is left up (stop it with `pairctl lab down`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LINES = REPO / "benchmarks" / "results" / "qualify_aa.jsonl"
PAIR = "lab"
PLAN = os.environ.get("QUALIFY_AA_PLAN", "lab")
MAX_PAIRS = 16  # as the e2e tests: beyond that the lab is too noisy for the plan's gates


def _home() -> Path:
    root = os.environ.get("PAIRCTL_HOME") or str(REPO / ".state" / "test")
    os.environ["PAIRCTL_HOME"] = root
    return Path(root)


def _plan_key() -> str:
    """The lab plan's measurement key: what a calibration and the sized plans share."""
    from orchestrator.qualify.plan import load_plan

    return load_plan(PLAN).plan.measurement_key()


def _append(row: dict[str, Any]) -> None:
    """One line per run, naming the plan it ran (the summary counts the current plan's lines)."""
    row = {**row, "measurement_key": _plan_key()}
    LINES.parent.mkdir(parents=True, exist_ok=True)
    with LINES.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def _pairctl(home: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    from tests.plugins.packages import run_pairctl

    p = run_pairctl(home, "--json", *args, timeout=900)
    try:
        out = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        out = None
    return p.returncode, out, p.stderr[-2000:]


def _setup(home: Path) -> str:
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lab.lab import Lab
    from orchestrator.lab.source import BASELINE_TAG, ensure_source
    from orchestrator.paths import Home
    from tests.plugins.packages import build_package

    h = Home.resolve(str(home))
    # PAIRCTL_INVENTORY (name or file): a developer's own lab on other addresses, as the lab fixture's
    # PAIRCTL_TEST_LAB_INVENTORY; the child `pairctl` commands read the same variable.
    inv = load_inventory(os.environ.get("PAIRCTL_INVENTORY") or "lab", {"PAIRCTL_HOME": str(home)})
    Lab(h, inv).up()
    ensure_source(h)
    pkg = build_package(home, BASELINE_TAG).id
    code, out, err = _pairctl(home, "status", "--pair", PAIR)
    active = ((out or {}).get("route") or {}).get("active_packages")  # no route record yet: None
    if active != [pkg, pkg]:
        code, out, err = _pairctl(
            home, "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", "lab", "--skip-accept"
        )
        if code != 0:
            raise RuntimeError(f"deploying {pkg} failed (exit {code}): {err}")
    return pkg


def _calibration_row(code: int, out: dict[str, Any] | None, err: str) -> dict[str, Any]:
    cal = (out or {}).get("calibration") or {}
    return {
        "kind": "calibration",
        "exit": code,
        "receipt": (out or {}).get("receipt"),
        "reason": (out or {}).get("reason"),
        "families": cal.get("families"),
        "gates": cal.get("gates"),
        "dispersion": cal.get("dispersion"),
        "aa_gates": cal.get("aa_gates"),
        "stderr": err if code not in (0, 9) else "",
        "load_average": os.getloadavg(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _run_row(code: int, out: dict[str, Any] | None, err: str, pkg: str, wall: float) -> dict[str, Any]:
    out = out or {}
    cells = {}
    for c in out.get("cells") or []:
        tg = c.get("tg") or {}
        iv, bs = tg.get("interval") or {}, tg.get("bootstrap") or {}
        cells[c["family"]] = {
            "gain": tg.get("gain"),
            "t_low": iv.get("low"),
            "t_high": iv.get("high"),
            "sd_log": iv.get("sd_log"),
            "boot_low": bs.get("low"),
            "boot_high": bs.get("high"),
            "valid_pairs": c.get("valid_pair_count"),
            "t_excludes_zero": None if not iv else not (iv["low"] <= 0 <= iv["high"]),
            "boot_excludes_zero": None if not bs else not (bs["low"] <= 0 <= bs["high"]),
        }
    return {
        "kind": "aa",
        "exit": code,
        "verdict": out.get("verdict"),
        "receipt": out.get("receipt"),
        "package": pkg,
        "gates": [
            {
                k: g.get(k)
                for k in (
                    "kind",
                    "family",
                    "threshold",
                    "verdict",
                    "low",
                    "high",
                    "bootstrap_low",
                    "bootstrap_high",
                    "gain",
                )
            }
            for g in out.get("gates") or []
        ],
        "cells": cells,
        "noise": out.get("noise"),
        "invalid": len(out.get("samples_invalid") or []),
        "stderr": err if code not in (0, 1, 9) else "",
        "wall_s": round(wall, 1),
        "load_average": os.getloadavg(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def summary() -> dict[str, Any]:
    every = [json.loads(x) for x in LINES.read_text().splitlines() if x.strip()] if LINES.exists() else []
    plan = _plan_key()
    rows = [r for r in every if r.get("measurement_key") == plan]
    aa = [r for r in rows if r["kind"] == "aa" and r.get("verdict")]
    cals = [r for r in rows if r["kind"] == "calibration"]
    fams = [(r, f, c) for r in aa for f, c in r["cells"].items() if f != "combined"]
    gates = [g for r in aa for g in r["gates"]]
    out = {
        "measurement_key": plan,
        "pairs_per_run": sorted({r.get("pairs") for r in aa if r.get("pairs")}),
        "lines_of_other_plans": len(every) - len(rows),
        "runs": len(aa),
        "refused_or_errored": len([r for r in rows if r["kind"] == "aa" and not r.get("verdict")]),
        "family_intervals": len(fams),
        "t_intervals_excluding_zero": sum(1 for _, _, c in fams if c["t_excludes_zero"]),
        "bootstrap_intervals_excluding_zero": sum(1 for _, _, c in fams if c["boot_excludes_zero"]),
        "gain_gate_passes": sum(1 for g in gates if g["kind"] == "gain" and g["verdict"] == "pass"),
        "gain_gates": sum(1 for g in gates if g["kind"] == "gain"),
        "non_regression_fails": sum(1 for g in gates if g["kind"] == "non_regression" and g["verdict"] == "fail"),
        "non_regression_gates": sum(1 for g in gates if g["kind"] == "non_regression"),
        "verdicts": {v: sum(1 for r in aa if r["verdict"] == v) for v in ("pass", "fail", "inconclusive")},
        "calibrations": [
            {
                "receipt": c["receipt"],
                "families": {
                    f: {"sigma": v["sigma"], "sigma_upper": v["sigma_upper"], "pairs": v["pairs"]}
                    for f, v in (c["families"] or {}).items()
                },
                "needed": {f"{g['kind']}[{g['family']}]": g["needed_pairs"] for g in c["gates"] or []},
                "exit": c["exit"],
                "at": c["at"],
            }
            for c in cals
        ],
        "judged_by": sorted({(r.get("noise") or {}).get("receipt") or "none" for r in aa}),
        "noise_floor": {
            f: sorted(
                {v["sigma"] for r in aa for ff, v in ((r.get("noise") or {}).get("families") or {}).items() if ff == f}
            )
            for f in ("code", "prose", "combined")
        },
        "per_run_sd_log": {f: [c["sd_log"] for _, ff, c in fams if ff == f] for f in sorted({f for _, f, _ in fams})},
        "load_average": [r["load_average"][0] for r in aa],
    }
    out["line"] = (
        f"qualify A/A: {out['runs']} runs, {out['t_intervals_excluding_zero']}/{out['family_intervals']} Student-t "
        f"family intervals exclude 0 (bootstrap: {out['bootstrap_intervals_excluding_zero']}), gain gate passed "
        f"{out['gain_gate_passes']}/{out['gain_gates']}, non-regression failed "
        f"{out['non_regression_fails']}/{out['non_regression_gates']}"
    )
    return out


def _sized_plan(home: Path, pkg: str, dest: Path) -> tuple[Path | None, str, dict[str, Any] | None]:
    """The lab plan with the pairs its newest calibration says the gates need (as the e2e tests
    size it), or None with the reason when the noise needs more than MAX_PAIRS."""
    import yaml

    from orchestrator.config.profiles import load_profile
    from orchestrator.evidence.store import EvidenceStore
    from orchestrator.paths import Home
    from orchestrator.qualify.calibration import find_calibration, needs, profile_key
    from orchestrator.qualify.plan import load_plan

    src = load_plan(PLAN)
    store = EvidenceStore(Home.resolve(str(home)).evidence)
    found = find_calibration(
        store,
        pair=PAIR,
        plan=src.plan,
        profile_sha256=profile_key(load_profile("lab")),
        baseline={"native": pkg, "rpc": pkg},
    )
    if found is None:
        return None, "no calibration", None
    needed = [g["needed_pairs"] for g in needs(src.plan, found[1])]
    if any(n is None or n > MAX_PAIRS for n in needed):
        return None, f"calibration {found[0][:16]}: pairs needed {needed} > {MAX_PAIRS}", found[1]
    data = yaml.safe_load(src.path.read_text())
    for f in data["fixtures"]:
        f["path"] = str(src.fixture_paths[f["name"]])
    data["pairs"] = max(src.plan.pairs, *needed)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest, f"calibration {found[0][:16]}: {data['pairs']} pairs", found[1]


def run() -> dict[str, Any]:
    import tempfile

    if os.environ.get("QUALIFY_AA_SUMMARY_ONLY"):
        return summary()
    home = _home()
    runs = int(os.environ.get("QUALIFY_AA_RUNS", "5"))
    pkg = _setup(home)
    with tempfile.TemporaryDirectory(prefix="qualify-aa-") as tmp:
        dest = Path(tmp) / "lab-calibrated.yaml"
        plan, why, _cal = _sized_plan(home, pkg, dest)
        if plan is None and why == "no calibration":  # none recorded for this setup yet: measure it
            c_code, c_out, c_err = _pairctl(
                home, "qualify", "--calibrate", "--pair", PAIR, "--baseline", pkg, pkg, "--plan", PLAN
            )
            _append(_calibration_row(c_code, c_out, c_err))
            plan, why, _cal = _sized_plan(home, pkg, dest)
        if plan is None:
            _append({"kind": "too_noisy", "reason": why, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            return summary()
        pairs = yaml_pairs(plan)
        for _ in range(runs):
            t0 = time.monotonic()
            code, out, err = _pairctl(
                home, "qualify", "--pair", PAIR, "--baseline", pkg, pkg, "--candidate", pkg, pkg, "--plan", str(plan)
            )
            _append({**_run_row(code, out, err, pkg, time.monotonic() - t0), "pairs": pairs, "sized_by": why})
    return summary()


def yaml_pairs(plan: Path) -> int:
    import yaml

    return int(yaml.safe_load(plan.read_text())["pairs"])
