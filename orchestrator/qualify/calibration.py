"""A/A calibration (`qualify --calibrate`: the baseline in both arms, every difference noise): the
noise floor per family and the pairs each gate needs for its power. A qualification looks up the
newest matching calibration (pair, baseline, profile, measurement key) and refuses a gate needing
more pairs than the plan has before the first sample (exit 9): its verdict would be a coin toss."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from orchestrator.config.profiles import RouteProfile
from orchestrator.errors import ConfigError, Inconclusive
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import sha256_json
from orchestrator.qualify.analysis import QualifyResult
from orchestrator.qualify.plan import ALL, QualifyPlan
from orchestrator.qualify.power import MAX_PAIRS, Noise, estimate_noise, required_pairs, resolution

MIN_CALIBRATION_PAIRS = 3  # per family: fewer valid A/A pairs measure no trustworthy spread


def profile_key(profile: RouteProfile) -> str:
    return sha256_json(profile.model_dump(mode="json"))


def calibration_of(
    plan: QualifyPlan, result: QualifyResult, profile_sha256: str, baseline: dict[str, str], pair: str
) -> dict[str, Any]:
    """The calibration record of an A/A result: noise per cell (families and combined) and what
    every gate of `plan` needs at that noise."""
    upper = plan.calibration.upper_confidence if plan.calibration else 0.8
    families: dict[str, Any] = {}
    problems: list[str] = []
    for c in result.cells:
        if c.tg is None or c.tg.n < MIN_CALIBRATION_PAIRS:
            problems.append(
                f"{c.family}: {0 if c.tg is None else c.tg.n} valid A/A pairs, "
                f"at least {MIN_CALIBRATION_PAIRS} are needed to measure the noise"
            )
            continue
        families[c.family] = asdict(estimate_noise(np.log(c.tg.ratios).tolist(), upper_confidence=upper))
    record: dict[str, Any] = {"pair": pair, "baseline": baseline, "profile_sha256": profile_sha256}
    record.update(measurement_key=plan.measurement_key(), pairs=len(next((c.valid_pairs for c in result.cells), [])))
    record.update(families=families, problems=problems, dispersion=_dispersion(result))
    record["aa_gates"] = [{"kind": g.kind, "family": g.family, "verdict": g.verdict} for g in result.gates]
    record["gates"] = needs(plan, record)
    return record


def needs(plan: QualifyPlan, calibration: dict[str, Any]) -> list[dict[str, Any]]:
    """Per gate (a '*' gate once per family): the pairs it needs for its power at the measured noise
    (None: more than MAX_PAIRS, or no noise measured) and whether the plan's pairs reach that."""
    fams = calibration.get("families") or {}
    floored = plan.calibration is not None and plan.calibration.floor == "sigma_upper"
    out = []
    for g in plan.gates:
        for fam in plan.families if g.family == ALL else [g.family]:
            power = g.power if g.power is not None else plan.power
            n = fams.get(fam)
            need = None
            if n is not None:
                floor = n["sigma_upper"] if floored else None
                args = (g.kind, g.threshold, g.design_gain, n["sigma_upper"], power)
                need = required_pairs(*args, confidence=plan.confidence, floor=floor)
            row = {"kind": g.kind, "family": fam, "threshold": g.threshold, "power_at": g.design_gain, "power": power}
            row.update(sigma=None if n is None else n["sigma"], sigma_upper=None if n is None else n["sigma_upper"])
            row.update(needed_pairs=need, max_pairs=MAX_PAIRS, plan_pairs=plan.pairs)
            row["resolvable"] = need is not None and need <= plan.pairs
            row["half_width_at_plan"] = None if n is None else resolution(n["sigma"], plan.pairs, plan.confidence)
            # the narrowest deciding half-width a run may have (its sd floored at sigma_upper)
            row["floor"] = "sigma_upper" if floored else "none"
            floored_sd = n["sigma_upper"] if n is not None and floored else None
            row["min_half_width_at_plan"] = (
                None if floored_sd is None else resolution(floored_sd, plan.pairs, plan.confidence)
            )
            out.append(row)
    return out


def calibration_outcome(cal: dict[str, Any], stopped_early: str | None) -> tuple[str, str]:
    """Passed when every family's noise was measured and every gate is resolvable at the plan's
    pairs; else inconclusive (exit 9)."""
    floor = ", ".join(f"{fam} {100 * v['sigma']:.2f}%" for fam, v in cal["families"].items())
    short = [g for g in cal["gates"] if not g["resolvable"]]
    if stopped_early or cal["problems"]:
        return "inconclusive", f"calibration incomplete: {stopped_early or '; '.join(cal['problems'])}"
    if short:
        return "inconclusive", f"noise floor (sd of per-pair log TG ratio) {floor}; " + refusal_text(short)
    return (
        "passed",
        f"noise floor (sd of per-pair log TG ratio) {floor}; every gate resolvable at "
        f"{cal['gates'][0]['plan_pairs'] if cal['gates'] else '?'} pairs ("
        + ", ".join(f"{g['kind']}[{g['family']}] needs {g['needed_pairs']}" for g in cal["gates"])
        + ")",
    )


def refusal_text(short: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{g['kind']}[{g['family']}] {100 * g['threshold']:+.2f}% needs "
        + (
            f"{g['needed_pairs']} pairs"
            if g["needed_pairs"] is not None
            else (f"more than {g['max_pairs']} pairs" if g["sigma"] is not None else "a measured noise")
        )
        + f" for power {g['power']} at {100 * g['power_at']:+.2f}%"
        + (
            ""
            if g["sigma"] is None
            else f" (noise sd {100 * g['sigma']:.2f}%, planned on {100 * g['sigma_upper']:.2f}%)"
        )
        + f", the plan has {g['plan_pairs']}"
        for g in short
    )


def find_calibration(
    store: EvidenceStore,
    *,
    pair: str,
    plan: QualifyPlan,
    profile_sha256: str,
    baseline: dict[str, str],
    ref: str | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """The newest calibration receipt matching this pair, baseline, profile and plan measurement
    (or the one named by `ref`, which must match too)."""
    want = dict(pair=pair, baseline=baseline, profile_sha256=profile_sha256, measurement_key=plan.measurement_key())
    if ref is not None:
        sha = store.resolve(ref)
        r = store.load(sha)
        cal = r.extra_fields().get("calibration")
        if not isinstance(cal, dict):
            raise ConfigError(
                f"receipt {sha[:16]} is not a calibration (no `calibration` field)",
                hint="pass a receipt written by `pairctl qualify --calibrate`",
            )
        diff = [k for k, v in want.items() if cal.get(k) != v]
        if diff:
            raise ConfigError(
                f"calibration {sha[:16]} was measured with a different {', '.join(diff)}",
                hint="calibrate this pair, baseline, profile and plan: `pairctl qualify --calibrate ...`",
            )
        return sha, cal
    found: tuple[str, dict[str, Any]] | None = None
    for summary in store.summaries(None):  # oldest first: the last match is the newest
        if summary.get("command") != "qualify" or summary.get("outcome") not in ("passed", "inconclusive"):
            continue
        r = store.load(summary["hash"])
        cal = r.extra_fields().get("calibration")
        if isinstance(cal, dict) and all(cal.get(k) == v for k, v in want.items()) and cal.get("families"):
            found = (str(summary["hash"]), cal)
    return found


def judge(plan: QualifyPlan, found: tuple[str, dict[str, Any]] | None, *, calibrate_hint: str) -> dict[str, Any] | None:
    """Before any host is touched: the noise record the run is judged by, or a refusal: no required
    calibration, ConfigError (exit 3); a gate that cannot reach its power, Inconclusive (exit 9)."""

    if plan.calibration is None:
        return None
    if found is None:
        if plan.calibration.required:
            raise ConfigError(
                f"plan {plan.name} needs an A/A calibration of this pair, baseline, profile and plan "
                "measurement, and none is recorded",
                hint=calibrate_hint,
            )
        return None
    sha, cal = found
    gates = needs(plan, cal)
    noise = {"receipt": sha, "pairs": cal.get("pairs"), "families": cal["families"], "gates": gates}
    short = [g for g in gates if not g["resolvable"]]
    if short:
        raise Inconclusive(
            f"plan {plan.name} refused before the first sample: at the noise measured by calibration "
            f"{sha[:16]}, " + refusal_text(short),
            hint="give the plan more pairs (or more repeats, then calibrate again), widen the gate, "
            "or calibrate again on a quieter pair",
        )
    return noise


def _dispersion(result: QualifyResult) -> dict[str, float | None]:
    d = sorted(a["dispersion"] for a in result.arms if a.get("dispersion") is not None)
    return {"median": d[len(d) // 2] if d else None, "max": d[-1] if d else None}


__all__ = ["Noise", "calibration_of", "calibration_outcome", "find_calibration", "judge", "needs", "profile_key"]
