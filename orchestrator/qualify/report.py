"""The qualification result recomputed from a receipt, and its report (Markdown + PNG chart).
A derived record's reused arm steps are followed to the receipt that measured them (hashes
checked), and the plan is the text recorded before the first sample, checked against its sha256:
nothing is re-measured, no plan file is read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import EvidenceError
from orchestrator.evidence.receipt import Receipt, parse_time
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import sha256_bytes
from orchestrator.qualify.analysis import QualifyResult, analyze
from orchestrator.qualify.plan import COMBINED, QualifyPlan, plan_from_text
from orchestrator.qualify.runner import ARM_STEP_PREFIX

REPORT_MD = "report.md"
CHART_PNG = "ratios.png"
RESULT_JSON = "result.json"


@dataclass
class QualifyRecord:
    receipt: str
    origin: str  # the receipt that declared the plan and measured (== receipt unless derived)
    plan: QualifyPlan
    plan_sha256: str
    pair: str | None
    arms: dict[str, Any]
    samples: list[dict[str, Any]]
    sample_steps: list[str]
    derived: bool
    outcome: str
    reason: str
    checks: list[str] = field(default_factory=list)  # what was verified about the record itself
    noise: dict[str, Any] | None = None  # the calibration the run was judged by (`qualify_noise`)
    calibration: dict[str, Any] | None = None  # set when the record IS a calibration (A/A run)
    rules: dict[str, Any] | None = None  # `qualify_rules`: floor, drift bounds, order seed (None: older receipt)


def _origin(store: EvidenceStore, r: Receipt) -> Receipt:
    seen = set()
    while "plan_sha256" not in r.extra_fields():
        if r.derived_from is None or r.derived_from in seen:
            raise EvidenceError(
                f"receipt {r.sha256[:12]} is not a qualification (no plan_sha256) and derives from none"
            )
        seen.add(r.derived_from)
        r = store.load(r.derived_from)
    return r


def load_record(store: EvidenceStore, ref: str) -> QualifyRecord:
    receipt = store.load(ref)
    origin = _origin(store, receipt)
    extra = origin.extra_fields()
    plan_sha, plan_text = extra.get("plan_sha256"), extra.get("plan_text")
    checks: list[str] = []
    if not isinstance(plan_text, str) or sha256_bytes(plan_text.encode("utf-8")) != plan_sha:
        raise EvidenceError(
            f"receipt {origin.sha256[:12]}: the recorded plan text does not match plan_sha256 {plan_sha}"
        )
    checks.append(f"plan text matches plan_sha256 {plan_sha[:16]}")
    declared = [f for f in origin.fields_set if f.key == "plan_sha256"]
    if origin.first_sample_at is not None:
        if not declared or parse_time(declared[0].at) > parse_time(origin.first_sample_at):
            raise EvidenceError(f"receipt {origin.sha256[:12]}: plan_sha256 was not set before the first sample")
        checks.append(f"plan declared at {declared[0].at}, before the first sample at {origin.first_sample_at}")
    plan = plan_from_text(plan_text, source=f"receipt {origin.sha256[:12]} plan_text")
    cal_run = extra.get("qualify_calibrate")
    if isinstance(cal_run, dict) and isinstance(cal_run.get("pairs"), int):
        plan = plan.model_copy(update={"pairs": cal_run["pairs"]})  # an A/A run measures the calibration's pairs

    steps = [n for n in receipt.reused_steps if n.startswith(ARM_STEP_PREFIX)]  # none unless derived
    steps += [s.name for s in receipt.steps if s.name.startswith(ARM_STEP_PREFIX) and s.outcome == "passed"]
    if receipt.derived_from is not None:
        checks.append(
            f"derived record: {len(receipt.reused_steps)} step(s) reused by reference from {receipt.derived_from[:16]}"
        )
    samples: list[dict[str, Any]] = []
    for name in steps:
        _rec, rows = store.step_view(receipt.sha256, name)  # follows references, checks their hashes
        samples += rows
    return QualifyRecord(
        receipt=receipt.sha256,
        origin=origin.sha256,
        plan=plan,
        plan_sha256=plan_sha,
        pair=extra.get("qualify_pair"),
        arms=extra.get("qualify_arms") or {},
        samples=samples,
        sample_steps=steps,
        derived=receipt.derived_from is not None,
        outcome=receipt.outcome,
        reason=receipt.reason,
        checks=checks,
        noise=extra.get("qualify_noise"),
        calibration=extra.get("calibration") if isinstance(extra.get("calibration"), dict) else None,
        rules=extra.get("qualify_rules") if isinstance(extra.get("qualify_rules"), dict) else None,
    )


def result_of(record: QualifyRecord) -> QualifyResult:
    return analyze(record.plan, record.samples, plan_sha256=record.plan_sha256, noise=record.noise, rules=record.rules)


def reports_dir(store: EvidenceStore, receipt: str) -> Path:
    return store.root / "reports" / receipt


def write_report(store: EvidenceStore, ref: str) -> tuple[Path, QualifyRecord, QualifyResult]:
    """Recompute from the receipt and write report.md, ratios.png and result.json next to it."""
    record = load_record(store, ref)
    result = result_of(record)
    out = reports_dir(store, record.receipt)
    out.mkdir(parents=True, exist_ok=True)
    chart(result, record, out / CHART_PNG)
    (out / REPORT_MD).write_text(markdown(result, record), encoding="utf-8")
    meta = {k: getattr(record, k) for k in ("receipt", "origin", "derived", "pair", "arms", "sample_steps", "checks")}
    text = json.dumps({**meta, **result.to_json()}, indent=2, sort_keys=True, default=str)
    (out / RESULT_JSON).write_text(text + "\n", encoding="utf-8")
    return out, record, result


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def markdown(result: QualifyResult, record: QualifyRecord) -> str:
    plan, arms = record.plan, record.arms
    title = "A/A calibration" if record.calibration else f"Qualification {result.verdict.upper()}"
    lines = [
        f"# {title}: plan `{plan.name}` on pair `{record.pair}`",
        "",
        f"- Receipt: `{record.receipt}`" + (f" (derived; measured in `{record.origin}`)" if record.derived else ""),
        f"- Receipt outcome: {record.outcome} — {record.reason}",
        f"- Plan sha256: `{record.plan_sha256}` ({'; '.join(record.checks)})",
        f"- Baseline: native `{arms.get('baseline', {}).get('native')}`, rpc `{arms.get('baseline', {}).get('rpc')}`",
        f"- Candidate: native `{arms.get('candidate', {}).get('native')}`, "
        f"rpc `{arms.get('candidate', {}).get('rpc')}`",
        f"- Design: {plan.pairs} pairs in {_order_text(result)} order, {len(plan.fixtures)} fixture(s), "
        f"{plan.n_predict} generated tokens, "
        f"fresh load + one warm-up per arm, one active slot, cache_prompt off",
        f"- Samples: {result.samples_total} recorded, {len(result.samples_invalid)} invalid",
        "",
        f"- Deciding interval: **{result.deciding_method}** on the per-pair log TG ratios "
        f"({int(100 * plan.confidence)}%); the exact percentile bootstrap (the field report's method) is shown "
        "beside it and decides nothing",
        f"- Repeats: {plan.repeats} measured request(s) per fixture per arm after the warm-up, "
        "the arm's value their median"
        + (
            f"; an arm whose sd of log TG exceeds {plan.max_arm_dispersion} is invalid"
            if plan.max_arm_dispersion
            else ""
        ),
        *noise_lines(result),
        *sequential_lines(result),
        "",
        "## Gates (declared before the first sample; only these decide)",
        "",
        f"| Gate | Family | Threshold | Gain | {result.deciding_method} interval (decides) "
        "| Spread that decided | Own sd | Calibrated sd | Bootstrap interval (not deciding) "
        "| Valid pairs | Verdict | Why |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *_gate_rows(result),
        *drift_lines(result),
        *_speed_lines(result),
        *_reported_lines(result),
        *_pair_lines(result, plan.pairs),
        *_calibration_lines(record),
        *_tail_lines(result, record),
    ]
    return "\n".join(lines)


def _gate_rows(result: QualifyResult) -> list[str]:
    """One row per declared gate, in the order the plan declares them."""
    return [
        f"| {g.kind} | {g.family} | {_pct(g.threshold)} | {_pct(g.gain)} | {_pct(g.low)} to {_pct(g.high)} | "
        f"{g.spread or 'n/a'} | {_sd(g.sd_own)} | {_sd(g.sd_calibrated)} | "
        f"{_pct(g.bootstrap_low)} to {_pct(g.bootstrap_high)} | "
        f"{g.valid_pairs}/{g.planned_pairs} | **{g.verdict.upper()}** | {g.reason} |"
        for g in result.gates
    ]


def _speed_lines(result: QualifyResult) -> list[str]:
    """The paired TG gain per family: the numbers the gates above were judged on."""
    lines = [
        "",
        "## Generation speed per family (paired, candidate / baseline)",
        "",
        "| Family | Baseline median TG | Candidate median TG | Paired geometric gain "
        "| Student-t interval (decides) "
        "| sd of log ratio | Bootstrap interval | Bootstrap method | Valid pairs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.cells:
        iv = c.tg.interval if c.tg else None
        bs = c.tg.bootstrap if c.tg else None
        method = f"{bs.method} ({bs.resamples} resamples)" if bs else "n/a"
        mb, mc = c.median_tg.get("baseline"), c.median_tg.get("candidate")
        note = " (descriptive)" if c.family == COMBINED else ""
        sd = "n/a" if iv is None or iv.sd_log is None else f"{100 * iv.sd_log:.2f}%"
        lines.append(
            f"| {c.family}{note} | {'n/a' if mb is None else f'{mb:.2f} tok/s'} | "
            f"{'n/a' if mc is None else f'{mc:.2f} tok/s'} | "
            f"{_pct(c.tg.gain if c.tg else None)} | "
            f"{_pct(iv.low if iv else None)} to {_pct(iv.high if iv else None)} | "
            f"{sd} | {_pct(bs.low if bs else None)} to {_pct(bs.high if bs else None)} | {method} "
            f"| {len(c.valid_pairs)}/{c.planned_pairs} |"
        )
    return lines


def _reported_lines(result: QualifyResult) -> list[str]:
    """Ratios and point flags that are shown beside the gates and decide nothing."""
    lines = [
        "",
        "## Reported, not gated",
        "",
        "| Family | PP ratio | Peak memory ratio | Client wall ratio | TTFT ratio | Draft acceptance (B / C) |",
        "|---|---|---|---|---|---|",
    ]
    for c in result.cells:
        acc = " / ".join(
            "n/a" if c.acceptance.get(a) is None else f"{c.acceptance[a]:.3f}" for a in ("baseline", "candidate")
        )
        lines.append(
            f"| {c.family} | {_r(c.pp_ratio)} | {_r(c.memory_ratio)} | {_r(c.wall_ratio)} | "
            f"{_r(c.ttft_ratio)} | {acc} |"
        )
    lines += [
        "",
        "Ratios: PP = candidate/baseline prompt tok/s; memory = candidate/baseline pair memory after each request "
        "(GPU memory in use from nvidia-smi on GPU hosts, the service's peak RSS on CPU hosts; each sample's "
        "`memory_source` says which); wall and TTFT = "
        "baseline/candidate time (above 1 = candidate faster).",
        "",
    ]
    if result.flags:
        lines += [
            "## Flags (point checks, never gates)",
            "",
            "| Metric | Family | Ratio | Minimum | OK |",
            "|---|---|---|---|---|",
        ]
        for f in result.flags:
            ok = "n/a" if f.ok is None else ("yes" if f.ok else "**no**")
            lines.append(f"| {f.metric} | {f.family} | {_r(f.ratio)} | {f.min_ratio} | {ok} |")
        lines.append("")
    return lines


def _pair_lines(result: QualifyResult, pairs: int) -> list[str]:
    """Every pair's own TG ratio, so one outlying pair is seen rather than averaged away."""
    lines = [
        "## Per-pair TG ratios",
        "",
        "| Family | " + " | ".join(f"pair {i + 1}" for i in range(pairs)) + " |",
        "|---|" + "---|" * pairs,
    ]
    for c in result.cells:
        by_pair = dict(zip(c.valid_pairs, c.tg.ratios, strict=True)) if c.tg else {}
        lines.append(f"| {c.family} | " + " | ".join(_r(by_pair.get(i)) for i in range(pairs)) + " |")
    return lines


def _calibration_lines(record: QualifyRecord) -> list[str]:
    """The A/A noise and the pairs each gate needs (a calibration's report only)."""
    if not record.calibration:
        return []
    lines = ["", "## Calibration (A/A: baseline against baseline, every difference is noise)", ""]
    lines += [
        f"- {fam}: sd of per-pair log TG ratio {100 * v['sigma']:.2f}% "
        f"(upper {int(100 * v['upper_confidence'])}% "
        f"bound {100 * v['sigma_upper']:.2f}%), mean {100 * v['mean_log']:+.2f}% over {v['pairs']} pairs"
        for fam, v in record.calibration["families"].items()
    ]
    lines += [f"- problem: {p}" for p in record.calibration.get("problems") or []]
    lines += [
        "",
        "| Gate | Family | Threshold | Power at | Power | Pairs needed | Plan pairs | Resolvable |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {g['kind']} | {g['family']} | {_pct(g['threshold'])} | {_pct(g['power_at'])} | {g['power']} | "
        f"{g['needed_pairs'] if g['needed_pairs'] is not None else 'n/a'} | {g['plan_pairs']} | "
        f"{'yes' if g['resolvable'] else '**no**'} |"
        for g in record.calibration["gates"]
    ]
    lines += ["", "The gate verdicts above are the A/A check: a gain gate that passes here passed on noise."]
    return lines


def _tail_lines(result: QualifyResult, record: QualifyRecord) -> list[str]:
    """How much the arms spread, what was invalid, and where the chart and raw samples are."""
    plan = record.plan
    lines: list[str] = []
    spread = [a["dispersion"] for a in result.arms if a.get("dispersion") is not None]
    if spread:
        lines += [
            "",
            "## Within-arm dispersion (sd of log TG over each arm's repeats)",
            "",
            f"- {len(spread)} arm values; median {100 * sorted(spread)[len(spread) // 2]:.2f}%, "
            f"max {100 * max(spread):.2f}%"
            + (f"; bound {100 * plan.max_arm_dispersion:.2f}%" if plan.max_arm_dispersion else ""),
        ]
    if result.samples_invalid:
        lines += ["", "## Invalid samples and arms", ""]
        lines += [
            f"- pair {i['pair'] + 1 if isinstance(i['pair'], int) else i['pair']}, {i['arm']}, {i['fixture']}"
            + (f", repeat {i['rep'] + 1}" if isinstance(i.get("rep"), int) else "")
            + (f", attempt {i['attempt'] + 1}" if i.get("attempt") else "")
            + f": {i['problem']}"
            for i in result.samples_invalid
        ]
    lines += [
        "",
        f"Chart: `{CHART_PNG}` (per-pair ratios, interval, gate lines). Raw samples: the receipt's arm steps "
        f"({', '.join(record.sample_steps) or 'none'}).",
        "",
    ]
    return lines


def _sd(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _order_text(result: QualifyResult) -> str:
    o = result.order or {}
    seed = o.get("order_seed")
    return str(o.get("order") or "alternating") + (f" (seed {seed})" if seed is not None else "")


def floor_line(result: QualifyResult) -> str:
    """Which spread may decide: the calibrated floor, or the run's own sd and why."""
    rules = result.rules
    if rules is None:
        return (
            "- Spread: the run's own sd only (this receipt predates calibrated floors and drift checks; "
            "it is re-analysed as it was decided)"
        )
    if rules.get("floor") == "sigma_upper":
        return (
            "- Spread: each deciding interval uses the larger of the run's own sd and the calibration's "
            "upper bound (sigma_upper), so it is never narrower than the calibrated noise allows at its pairs"
        )
    if rules.get("floor") == "none":
        return "- Spread: the run's own sd only (the plan's `calibration.floor: none`)"
    return "- Spread: the run's own sd only: **no calibration** (the plan declares none, or does not require one)"


def drift_lines(result: QualifyResult) -> list[str]:
    """Drift (trend of the baseline arms, own vs calibrated spread) and the position effect."""
    d, o = result.drift, result.order
    if not d:
        return []
    tr = d["trend"]
    out = ["", "## Drift and arm order", ""]
    if d.get("flagged"):
        out.append("- **Drift: the run is not the run the plan was sized for** — " + "; ".join(d["reasons"]))
    elif d.get("reasons"):
        out.append("- Drift seen but not deciding (older receipt): " + "; ".join(d["reasons"]))
    else:
        out.append("- Drift: none beyond the plan's bounds")
    if tr.get("measurable"):
        out.append(
            f"- Baseline trend over the run ({tr['points']} baseline arms, log TG on arm position): "
            f"{_pct(tr['change'])} [{_pct(tr['change_low'])}, {_pct(tr['change_high'])}] "
            f"({int(100 * tr['confidence'])}%); drift when the interval excludes 0 and the change exceeds "
            f"{100 * tr['max_trend']:.0f}%"
        )
    else:
        out.append(f"- Baseline trend: not measurable ({tr.get('why')})")
    for fam, sp in d["spread"].items():
        if sp.get("ratio") is None:
            out.append(f"- {fam}: own sd {_sd(sp.get('own_sd'))}; no calibrated sd to compare")
        else:
            out.append(
                f"- {fam}: own sd {_sd(sp['own_sd'])} = {sp['ratio']:.2f}x the calibrated "
                f"{_sd(sp['calibrated_sd_upper'])} (drift above {sp['max_ratio']}x)"
            )
    for fam, pe in ((o or {}).get("position") or {}).items():
        if pe.get("effect") is None:
            out.append(f"- {fam}: position effect not estimable ({pe.get('why')})")
            continue
        ci = "" if pe.get("low") is None else f" [{_pct(pe['low'])}, {_pct(pe['high'])}]"
        out.append(
            f"- {fam}: position effect (second arm of a pair vs first) {_pct(pe['effect'])}{ci}; "
            f"candidate second in {pe['candidate_second']}, first in {pe['candidate_first']} pairs: "
            + (
                "balanced, so it cancels in the gain"
                if pe["balanced"]
                else f"unbalanced, it moves the mean gain by {_pct(pe['bias_in_mean'])}"
            )
        )
    return out


def sequential_lines(result: QualifyResult) -> list[str]:
    """A sequential design's looks (pairs, confidence, verdicts) and which one decided."""
    q = result.sequential
    if not q:
        return []
    looks = ", ".join(f"{n} ({100 * c:.2f}%)" for n, c in zip(q["pairs_at"], q["confidence_at"], strict=False))
    taken = "; ".join(
        f"look {t['look']} at {t['pairs']} pairs: "
        + ", ".join(f"{g['kind']}[{g['family']}] {g['verdict']}" for g in t["gates"])
        + (" (settled)" if t["settled"] else "")
        for t in q["looks_taken"]
    )
    if q.get("decided_at_look") is None:
        end = f"**no look decided** (the samples end at {q['pairs_used']} pairs)"
    elif q.get("stopped_early"):
        end = f"**decided at look {q['decided_at_look']} of {q['looks']}, {q['pairs_used']} pairs: stopped early**"
    else:
        end = f"**decided at the last look ({q['pairs_used']} pairs)**"
    return [
        f"- Sequential design ({q['spending']} spending of the one-sided alpha over {q['looks']} looks): "
        f"looks at pairs (interval confidence) {looks}; {end}",
        f"- Looks taken: {taken}",
    ]


def noise_lines(result: QualifyResult) -> list[str]:
    """The calibration the run was judged by: the noise floor and each gate's needed pairs."""
    n = result.noise
    if not n:
        return ["- Noise floor: no calibration (the plan needs none); the gates' power is unknown", floor_line(result)]
    out = [
        floor_line(result),
        f"- Noise floor (A/A calibration `{str(n.get('receipt'))[:16]}`, {n.get('pairs')} pairs): "
        + ", ".join(
            f"{fam} sd {100 * v['sigma']:.2f}% (planned on {100 * v['sigma_upper']:.2f}%)"
            for fam, v in (n.get("families") or {}).items()
        ),
    ]
    for g in n.get("gates") or []:
        need = g["needed_pairs"] if g["needed_pairs"] is not None else f"more than {g['max_pairs']}"
        out.append(
            f"  - {g['kind']}[{g['family']}] {_pct(g['threshold'])}: power {g['power']} "
            f"at {_pct(g['power_at'])} needs {need} pairs"
        )
    return out


def chart(result: QualifyResult, record: QualifyRecord, path: Path) -> None:
    """Per family: each pair's TG gain (dots), the paired gain and its intervals (whiskers), and
    the gates' thresholds."""
    import matplotlib  # heavy optional dependency: only drawing the report's figure needs it

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    cells = result.cells
    fig, ax = plt.subplots(figsize=(1.8 + 1.9 * len(cells), 5.0), dpi=110)
    ax.axhline(0.0, color="black", linewidth=0.8)
    labelled = False
    for x, c in enumerate(cells):
        if c.tg is not None:
            ys = [100 * (r - 1) for r in c.tg.ratios]
            xs = [x + (i - (len(ys) - 1) / 2) * 0.06 for i in range(len(ys))]
            ax.scatter(xs, ys, s=18, color="tab:gray", zorder=3, label=None if labelled else "per-pair gain")
            g = 100 * c.tg.gain
            whiskers = (
                (c.tg.interval, 0.28, "o", "tab:blue", 5, "paired gain, Student-t interval (decides)"),
                (c.tg.bootstrap, 0.18, "none", "tab:gray", 3, "percentile bootstrap (not deciding)"),
            )
            for iv, dx, fmt, color, cap, label in whiskers:
                if iv is not None:
                    lo, hi = 100 * iv.low, 100 * iv.high
                    err = [[g - lo], [hi - g]]
                    ax.errorbar([x + dx], [g], yerr=err, fmt=fmt, color=color, capsize=cap, zorder=4,
                                label=None if labelled else label)  # fmt: skip
            labelled = True
        else:
            ax.text(x, 0, "no valid pairs", ha="center", va="bottom", fontsize=8)
        for gv in result.gates:
            if gv.family != c.family:
                continue
            color = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:orange"}[gv.verdict]
            style: Literal["--", ":"] = "--" if gv.kind == "gain" else ":"
            ax.hlines(100 * gv.threshold, x - 0.4, x + 0.4, colors=color, linestyles=style, linewidth=1.6)
            ax.text(x + 0.42, 100 * gv.threshold, f"{gv.kind} {gv.verdict}", fontsize=7, color=color, va="center")
    ax.set_xticks(range(len(cells)), [f"{c.family}\n{len(c.valid_pairs)}/{c.planned_pairs} pairs" for c in cells])
    ax.set_ylabel("TG gain, candidate vs baseline (%)")
    ax.set_xlim(-0.6, len(cells) - 0.1)
    ax.set_title(
        f"{record.plan.name}: {result.verdict.upper()} (dashed: gain gate, dotted: non-regression)", fontsize=10
    )
    if labelled:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
