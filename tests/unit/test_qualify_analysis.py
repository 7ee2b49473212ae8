"""From raw sample dicts (as the receipt stores them) to cells, gate verdicts and flags."""

from __future__ import annotations

import pytest

from orchestrator.qualify.analysis import analyze, sample_problem
from orchestrator.qualify.plan import load_plan

PLAN = load_plan("mmvf-field").plan  # 5 pairs, code/prose/structured, 512 generated


def sample(pair, arm, fixture, tg, *, pp=1000.0, wall=10.0, ttft=1.0, mem=1000, **over):
    s = {
        "pair": pair,
        "arm": arm,
        "seq": 0,
        "fixture": fixture,
        "family": fixture,
        "fixture_sha256": "f" * 64,
        "prompt_sha256": "p-" + fixture,
        "package_native": f"{arm}-n",
        "package_rpc": f"{arm}-r",
        "build_info": "b1-x",
        "ok": True,
        "error": None,
        "prompt_n": 8192,
        "prompt_ms": 8192 / pp * 1000,
        "prompt_per_second": pp,
        "predicted_n": 512,
        "predicted_ms": 512 / tg * 1000,
        "predicted_per_second": tg,
        "draft_n": 300,
        "draft_n_accepted": 200,
        "cache_n": 0,
        "stop_type": "limit",
        "wall_s": wall,
        "ttft_s": ttft,
        "peak_memory_bytes": mem,
        "memory_source": "test",
    }
    s.update(over)
    return s


def run_of(gains: dict[str, list[float]], base=60.0, **kw):
    out = []
    for fam, rs in gains.items():
        for p, r in enumerate(rs):
            out.append(sample(p, "baseline", fam, base, **kw))
            out.append(sample(p, "candidate", fam, base * r, **kw))
    return out


FIELD_LIKE = {
    "code": [1.030, 1.045, 1.018, 1.042, 1.035],
    "prose": [1.020, 1.030, 1.015, 1.028, 1.026],
    "structured": [1.22, 1.25, 1.19, 1.24, 1.23],
}


def test_field_like_run_structured_gain_passes_others_non_regression():
    r = analyze(PLAN, run_of(FIELD_LIKE), plan_sha256="h")
    g = {(v.kind, v.family): v for v in r.gates}
    assert g[("gain", "structured")].verdict == "pass"
    assert all(g[("non_regression", f)].verdict == "pass" for f in ("code", "prose", "structured"))
    assert r.verdict == "pass"
    cells = {c.family: c for c in r.cells}
    assert cells["structured"].tg.gain == pytest.approx(0.2259, abs=1e-3)
    assert cells["structured"].tg.bootstrap.method == "exact" and cells["structured"].tg.bootstrap.resamples == 3125
    assert cells["structured"].tg.interval.method == "student-t" and cells["structured"].tg.interval.df == 4
    assert [len(c.valid_pairs) for c in r.cells] == [5, 5, 5, 5]
    # combined = per pair geomean over the three families, then the same bootstrap
    comb = cells["combined"].tg
    import math

    expect = [math.prod(FIELD_LIKE[f][p] for f in FIELD_LIKE) ** (1 / 3) for p in range(5)]
    assert list(comb.ratios) == pytest.approx(expect)
    assert cells["code"].median_tg == {"baseline": 60.0, "candidate": pytest.approx(60.0 * 1.035)}
    assert cells["code"].acceptance == {"baseline": pytest.approx(2 / 3), "candidate": pytest.approx(2 / 3)}


def test_regression_fails_the_run():
    gains = dict(FIELD_LIKE, prose=[0.97, 0.98, 0.975, 0.97, 0.98])
    r = analyze(PLAN, run_of(gains))
    bad = [v for v in r.gates if v.verdict == "fail"]
    assert [(v.kind, v.family) for v in bad] == [("non_regression", "prose")]
    assert r.verdict == "fail"


def test_missing_pair_makes_cell_inconclusive_not_pass():
    samples = [
        s
        for s in run_of(FIELD_LIKE)
        if not (s["pair"] == 4 and s["fixture"] == "structured" and s["arm"] == "candidate")
    ]
    r = analyze(PLAN, samples)
    g = {(v.kind, v.family): v for v in r.gates}
    assert g[("gain", "structured")].verdict == "inconclusive"
    assert g[("gain", "structured")].valid_pairs == 4
    assert g[("non_regression", "code")].verdict == "pass"
    assert r.verdict == "inconclusive"
    assert {c.family: len(c.valid_pairs) for c in r.cells}["combined"] == 4


@pytest.mark.parametrize(
    "over, problem",
    [
        ({"ok": False, "error": "timeout"}, "request failed: timeout"),
        ({"predicted_n": 300}, "generated 300 tokens, planned 512"),
        ({"cache_n": 8191}, "from the cache"),
        ({"prompt_tokens": 8192, "prompt_n": 1}, "evaluated 1 prompt tokens, 8192 were sent"),
        ({"ttft_s": None}, "ttft_s is None"),
        ({"predicted_per_second": float("inf")}, "predicted_per_second is inf"),
    ],
)
def test_invalid_samples_are_named_and_excluded(over, problem):
    samples = run_of(FIELD_LIKE)
    samples[0].update(over)  # pair 0, baseline, code
    assert problem in sample_problem(samples[0], 512)
    r = analyze(PLAN, samples)
    assert [(i["pair"], i["arm"], i["fixture"]) for i in r.samples_invalid] == [(0, "baseline", "code")]
    assert problem in r.samples_invalid[0]["problem"]
    assert {v.family: v.verdict for v in r.gates if v.kind == "non_regression"}["code"] == "inconclusive"


def test_prompt_mismatch_between_arms_invalidates_pair():
    samples = run_of(FIELD_LIKE)
    samples[1]["prompt_sha256"] = "other"  # pair 0 candidate code
    r = analyze(PLAN, samples)
    assert any("prompt differs" in i["problem"] for i in r.samples_invalid)
    assert len({c.family: c for c in r.cells}["code"].valid_pairs) == 4


def test_duplicate_sample_is_invalid():
    samples = run_of(FIELD_LIKE)
    samples.append(dict(samples[0]))
    r = analyze(PLAN, samples)
    assert any("duplicate" in i["problem"] for i in r.samples_invalid)


def test_flags_wall_and_ttft_are_speed_ratios_and_never_decide():
    samples = run_of(FIELD_LIKE)
    for s in samples:
        if s["arm"] == "candidate" and s["fixture"] == "prose":
            s["wall_s"], s["ttft_s"] = 11.0, 1.2  # candidate slower outside the server's timings
    r = analyze(PLAN, samples)
    f = {(x.metric, x.family): x for x in r.flags}
    assert f[("client_wall", "prose")].ratio == pytest.approx(10 / 11) and f[("client_wall", "prose")].ok is False
    assert f[("ttft", "prose")].ratio == pytest.approx(1 / 1.2) and f[("ttft", "prose")].ok is False
    assert f[("client_wall", "code")].ok is True
    assert r.verdict == "pass"  # flags are reported, gates decide


def test_memory_and_pp_ratios():
    samples = run_of(FIELD_LIKE)
    for s in samples:
        if s["arm"] == "candidate":
            s["peak_memory_bytes"] = 1100
            s["prompt_per_second"] = 990.0
    r = analyze(PLAN, samples)
    c = {c.family: c for c in r.cells}["code"]
    assert c.memory_ratio == pytest.approx(1.1)
    assert c.pp_ratio == pytest.approx(0.99)
    samples[0]["peak_memory_bytes"] = None  # not measured: no ratio, never a made-up one
    assert {c.family: c for c in analyze(PLAN, samples).cells}["code"].memory_ratio is None


def test_result_json_roundtrip_has_every_gate():
    import json

    r = analyze(PLAN, run_of(FIELD_LIKE), plan_sha256="abc")
    j = json.loads(json.dumps(r.to_json()))
    assert j["verdict"] == "pass" and j["plan_sha256"] == "abc"
    assert len(j["gates"]) == 1 + 3 and j["cells"][2]["tg"]["interval"]["method"] == "student-t"
    assert j["cells"][2]["tg"]["bootstrap"]["method"] == "exact" and j["deciding_method"] == "student-t"
