"""From raw samples to a qualification result: cells, gate verdicts, flags. Pure, on the samples
as the receipt stores them, so any receipt's result can be recomputed without a host.

An *arm value* is, per fixture, the median of the arm's `repeats` requests (all valid); an arm
whose dispersion (sd of log TG) exceeds `max_arm_dispersion` is invalid. A *cell* is a family (or
`combined`); a pair's family ratio is the geomean over its fixtures of candidate/baseline arm
values, and a pair counts for a cell only when every arm value it needs is valid in both arms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from statistics import median
from typing import Any, TypedDict

from orchestrator.qualify import drift as drift_checks
from orchestrator.qualify import sequential as seq
from orchestrator.qualify.gates import GateVerdict, decide, overall, under_drift
from orchestrator.qualify.plan import ALL, COMBINED, QualifyPlan
from orchestrator.qualify.stats import (
    DECIDING_METHOD,
    GainEstimate,
    acceptance_rate,
    at_least,
    combine_families,
    estimate_gain,
    geomean,
    robust_centre,
)


def sample_problem(s: dict[str, Any], n_predict: int) -> str | None:
    """Why a sample cannot be used, or None. Checked, never assumed: a short generation or a
    cached prompt would compare different work."""
    if not s.get("ok"):
        return f"request failed: {s.get('error') or 'unknown error'}"
    if s.get("predicted_n") != n_predict:
        return f"generated {s.get('predicted_n')} tokens, planned {n_predict}"
    if s.get("prompt_tokens") is not None and s.get("prompt_n") != s.get("prompt_tokens"):
        return f"the server evaluated {s.get('prompt_n')} prompt tokens, {s.get('prompt_tokens')} were sent"
    if (s.get("cache_n") or 0) != 0:
        return f"{s.get('cache_n')} prompt tokens came from the cache (cache_prompt must be off)"
    for k in ("predicted_per_second", "prompt_per_second", "wall_s", "ttft_s"):
        v = s.get(k)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return f"{k} is {v!r}"
    return None


@dataclass(frozen=True)
class Cell:
    family: str
    planned_pairs: int
    valid_pairs: list[int]
    tg: GainEstimate | None
    pp_ratio: float | None
    wall_ratio: float | None  # baseline wall / candidate wall: > 1 = candidate faster
    ttft_ratio: float | None  # baseline TTFT / candidate TTFT: > 1 = candidate faster
    memory_ratio: float | None  # candidate peak / baseline peak: > 1 = candidate uses more
    median_tg: dict[str, float | None] = field(default_factory=dict)
    acceptance: dict[str, float | None] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.valid_pairs) >= self.planned_pairs


@dataclass(frozen=True)
class FlagResult:
    metric: str
    family: str
    min_ratio: float
    ratio: float | None
    ok: bool | None  # None: not measurable


@dataclass(frozen=True)
class QualifyResult:
    verdict: str
    gates: list[GateVerdict]
    flags: list[FlagResult]
    cells: list[Cell]
    samples_total: int
    samples_invalid: list[dict[str, Any]]
    plan_name: str
    plan_sha256: str | None = None
    arms: list[dict[str, Any]] = field(default_factory=list)  # per pair/arm/fixture: repeats, median, dispersion
    deciding_method: str = DECIDING_METHOD
    noise: dict[str, Any] | None = None  # the calibration the run was judged by (set by the runner)
    rules: dict[str, Any] | None = None  # the decision rules recorded before the first sample (None: legacy)
    drift: dict[str, Any] | None = None  # trend of the baseline arms, own vs calibrated spread, verdict
    order: dict[str, Any] | None = None  # arm order, its seed, and the position effect per family
    sequential: dict[str, Any] | None = None  # the looks of a sequential design and which one decided

    def to_json(self) -> dict[str, Any]:
        def cell(c: Cell) -> dict[str, Any]:
            d = asdict(c)
            if c.tg is not None:
                iv, bs = c.tg.interval, c.tg.bootstrap
                tg = {"gain": c.tg.gain, "ratios": list(c.tg.ratios)}
                d["tg"] = {
                    **tg,
                    "interval": None if iv is None else asdict(iv),
                    "bootstrap": None if bs is None else asdict(bs),
                }
            d["valid_pair_count"] = len(c.valid_pairs)
            return d

        d = asdict(self)
        d["plan"], d["cells"] = d.pop("plan_name"), [cell(c) for c in self.cells]
        return d


RULES_VERSION = 31


def rules_for(plan: QualifyPlan, noise: dict[str, Any] | None, order_seed: int | None) -> dict[str, Any]:
    """What decides this run, recorded before the first sample (`qualify_rules`): the spread floor,
    the drift bounds, the arm order and its seed. A receipt without it is re-analysed as it was
    decided: own spread, no drift verdict."""
    floor = None if noise is None else (plan.calibration.floor if plan.calibration is not None else "none")
    rules = {
        "version": RULES_VERSION,
        "floor": floor,
        "drift": plan.drift.model_dump(mode="json"),
        "order": plan.order if isinstance(plan.order, str) else "explicit",
        "order_seed": order_seed,
    }
    design = plan.sequential_design()
    if design is not None:  # only when on: a receipt without it is a fixed run, as before
        rules["sequential"] = design
    return rules


def analyze(
    plan: QualifyPlan,
    samples: Iterable[dict[str, Any]],
    *,
    plan_sha256: str | None = None,
    noise: dict[str, Any] | None = None,
    rules: dict[str, Any] | None = None,
) -> QualifyResult:
    """The result of a run. Under a recorded sequential design the looks are taken in order on the
    first n_k pairs at their own confidence; the first that settles the gates (or the last the
    samples reach) is the result, saying which."""
    samples = list(samples)
    design = (rules or {}).get("sequential")
    if not design:
        return _analyze_fixed(plan, samples, plan_sha256=plan_sha256, noise=noise, rules=rules)
    pairs_at, conf_at = list(design["pairs_at"]), list(design["confidence_at"])
    measured = 1 + max((s["pair"] for s in samples if isinstance(s.get("pair"), int)), default=-1)
    looks: list[dict[str, Any]] = []
    for k, (n, conf) in enumerate(zip(pairs_at, conf_at, strict=True), start=1):
        sub = plan.model_copy(update={"pairs": n, "confidence": conf, "sequential": None})
        part = [s for s in samples if isinstance(s.get("pair"), int) and s["pair"] < n]
        res = _analyze_fixed(sub, part, plan_sha256=plan_sha256, noise=noise, rules=rules)
        stop = seq.settled(res.gates)
        seen = [{"kind": g.kind, "family": g.family, "verdict": g.verdict} for g in res.gates]
        looks.append({"look": k, "pairs": n, "confidence": conf, "settled": stop, "gates": seen})
        last = k == len(pairs_at)
        if stop or last or n >= measured:
            gates = [seq.at_look(g, k, len(pairs_at), n) for g in res.gates]
            info = {**design, "looks_taken": looks, "decided_at_look": k if (stop or last) else None, "pairs_used": n}
            info["stopped_early"] = stop and not last
            return replace(res, gates=gates, verdict=overall(gates), samples_total=len(samples), sequential=info)
    raise AssertionError("unreachable: the last look always returns")


def _analyze_fixed(
    plan: QualifyPlan,
    samples: list[dict[str, Any]],
    *,
    plan_sha256: str | None = None,
    noise: dict[str, Any] | None = None,
    rules: dict[str, Any] | None = None,
) -> QualifyResult:
    floors = _floors(noise, rules)
    fixtures_of = {fam: [f.name for f in plan.fixtures if f.family == fam] for fam in plan.families}
    invalid: list[dict[str, Any]] = []
    valid, arms = _arm_values(plan, _by_arm(plan, samples, invalid), invalid)
    # Identity: both arms must have measured the same prompt (same tokens), or the pair is not comparable.
    for (p, arm, fx), s in list(valid.items()):
        other = valid.get((p, "candidate" if arm == "baseline" else "baseline", fx))
        if other is not None and other.get("prompt_sha256") != s.get("prompt_sha256"):
            invalid.append(
                {"pair": p, "arm": arm, "fixture": fx, "problem": "prompt differs between the arms of this pair"}
            )
            del valid[(p, arm, fx)]

    def pair_ok(p: int, fam: str) -> bool:
        return all((p, a, fx) in valid for a in ("baseline", "candidate") for fx in fixtures_of[fam])

    def fam_ratio(p: int, fam: str, key: str, invert: bool = False) -> float:
        r = [valid[(p, "candidate", fx)][key] / valid[(p, "baseline", fx)][key] for fx in fixtures_of[fam]]
        g = geomean(r)
        return 1.0 / g if invert else g

    bs = plan.bootstrap
    boot = _Bootstrap(confidence=plan.confidence, exact_limit=bs.exact_limit, resamples=bs.resamples, seed=bs.seed)
    cells: list[Cell] = []
    for fam, fams in [*((f, [f]) for f in plan.families), (COMBINED, plan.families)]:  # each family, then all
        pairs = [p for p in range(plan.pairs) if all(pair_ok(p, f) for f in fams)]
        cells.append(_cell(fam, plan.pairs, pairs, fam_ratio, fams, valid, fixtures_of, boot, floors.get(fam)))
    by_family = {c.family: c for c in cells}

    gates: list[GateVerdict] = []
    for g in plan.gates:
        for fam in plan.families if g.family == ALL else [g.family]:
            c = by_family[fam]
            gates.append(
                decide(g.kind, fam, g.threshold, c.tg, valid_pairs=len(c.valid_pairs), planned_pairs=plan.pairs)
            )

    drift, order = _drift_and_order(plan, valid, cells, noise, rules)
    if drift["flagged"]:
        gates = [under_drift(g, "; ".join(drift["reasons"])) for g in gates]

    return QualifyResult(
        verdict=overall(gates),
        gates=gates,
        flags=_flags(plan, by_family),
        cells=cells,
        samples_total=len(samples),
        samples_invalid=invalid,
        plan_name=plan.name,
        plan_sha256=plan_sha256,
        arms=arms,
        noise=noise,
        rules=rules,
        drift=drift,
        order=order,
    )


def _by_arm(
    plan: QualifyPlan, samples: list[dict[str, Any]], invalid: list[dict[str, Any]]
) -> dict[ArmKey, dict[tuple[int, int], dict[str, Any]]]:
    """The samples by (pair, arm, fixture), then (attempt, repeat); a failed or duplicated one goes
    to `invalid` and leaves a marker, so the arm's value knows it is short."""
    reps: dict[ArmKey, dict[tuple[int, int], dict[str, Any]]] = {}
    for s in samples:
        key = (s.get("pair"), s.get("arm"), s.get("fixture"))
        rep = (s.get("attempt", 0), s.get("rep", 0))  # receipts from before repeats have no `rep`: 0
        problem = sample_problem(s, plan.n_predict)
        got = reps.setdefault(key, {})  # type: ignore[arg-type]
        if rep in got:
            problem = problem or "duplicate sample for this pair, arm, fixture and repeat"
        if problem:
            invalid.append(_invalid(key, rep[1], rep[0], problem))
            got.setdefault(rep, {"_invalid": True})
        else:
            got[rep] = s
    return reps


def _flags(plan: QualifyPlan, by_family: dict[str, Cell]) -> list[FlagResult]:
    """The plan's point checks on each family's ratios: reported beside the gates, never deciding."""
    flags: list[FlagResult] = []
    metric_attr = {"client_wall": "wall_ratio", "ttft": "ttft_ratio", "prompt": "pp_ratio"}
    for fl in plan.flags:
        for fam in plan.families if fl.family == ALL else [fl.family]:
            c = by_family[fam]
            if fl.metric == "generation":
                ratio = None if c.tg is None else c.tg.gain + 1.0
            else:
                ratio = getattr(c, metric_attr[fl.metric])
            ok = None if ratio is None else at_least(ratio, fl.min_ratio)
            flags.append(FlagResult(fl.metric, fam, fl.min_ratio, ratio, ok))
    return flags


def _floors(noise: dict[str, Any] | None, rules: dict[str, Any] | None) -> dict[str, float]:
    """Per cell, the calibrated sd below which the deciding interval may not go (when recorded)."""
    if not rules or rules.get("floor") != "sigma_upper" or not noise:
        return {}
    return {
        fam: float(v["sigma_upper"])
        for fam, v in (noise.get("families") or {}).items()
        if isinstance(v, dict) and isinstance(v.get("sigma_upper"), (int, float))
    }


def _drift_and_order(
    plan: QualifyPlan,
    valid: dict[ArmKey, dict[str, Any]],
    cells: list[Cell],
    noise: dict[str, Any] | None,
    rules: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The drift checks (deciding only under recorded rules) and the position effect per cell."""
    cfg = plan.drift
    fixtures = [f.name for f in plan.fixtures]
    points = []
    for p in range(plan.pairs):
        arms = [valid.get((p, "baseline", fx)) for fx in fixtures]
        if all(a is not None and isinstance(a.get("seq"), int) for a in arms):
            logs = [math.log(a["predicted_per_second"]) for a in arms if a is not None]
            points.append((float(arms[0]["seq"]), sum(logs) / len(logs)))  # type: ignore[index]
    tr = drift_checks.trend(
        [x for x, _ in points], [y for _, y in points], confidence=cfg.confidence, max_trend=cfg.max_trend
    )
    cal = (noise or {}).get("families") or {}
    spreads = {}
    for c in cells:
        own = c.tg.interval.sd_own if c.tg and c.tg.interval else None
        upper = cal.get(c.family, {}).get("sigma_upper") if isinstance(cal.get(c.family), dict) else None
        spreads[c.family] = drift_checks.spread(own, upper, max_ratio=cfg.max_spread_ratio)
    reasons = []
    if tr["drift"]:
        reasons.append(
            f"baseline TG moved {100 * tr['change']:+.1f}% over the run "
            f"(slope interval excludes 0; bound {100 * cfg.max_trend:.0f}%)"
        )
    for fam, sp in spreads.items():
        if sp["drift"]:
            reasons.append(
                f"{fam}: own sd {100 * sp['own_sd']:.1f}% is {sp['ratio']:.1f}x the calibrated "
                f"{100 * sp['calibrated_sd_upper']:.1f}% (bound {cfg.max_spread_ratio}x)"
            )
    deciding = bool(rules)
    drift = {
        "trend": tr,
        "spread": spreads,
        "reasons": reasons,
        "deciding": deciding,
        "flagged": deciding and bool(reasons),
        "calibrated": bool(cal),
    }
    position = {}
    for c in cells:
        if c.tg is None:
            continue
        fx = fixtures_of_cell(plan, c.family)[0]
        seqs = [(valid[(p, "baseline", fx)].get("seq"), valid[(p, "candidate", fx)].get("seq")) for p in c.valid_pairs]
        second = [isinstance(b, int) and isinstance(k, int) and k > b for b, k in seqs]
        position[c.family] = drift_checks.position_effect(
            [math.log(r) for r in c.tg.ratios], second, confidence=plan.confidence
        )
    order = {
        "order": (rules or {}).get("order") or (plan.order if isinstance(plan.order, str) else "explicit"),
        "order_seed": (rules or {}).get("order_seed"),
        "position": position,
    }
    return drift, order


def fixtures_of_cell(plan: QualifyPlan, family: str) -> list[str]:
    return [f.name for f in plan.fixtures if family == COMBINED or f.family == family]


_CENTRED = ("predicted_per_second", "prompt_per_second", "wall_s", "ttft_s")


ArmKey = tuple[int, str, str]  # (pair, arm, fixture)


def _invalid(key: tuple[Any, ...], rep: int | None, attempt: int, problem: str) -> dict[str, Any]:
    return {"pair": key[0], "arm": key[1], "fixture": key[2], "rep": rep, "attempt": attempt, "problem": problem}


def _arm_values(
    plan: QualifyPlan, reps: dict[ArmKey, dict[tuple[int, int], dict[str, Any]]], invalid: list[dict[str, Any]]
) -> tuple[dict[ArmKey, dict[str, Any]], list[dict[str, Any]]]:
    """Per (pair, arm, fixture): the median of its repeats as one sample-shaped dict, or absent when
    a repeat is invalid or missing or they spread too much. Of the runner's re-measured attempts,
    the first complete one within the bound is used; every attempt stays recorded."""
    valid: dict[ArmKey, dict[str, Any]] = {}
    arms: list[dict[str, Any]] = []
    by_attempt: list[tuple[ArmKey, int, dict[int, dict[str, Any]]]] = []
    for key, all_reps in sorted(reps.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        for attempt in sorted({a for a, _ in all_reps}):
            by_attempt.append((key, attempt, {r: s for (a, r), s in all_reps.items() if a == attempt}))
    for key, attempt, got in by_attempt:
        if key in valid:  # an earlier attempt was usable: later ones are recorded, not used
            continue
        _arm_value(plan, key, attempt, got, valid, arms, invalid)
    return valid, arms


def _arm_value(
    plan: QualifyPlan,
    key: ArmKey,
    attempt: int,
    got: dict[int, dict[str, Any]],
    valid: dict[ArmKey, dict[str, Any]],
    arms: list[dict[str, Any]],
    invalid: list[dict[str, Any]],
) -> None:
    want = set(range(plan.repeats))
    good = {r: s for r, s in got.items() if not s.get("_invalid")}
    tg = [good[r]["predicted_per_second"] for r in sorted(good)]
    centre, spread = robust_centre(tg) if tg else (None, None)
    row: dict[str, Any] = {**dict(zip(("pair", "arm", "fixture"), key, strict=True)), "attempt": attempt}
    row.update(repeats=len(good), median_tg=centre, dispersion=spread, valid=False)
    arms.append(row)
    if set(good) != want:
        if not set(got) - set(good):  # not already explained by an invalid sample
            invalid.append(_invalid(key, None, attempt, f"{len(good)} valid of {plan.repeats} planned repeats"))
        return
    bound = plan.max_arm_dispersion
    if bound is not None and spread is not None and spread > bound:
        why = f"arm dispersion {spread:.4f} (sd of log TG over {plan.repeats} repeats) exceeds the plan's"
        invalid.append(_invalid(key, None, attempt, f"{why} max_arm_dispersion {bound}"))
        return
    rows = [good[r] for r in sorted(good)]
    merged = dict(rows[0])
    for k in _CENTRED:
        merged[k] = float(median(r[k] for r in rows))
    peaks = [r.get("peak_memory_bytes") for r in rows]
    nums = [v for v in peaks if isinstance(v, (int, float)) and v > 0]
    merged["peak_memory_bytes"] = max(nums) if len(nums) == len(peaks) else None
    for k in ("draft_n", "draft_n_accepted"):
        merged[k] = sum(r.get(k) or 0 for r in rows) if any(r.get(k) is not None for r in rows) else None
    if len({r.get("prompt_sha256") for r in rows}) != 1:
        invalid.append(_invalid(key, None, attempt, "the repeats of this arm sent different prompts"))
        return
    valid[key] = merged
    row["valid"] = True


class _Bootstrap(TypedDict):
    """`estimate_gain`'s bootstrap arguments, as the plan sets them."""

    confidence: float
    exact_limit: int
    resamples: int
    seed: int


def _cell(
    fam: str,
    planned: int,
    pairs: list[int],
    fam_ratio: Callable[[int, str, str, bool], float],
    families: list[str],
    valid: dict[ArmKey, dict[str, Any]],
    fixtures_of: dict[str, list[str]],
    boot: _Bootstrap,
    floor: float | None = None,
) -> Cell:
    def per_pair(key: str, invert: bool = False) -> list[float]:
        if fam != COMBINED:
            return [fam_ratio(p, fam, key, invert) for p in pairs]
        return (
            list(combine_families([[fam_ratio(p, f, key, invert) for p in pairs] for f in families])) if pairs else []
        )

    tg = estimate_gain(per_pair("predicted_per_second"), **boot, floor_sd=floor) if pairs else None
    pp = geomean(per_pair("prompt_per_second")) if pairs else None
    wall = geomean(per_pair("wall_s", invert=True)) if pairs else None
    ttft = geomean(per_pair("ttft_s", invert=True)) if pairs else None
    fxs = [fx for f in families for fx in fixtures_of[f]]
    mem = None
    raw_peaks = {
        arm: [valid[(p, arm, fx)].get("peak_memory_bytes") for p in pairs for fx in fxs]
        for arm in ("baseline", "candidate")
    }
    peaks: dict[str, list[float]] = {
        arm: [v for v in vs if isinstance(v, (int, float)) and v > 0] for arm, vs in raw_peaks.items()
    }
    if pairs and all(len(peaks[arm]) == len(vs) for arm, vs in raw_peaks.items()):  # every peak a positive number
        mem = max(peaks["candidate"]) / max(peaks["baseline"])
    med = {
        arm: (median(valid[(p, arm, fx)]["predicted_per_second"] for p in pairs for fx in fxs) if pairs else None)
        for arm in ("baseline", "candidate")
    }
    acc = {
        arm: acceptance_rate(
            [valid[(p, arm, fx)].get("draft_n") for p in pairs for fx in fxs],
            [valid[(p, arm, fx)].get("draft_n_accepted") for p in pairs for fx in fxs],
        )
        for arm in ("baseline", "candidate")
    }
    return Cell(fam, planned, pairs, tg, pp, wall, ttft, mem, med, acc)
