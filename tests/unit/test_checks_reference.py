"""Pure logic of reference answers: the logprob comparison, the gates, teacher forcing over a
scripted answerer, the reference pin and answer lookup over receipts, the fixture set model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.checks import logprobs as lp
from orchestrator.checks.oracle_fixtures import OracleFixtureSet, load_oracle_set, seeded_text
from orchestrator.checks.reference import (
    LEGACY_WHOLE_SUITE,
    STEP,
    answers_key,
    base_key,
    changed_fields,
    device_kind,
    numerics_fields,
    ran_whole_suite,
    state_from_receipts,
)
from orchestrator.checks.reference_logprobs import Answer, teacher_forced
from orchestrator.config.profiles import RouteProfile, load_profile
from orchestrator.config.reference_gates import GateFigures, derived
from orchestrator.server.parsers import ParseError, parse_token_logprobs


def dist(*logits: float) -> dict[int, float]:
    z = math.log(sum(math.exp(x) for x in logits))
    return {i: x - z for i, x in enumerate(logits)}


def test_identical_distributions_have_zero_kl_and_agree():
    d = lp.compare_position(dist(3, 1, 0), dist(3, 1, 0), floor=-80)
    assert d.kl == pytest.approx(0, abs=1e-12) and d.top1_agrees and d.max_abs_dlogprob == pytest.approx(0, abs=1e-12)


def test_kl_matches_the_definition_and_top1_flip_is_seen():
    r, c = dist(2.0, 1.9, 0), dist(1.9, 2.0, 0)
    d = lp.compare_position(r, c, floor=-80)
    want = sum(math.exp(r[i]) * (r[i] - c[i]) for i in r)
    assert d.kl == pytest.approx(want, rel=1e-9) and not d.top1_agrees


def test_a_runner_up_shift_on_a_peaked_distribution_moves_dlogprob_not_kl():
    """The lab target's case: the top token holds all the mass; a runner-up moves by 4.5 nats."""
    r, c = dist(0.0, -66.5, -70.0), dist(0.0, -62.0, -70.0)
    d = lp.compare_position(r, c, floor=-80)
    assert d.kl < 1e-20 and d.top1_agrees
    assert d.max_abs_dlogprob == pytest.approx(4.5, abs=1e-6) and d.worst_token == 1


def test_floor_clamps_underflow_and_missing_tokens():
    r = {0: 0.0, 1: -3.4e38}  # log(0) as llama-server writes it
    c = {0: 0.0}  # token 1 dropped below the floor
    assert lp.compare_position(r, c, floor=-80).max_abs_dlogprob == 0
    # a top-K cut (not complete): a missing token counts as that side's smallest listed value
    d = lp.compare_position({0: 0.0, 1: -5.0, 2: -9.0}, {0: 0.0, 1: -5.0}, floor=-80, complete=False)
    assert d.max_abs_dlogprob == pytest.approx(4.0)


def test_a_token_crossing_the_top_k_cut_is_kept_apart_from_what_both_sides_list():
    """The real model's case: token 2 leaves the candidate's top-K, so the gated union figure is
    the distance to the candidate's smallest listed value (6 nats), while the tokens both sides
    list moved by at most 0.05: the size of the numeric change itself."""
    r = {0: -0.1, 1: -2.0, 2: -6.0}
    c = {0: -0.12, 1: -2.05, 3: -0.2 - 11.8}
    d = lp.compare_position(r, c, floor=-80, complete=False)
    assert d.max_abs_dlogprob == pytest.approx(6.0)
    assert d.shared_max_abs_dlogprob == pytest.approx(0.05)
    assert lp.compare_position(r, r, floor=-80, complete=False).shared_max_abs_dlogprob == 0


def test_gates_name_each_figure_missed():
    s = lp.Summary(positions=10, mean_kl=0.5, max_kl=2.0, top1=0.8, max_abs_dlogprob=3.0)
    p = lp.gate_problems(s, max_mean_kl=1e-3, max_kl=0.02, min_top1=0.99, max_abs_dlogprob=0.25)
    assert [x.split()[0] + x.split()[1] for x in p] == ["meanKL", "maxKL", "top-1agreement", "max|delta"]
    ok = lp.Summary(positions=10, mean_kl=0, max_kl=0, top1=1.0, max_abs_dlogprob=0.01)
    assert lp.gate_problems(ok, max_mean_kl=1e-3, max_kl=0.02, min_top1=0.99, max_abs_dlogprob=0.25) == []


def test_trimmed_keeps_ids_above_floor_rounded():
    assert lp.trimmed({5: -1.23456789, 2: -0.1, 7: -3.4e38}, -80) == [[2, -0.1], [5, -1.234568]]


@dataclass
class ScriptedAsker:
    """Answers like a greedy server whose token at absolute position `flip_at` differs from the
    reference's; a continuation from the reference's prefix agrees again (pure test double)."""

    ref: list[int]
    flip_at: set[int]
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def _answer(self, start: int, n: int) -> Answer:
        toks = [(t + 1 if start + i in self.flip_at else t) for i, t in enumerate(self.ref[start : start + n])]
        return Answer(toks, [{t: 0.0, start + i + 1000: -1.0} for i, t in enumerate(toks)])

    def first(self, endpoint: str, prompt: Any, n: int) -> Answer:
        self.calls.append(("first", 0, n))
        return self._answer(0, n)

    def cont(self, prefix: Any, forced: list[int], n: int) -> Answer:
        assert forced == self.ref[: len(forced)], "continuations must follow the reference's tokens"
        self.calls.append(("cont", len(forced), n))
        # after a forced prefix, the server's greedy at the flipped position agrees (the position is past it)
        return self._answer(len(forced), n)


def test_teacher_forcing_continues_from_the_reference_prefix_after_each_flip():
    ref = list(range(10, 20))
    asker = ScriptedAsker(ref, flip_at={3, 7})
    got, flips, first = teacher_forced(asker, {"tokens": ref, "endpoint": "completion", "prompt": "p", "prefix": "p"})
    assert len(got.positions) == 10 and flips == 2 and first == 3
    assert asker.calls == [("first", 0, 10), ("cont", 4, 6), ("cont", 8, 2)]


def test_teacher_forcing_stops_when_the_server_answers_nothing():
    class Short(ScriptedAsker):
        def cont(self, prefix, forced, n):
            return Answer([], [])

    got, flips, _ = teacher_forced(
        Short(list(range(5)), {1}), {"tokens": list(range(5)), "endpoint": "chat", "prompt": "p", "prefix": "t"}
    )
    assert len(got.positions) == 2 and flips == 1


@dataclass
class FakeStep:
    data: dict[str, Any]


@dataclass
class FakeReceipt:
    sha256: str
    command: str
    outcome: str = "passed"
    raw: dict[str, Any] | None = None
    # a deploy/accept that ran the whole suite (checks.suite records it; issue 42 item 5)
    fields: dict[str, Any] = field(default_factory=lambda: {"acceptance_whole_suite": True})

    def step(self, name: str) -> FakeStep | None:
        return FakeStep({"raw": self.raw}) if name == STEP and self.raw is not None else None

    def extra_fields(self) -> dict[str, Any]:
        return self.fields


def ref_raw(pkgs: tuple[str, str], key: str) -> dict[str, Any]:
    return {"role": "reference", "packages": list(pkgs), "key": key, "answers": []}


def test_first_accepted_pair_becomes_the_reference_and_candidates_never_do():
    rs = [
        FakeReceipt("r0", "deploy", outcome="failed", raw=ref_raw(("x", "x"), "k0")),
        FakeReceipt("r1", "deploy", raw=ref_raw(("a", "a"), "k1")),
        FakeReceipt("r2", "deploy", raw={"role": "candidate", "packages": ["b", "b"], "key": "k1"}),
        FakeReceipt("r3", "accept", raw=ref_raw(("a", "a"), "k2")),
    ]
    st = state_from_receipts(rs)
    assert st.pin is not None and st.pin.packages() == ("a", "a") and st.pin.how == "first accepted"
    assert set(st.answers) == {"k1", "k2"} and st.answers["k1"].receipt == "r1"


def test_a_set_reference_wins_and_only_its_answers_count():
    rs = [
        FakeReceipt("r1", "deploy", raw=ref_raw(("a", "a"), "k1")),
        FakeReceipt("r2", "reference", fields={"reference": {"native_package": "b", "rpc_package": "b"}}),
        FakeReceipt("r3", "deploy", raw=ref_raw(("b", "b"), "k9")),
    ]
    st = state_from_receipts(rs)
    assert st.pin is not None and st.pin.packages() == ("b", "b") and st.pin.how == "set" and st.pin.receipt == "r2"
    assert set(st.answers) == {"k9"}
    assert state_from_receipts([]).pin is None


def test_a_run_limited_to_some_checks_never_makes_or_feeds_the_reference():
    """Issue 42 item 5: `deploy --checks reference_logprobs` passed with that one check and made its
    pair the route's reference. A receipt counts only when its acceptance ran the whole suite."""
    limited = {"acceptance_whole_suite": False, "acceptance_plan": ["check:reference_logprobs"]}
    rs = [
        FakeReceipt("r1", "deploy", raw=ref_raw(("x", "x"), "k0"), fields=limited),
        FakeReceipt("r2", "deploy", raw=ref_raw(("a", "a"), "k1")),
        FakeReceipt("r3", "accept", raw=ref_raw(("a", "a"), "k2"), fields=limited),
    ]
    st = state_from_receipts(rs)
    assert st.pin is not None and st.pin.packages() == ("a", "a") and st.pin.receipt == "r2"
    assert set(st.answers) == {"k1"}
    assert state_from_receipts(rs[:1]).pin is None


def test_receipts_from_before_the_flag_count_only_with_the_whole_plan():
    whole = sorted(LEGACY_WHOLE_SUITE)
    old_whole = FakeReceipt("r1", "deploy", raw=ref_raw(("a", "a"), "k1"), fields={"acceptance_plan": whole})
    old_limited = FakeReceipt(
        "r0", "deploy", raw=ref_raw(("x", "x"), "k0"), fields={"acceptance_plan": ["check:reference_logprobs"]}
    )
    no_plan = FakeReceipt("r9", "accept", raw=ref_raw(("y", "y"), "k9"), fields={})
    assert ran_whole_suite(old_whole) and not ran_whole_suite(old_limited) and not ran_whole_suite(no_plan)
    st = state_from_receipts([no_plan, old_limited, old_whole])
    assert st.pin is not None and st.pin.receipt == "r1"


def test_the_legacy_plan_is_the_suite_of_today():
    from orchestrator.checks.suite import CHECKS, STEP_PREFIX

    # frozen at the suite that ran before receipts said whether it was whole; checks added since
    # (request_contract) are not asked of those old receipts
    today = {STEP_PREFIX + n for n, fn in CHECKS.items() if fn is not None}
    assert LEGACY_WHOLE_SUITE <= today and today - LEGACY_WHOLE_SUITE == {STEP_PREFIX + "request_contract"}


def test_answers_key_depends_on_every_part():
    base = base_key(("a", "b"), {"target": "1"}, {"model": "target", "per_slot_ctx": 2048}, "f")
    assert base == base_key(("a", "b"), {"target": "1"}, {"per_slot_ctx": 2048, "model": "target"}, "f")
    for other in (
        base_key(("a", "c"), {"target": "1"}, {"model": "target", "per_slot_ctx": 2048}, "f"),
        base_key(("a", "b"), {"target": "2"}, {"model": "target", "per_slot_ctx": 2048}, "f"),
        base_key(("a", "b"), {"target": "1"}, {"model": "target", "per_slot_ctx": 1024}, "f"),
        base_key(("a", "b"), {"target": "1"}, {"model": "target", "per_slot_ctx": 2048}, "g"),
    ):
        assert other != base
    assert answers_key(base, {"cache_type_k": "q8_0"}) != answers_key(base, {"cache_type_k": "f16"})


def _profile(**kw: Any) -> RouteProfile:
    return load_profile("lab").model_copy(update=kw)


def test_numerics_key_holds_kv_types_and_flash_attention_but_not_threads_or_batches():
    cpu = {"native": "cpu", "rpc": "cpu"}
    lab = numerics_fields(_profile(), cpu)
    assert lab == {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on", "device_kinds": ["cpu"]}
    assert numerics_fields(_profile(threads=2, ubatch_size=64, batch_size=512, draft=None), cpu) == lab
    assert numerics_fields(_profile(n_gpu_layers=1), cpu) == lab  # layers moved between identical backends
    assert numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16"), cpu) != lab
    assert numerics_fields(_profile(flash_attn="off", cache_type_v="f16"), cpu) != lab


def test_numerics_key_holds_threads_and_ubatch_where_the_cpu_sums_an_f16_cache_in_their_order():
    """The pinned CPU flash-attention kernel splits an f16/f32 cache across threads for one-token
    steps and tiles batches (measured on the real lab model stored F16: 0.07-0.5 nats between 1
    and 2 threads, 0.008 between ubatch 256 and 64)."""
    cpu = {"native": "cpu", "rpc": "cpu"}
    f16 = numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16", threads=1), cpu)
    assert f16["threads"] == 1 and f16["ubatch_size"] == 256
    assert numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16", threads=2), cpu) != f16
    assert numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16", threads=1, ubatch_size=64), cpu) != f16
    assert numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16", threads=1, n_gpu_layers=1), cpu) == f16
    assert "threads" not in numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16", flash_attn="off"), cpu)
    assert "threads" not in numerics_fields(_profile(cache_type_k="f16", cache_type_v="q8_0"), cpu)
    gpu = {"native": "cuda:sm_90", "rpc": "cuda:sm_90"}
    assert "threads" not in numerics_fields(_profile(cache_type_k="f16", cache_type_v="f16"), gpu)
    assert "threads" in numerics_fields(_profile(cache_type_k="f32", cache_type_v="f32", n_gpu_layers=2), gpu)


def test_device_kind_reads_the_package_manifests_target():
    from types import SimpleNamespace

    from orchestrator.build.manifest import TargetRecord

    cpu = SimpleNamespace(target=TargetRecord(name="cpu-lab", spec={"backend": "cpu", "cuda_arch": None}))
    gpu = SimpleNamespace(target=TargetRecord(name="h200", spec={"backend": "cuda", "cuda_arch": "sm_90"}))
    assert device_kind(cpu) == "cpu" and device_kind(gpu) == "cuda:sm_90" and device_kind(None) == "unknown"


def test_numerics_key_holds_the_split_when_devices_differ():
    pair = {"native": "cuda:sm_70", "rpc": "cuda:sm_120"}
    a = numerics_fields(_profile(extra_args=["--tensor-split", "3,1"]), pair)
    assert a["device_kinds"] == ["cuda:sm_120", "cuda:sm_70"] and a["split"]["args"] == ["--tensor-split", "3,1"]
    assert numerics_fields(_profile(n_gpu_layers=40), pair)["device_kinds"] == ["cpu", "cuda:sm_120", "cuda:sm_70"]
    assert numerics_fields(_profile(n_gpu_layers=40), pair) != numerics_fields(_profile(n_gpu_layers=30), pair)
    same = {"native": "cuda:sm_90", "rpc": "cuda:sm_90"}
    assert "split" not in numerics_fields(_profile(extra_args=["--tensor-split", "3,1"]), same)


def test_gates_are_the_floor_times_the_factor_and_never_below_the_minimum():
    floor = GateFigures(max_mean_kl=1e-14, max_kl=5e-14, max_abs_dlogprob=5e-7)
    minimum = GateFigures(max_mean_kl=1e-9, max_kl=1e-8, max_abs_dlogprob=2e-3)
    assert derived(floor, 20, minimum) == minimum
    noisy = GateFigures(max_mean_kl=1e-8, max_kl=1e-6, max_abs_dlogprob=1e-3)
    g = derived(noisy, 20, minimum)
    assert g.max_kl == pytest.approx(2e-5) and g.max_abs_dlogprob == pytest.approx(0.02)
    assert g.max_mean_kl == pytest.approx(2e-7)


def test_nearest_answers_are_the_same_base_with_fewest_changed_fields():
    num = {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"}
    rs = [
        FakeReceipt("r1", "deploy", raw={**ref_raw(("a", "a"), "k1"), "base_key": "B", "numerics": num}),
        FakeReceipt("r2", "deploy", raw={**ref_raw(("a", "a"), "k2"), "base_key": "B",
                                         "numerics": {**num, "flash_attn": "off", "cache_type_v": "f16"}}),
        FakeReceipt("r3", "deploy", raw={**ref_raw(("a", "a"), "k3"), "base_key": "C", "numerics": num}),
    ]  # fmt: skip
    st = state_from_receipts(rs)
    want = {**num, "cache_type_k": "f16"}
    near = st.nearest("B", want)
    assert near is not None and near.key == "k1"
    assert changed_fields(near.raw["numerics"], want) == ["cache_type_k q8_0 -> f16"]
    assert st.nearest("Z", want) is None


def test_parse_token_logprobs_reads_all_three_endpoints():
    entry = {
        "id": 7,
        "token": "a",
        "logprob": -0.1,
        "top_logprobs": [{"id": 7, "logprob": -0.1}, {"id": 3, "logprob": -2.5}],
    }
    for body in ({"completion_probabilities": [entry]}, {"choices": [{"logprobs": {"content": [entry]}}]}):
        assert parse_token_logprobs(body, "x") == ([7], [{7: -0.1, 3: -2.5}])
    with pytest.raises(ParseError, match="no logprobs"):
        parse_token_logprobs({"choices": [{"text": "a"}]}, "/v1/completions")
    # a non-finite logprob arrives as null (mutant rpc-set-tensor-corrupt): -inf, judged by the gates
    broken = {**entry, "top_logprobs": [{"id": 7, "logprob": None}]}
    assert parse_token_logprobs({"completion_probabilities": [broken]}, "x") == ([7], [{7: float("-inf")}])
    with pytest.raises(ParseError, match="malformed"):
        parse_token_logprobs({"completion_probabilities": [{"id": 7, "top_logprobs": [{"id": 7}]}]}, "x")


def test_oracle_fixture_set_loads_and_refuses_bad_fixtures(tmp_path):
    fs = load_oracle_set("oracle-lab")
    assert {f.endpoint for f in fs.fixtures} == {"completion", "v1_completions", "chat"}
    assert any(f.near_full for f in fs.fixtures) and len(fs.sha256()) == 64
    with pytest.raises(ValidationError, match="exactly one of prompt or near_full"):
        OracleFixtureSet.model_validate({"name": "x", "fixtures": [{"id": "a", "prompt": "p", "near_full": True}]})
    with pytest.raises(ValidationError, match="cannot go through chat"):
        OracleFixtureSet.model_validate({"name": "x", "fixtures": [{"id": "a", "endpoint": "chat", "near_full": True}]})
    assert seeded_text(3, 50) == seeded_text(3, 50) != seeded_text(4, 50)


def test_positions_without_logprobs_are_filled_from_the_reference_prefix():
    """Drafted tokens come back without logprobs: each such gap is a continuation, not a flip."""

    class Drafting(ScriptedAsker):
        def _answer(self, start, n):
            a = super()._answer(start, n)
            return Answer(a.tokens, [p if i == 0 else {} for i, p in enumerate(a.positions)])

    ref = list(range(30, 35))
    asker = Drafting(ref, flip_at={2})
    got, flips, first = teacher_forced(asker, {"tokens": ref, "endpoint": "completion", "prompt": "p", "prefix": "p"})
    assert len(got.positions) == 5 and all(got.positions) and flips == 1 and first == 2
    assert [c[1] for c in asker.calls] == [0, 1, 2, 3, 4]
    # once drafting showed, a continuation asks only the tokens a server cannot draft
    assert [c[2] for c in asker.calls] == [5, 2, 2, 2, 1]


def test_a_drafting_server_is_walked_two_positions_a_request_and_a_plain_one_in_one():
    """Like the pinned server: logprobs for the first token after a prompt and for tokens made
    with one token left; tokens taken from a draft come back without."""

    class Drafting(ScriptedAsker):
        def _answer(self, start, n):
            a = super()._answer(start, n)
            keep = 2 if n <= 2 else 1
            return Answer(a.tokens, [p if i < keep else {} for i, p in enumerate(a.positions)])

    ref = list(range(40, 50))
    asker = Drafting(ref, flip_at=set())
    got, flips, _ = teacher_forced(asker, {"tokens": ref, "endpoint": "completion", "prompt": "p", "prefix": "p"})
    assert len(got.positions) == 10 and all(got.positions) and flips == 0
    assert asker.calls == [("first", 0, 10), ("cont", 1, 2), ("cont", 3, 2), ("cont", 5, 2), ("cont", 7, 2),
                           ("cont", 9, 1)]  # fmt: skip
    plain = ScriptedAsker(ref, flip_at={4})
    got, flips, _ = teacher_forced(plain, {"tokens": ref, "endpoint": "completion", "prompt": "p", "prefix": "p"})
    assert len(got.positions) == 10 and flips == 1 and plain.calls == [("first", 0, 10), ("cont", 5, 5)]


def test_exactly_full_passes_and_each_condition_fails():
    from orchestrator.checks.exactly_full import full_problems

    good = dict(
        prompt=2032,
        gen=16,
        evaluated=2032,
        predicted=16,
        stop_type="limit",
        over_status=400,
        over_type="exceed_context_size_error",
        over_predicted=16,
    )
    assert full_problems(**good) == []
    for change, text in [
        (dict(predicted=8), "fewer than its reported n_ctx"),
        (dict(evaluated=1984), "evaluated as"),
        (dict(over_status=None, over_type=None), "must refuse"),
        (dict(over_status=500, over_type="server_error"), "not 400"),
        (dict(over_predicted=17), "has room for"),
    ]:
        assert any(text in x for x in full_problems(**{**good, **change})), change
    assert full_problems(**{**good, "predicted": 14, "over_predicted": 14, "draft_room": 3}) == []
    assert full_problems(**{**good, "predicted": 12, "draft_room": 3})
