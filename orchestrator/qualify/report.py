"""The qualification result recomputed from a receipt, and its report (Markdown + PNG chart).

`load_record` reads a receipt, original or derived: a derived record's reused arm steps are
followed to the receipt that measured them (their hashes checked by the evidence store), and
the plan is the text recorded before the first sample, checked against its sha256. Nothing is
re-measured and nothing is read from the plan file on disk.
"""

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


def _origin(store: EvidenceStore, r: Receipt) -> Receipt:
    seen = set()
    while "plan_sha256" not in r.extra_fields():
        if r.derived_from is None or r.derived_from in seen:
            raise EvidenceError(f"receipt {r.sha256[:12]} is not a qualification (no plan_sha256) and derives from none")
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
        raise EvidenceError(f"receipt {origin.sha256[:12]}: the recorded plan text does not match plan_sha256 {plan_sha}")
    checks.append(f"plan text matches plan_sha256 {plan_sha[:16]}")
    declared = [f for f in origin.fields_set if f.key == "plan_sha256"]
    if origin.first_sample_at is not None:
        if not declared or parse_time(declared[0].at) > parse_time(origin.first_sample_at):
            raise EvidenceError(f"receipt {origin.sha256[:12]}: plan_sha256 was not set before the first sample")
        checks.append(f"plan declared at {declared[0].at}, before the first sample at {origin.first_sample_at}")
    plan = plan_from_text(plan_text, source=f"receipt {origin.sha256[:12]} plan_text")

    if receipt.derived_from is None:
        steps = [s.name for s in receipt.steps if s.name.startswith(ARM_STEP_PREFIX) and s.outcome == "passed"]
    else:
        steps = [n for n in receipt.reused_steps if n.startswith(ARM_STEP_PREFIX)]
        steps += [s.name for s in receipt.steps if s.name.startswith(ARM_STEP_PREFIX) and s.outcome == "passed"]
        checks.append(f"derived record: {len(receipt.reused_steps)} step(s) reused by reference from {receipt.derived_from[:16]}")
    samples: list[dict[str, Any]] = []
    for name in steps:
        _rec, rows = store.step_view(receipt.sha256, name)  # follows references, checks their hashes
        samples += rows
    return QualifyRecord(
        receipt=receipt.sha256, origin=origin.sha256, plan=plan, plan_sha256=plan_sha, pair=extra.get("qualify_pair"),
        arms=extra.get("qualify_arms") or {}, samples=samples, sample_steps=steps, derived=receipt.derived_from is not None,
        outcome=receipt.outcome, reason=receipt.reason, checks=checks,
    )


def result_of(record: QualifyRecord) -> QualifyResult:
    return analyze(record.plan, record.samples, plan_sha256=record.plan_sha256)


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
    (out / RESULT_JSON).write_text(json.dumps(
        {"receipt": record.receipt, "origin": record.origin, "derived": record.derived, "pair": record.pair,
         "arms": record.arms, "sample_steps": record.sample_steps, "checks": record.checks, **result.to_json()},
        indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return out, record, result


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def markdown(result: QualifyResult, record: QualifyRecord) -> str:
    plan = record.plan
    arms = record.arms
    lines = [
        f"# Qualification {result.verdict.upper()}: plan `{plan.name}` on pair `{record.pair}`",
        "",
        f"- Receipt: `{record.receipt}`" + (f" (derived; measured in `{record.origin}`)" if record.derived else ""),
        f"- Receipt outcome: {record.outcome} — {record.reason}",
        f"- Plan sha256: `{record.plan_sha256}` ({'; '.join(record.checks)})",
        f"- Baseline: native `{arms.get('baseline', {}).get('native')}`, rpc `{arms.get('baseline', {}).get('rpc')}`",
        f"- Candidate: native `{arms.get('candidate', {}).get('native')}`, rpc `{arms.get('candidate', {}).get('rpc')}`",
        f"- Design: {plan.pairs} alternating pairs, {len(plan.fixtures)} fixture(s), {plan.n_predict} generated tokens, "
        f"fresh load + one warm-up per arm, one active slot, cache_prompt off",
        f"- Samples: {result.samples_total} recorded, {len(result.samples_invalid)} invalid",
        "",
        "## Gates (declared before the first sample; only these decide)",
        "",
        "| Gate | Family | Threshold | Gain | 95% interval | Valid pairs | Verdict | Why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in result.gates:
        lines.append(
            f"| {g.kind} | {g.family} | {_pct(g.threshold)} | {_pct(g.gain)} | {_pct(g.low)} to {_pct(g.high)} | "
            f"{g.valid_pairs}/{g.planned_pairs} | **{g.verdict.upper()}** | {g.reason} |"
        )
    lines += ["", "## Generation speed per family (paired, candidate / baseline)", "",
              "| Family | Baseline median TG | Candidate median TG | Paired geometric gain | 95% interval | Method | Valid pairs |",
              "|---|---|---|---|---|---|---|"]
    for c in result.cells:
        iv = c.tg.interval if c.tg else None
        method = f"{iv.method} ({iv.resamples} resamples)" if iv else "n/a"
        mb, mc = c.median_tg.get("baseline"), c.median_tg.get("candidate")
        note = " (descriptive)" if c.family == COMBINED else ""
        lines.append(
            f"| {c.family}{note} | {'n/a' if mb is None else f'{mb:.2f} tok/s'} | {'n/a' if mc is None else f'{mc:.2f} tok/s'} | "
            f"{_pct(c.tg.gain if c.tg else None)} | {_pct(iv.low if iv else None)} to {_pct(iv.high if iv else None)} | "
            f"{method} | {len(c.valid_pairs)}/{c.planned_pairs} |"
        )
    lines += ["", "## Reported, not gated", "",
              "| Family | PP ratio | Peak memory ratio | Client wall ratio | TTFT ratio | Draft acceptance (B / C) |",
              "|---|---|---|---|---|---|"]
    for c in result.cells:
        acc = " / ".join("n/a" if c.acceptance.get(a) is None else f"{c.acceptance[a]:.3f}" for a in ("baseline", "candidate"))
        lines.append(f"| {c.family} | {_r(c.pp_ratio)} | {_r(c.memory_ratio)} | {_r(c.wall_ratio)} | {_r(c.ttft_ratio)} | {acc} |")
    lines += ["", "Ratios: PP = candidate/baseline prompt tok/s; memory = candidate/baseline pair memory after each request "
              "(GPU memory in use from nvidia-smi on GPU hosts, the service's peak RSS on CPU hosts; each sample's "
              "`memory_source` says which); wall and TTFT = "
              "baseline/candidate time (above 1 = candidate faster).", ""]
    if result.flags:
        lines += ["## Flags (point checks, never gates)", "", "| Metric | Family | Ratio | Minimum | OK |", "|---|---|---|---|---|"]
        for f in result.flags:
            ok = "n/a" if f.ok is None else ("yes" if f.ok else "**no**")
            lines.append(f"| {f.metric} | {f.family} | {_r(f.ratio)} | {f.min_ratio} | {ok} |")
        lines.append("")
    lines += ["## Per-pair TG ratios", "", "| Family | " + " | ".join(f"pair {i + 1}" for i in range(plan.pairs)) + " |",
              "|---|" + "---|" * plan.pairs]
    for c in result.cells:
        by_pair = dict(zip(c.valid_pairs, c.tg.ratios, strict=True)) if c.tg else {}
        lines.append(f"| {c.family} | " + " | ".join(_r(by_pair.get(i)) for i in range(plan.pairs)) + " |")
    if result.samples_invalid:
        lines += ["", "## Invalid samples", ""]
        lines += [f"- pair {i['pair'] + 1 if isinstance(i['pair'], int) else i['pair']}, {i['arm']}, {i['fixture']}: {i['problem']}"
                  for i in result.samples_invalid]
    lines += ["", f"Chart: `{CHART_PNG}` (per-pair ratios, interval, gate lines). Raw samples: the receipt's arm steps "
              f"({', '.join(record.sample_steps) or 'none'}).", ""]
    return "\n".join(lines)


def chart(result: QualifyResult, record: QualifyRecord, path: Path) -> None:
    """Per family: each pair's TG gain (dots), the paired gain (bar) and its interval (whiskers),
    with 0, the gain threshold and the non-regression floor drawn where a gate uses them."""
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
            g, lo, hi = 100 * c.tg.gain, 100 * c.tg.interval.low, 100 * c.tg.interval.high
            ax.errorbar([x + 0.28], [g], yerr=[[g - lo], [hi - g]], fmt="o", color="tab:blue", capsize=5, zorder=4,
                        label=None if labelled else "paired gain, 95% interval")
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
    ax.set_title(f"{record.plan.name}: {result.verdict.upper()} (dashed: gain gate, dotted: non-regression)", fontsize=10)
    if labelled:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
