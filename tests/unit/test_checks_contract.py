"""request_contract's judges (checks/contract_probes.py) on answers recorded from the pinned
baseline serving the real model (tests/unit/golden/contract_smollm2.json, recorded 2026-12-06 with
the lab-real shape: two slots, Q8 KV, draft-simple 3/1), and on the same answers changed the way
each contract mutant in tests/mutants changes them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.checks import contract
from orchestrator.checks import contract_probes as cp
from orchestrator.checks.base import CheckResult
from orchestrator.config.profiles import RouteProfile
from orchestrator.config.request_surface import DEFAULT_SURFACE, KNOWN_FIELDS

REC = json.loads((Path(__file__).parent / "golden" / "contract_smollm2.json").read_text())


def test_the_recorded_baseline_keeps_every_contract():
    g = REC["greedy"]
    assert cp.n_predict_problems(g, cp.GREEDY_TOKENS) == []
    assert cp.n_probs_problems(g, cp.N_PROBS, drafting=True) == []
    assert cp.choose_stop(g["content"]) == REC["stop"]
    assert cp.stop_problems(g, REC["stopped"], REC["stop"]) == []
    assert cp.logit_bias_problems(g, REC["banned"], REC["boosted"]) == []
    assert cp.keep_one_problems("top_k", cp.tokens_of(g), cp.tokens_of(g)) == []
    assert cp.max_tokens_problems(REC["chat"], cp.CHAT_TOKENS) == []
    assert cp.logprobs_problems(REC["chat"], cp.CHAT_TOKENS, cp.TOP_LOGPROBS, drafting=True) == []
    r = REC["rendered"]
    assert cp.template_problems(r["system_a"], r["system_b"], r["no_system"], cp.USER) == []
    assert cp.stream_problems(REC["events"], REC["chat"]) == []
    assert cp.grammar_problems(REC["grammar"]) == []
    assert cp.schema_problems(REC["schema"]) == []


def test_stop_word_kept_fails_stop():
    stopped = dict(REC["stopped"], content=REC["stopped"]["content"] + REC["stop"])
    (msg,) = cp.stop_problems(REC["greedy"], stopped, REC["stop"])
    assert "want the text before the first" in msg


def test_a_sampler_parameter_not_applied_fails_keep_one_and_a_greedy_sampler_fails_keep_many():
    g = cp.tokens_of(REC["greedy"])
    assert cp.keep_one_problems("top_k", g, [g[0] + 1, *g[1:]])
    assert cp.keep_many_problems(g, list(g))


def test_a_dropped_system_message_fails_messages():
    r = REC["rendered"]
    dropped = r["system_a"].replace(cp.SYSTEM_A, "")
    assert cp.template_problems(dropped, r["system_b"].replace(cp.SYSTEM_B, ""), r["no_system"], cp.USER)


def test_an_ignored_ban_fails_logit_bias():
    banned = dict(REC["banned"], tokens=cp.tokens_of(REC["greedy"])[:1])
    (msg,) = cp.logit_bias_problems(REC["greedy"], banned, REC["boosted"])
    assert "banned" in msg


def test_an_unconstrained_answer_fails_grammar_and_response_format():
    assert cp.grammar_problems({"content": " \nzephyr \n", "stop_type": "limit"})
    answer = copy.deepcopy(REC["schema"])
    answer["choices"][0]["message"]["content"] = 'Sure! {"color": "blue"}'
    assert cp.schema_problems(answer)


def test_a_stream_that_says_stop_for_a_cut_answer_fails_stream():
    events = copy.deepcopy(REC["events"])
    for e in events:
        for c in e.get("choices") or []:
            if c.get("finish_reason") == "length":
                c["finish_reason"] = "stop"
    (msg,) = cp.stream_problems(events, REC["chat"])
    assert "finish_reason" in msg
    assert cp.stream_problems([e for e in REC["events"] if e.get("choices")], REC["chat"])  # no usage chunk


def test_n_probs_entries_short_fail():
    g = copy.deepcopy(REC["greedy"])
    g["completion_probabilities"][0]["top_logprobs"].pop()
    assert cp.n_probs_problems(g, cp.N_PROBS, drafting=True)


def test_the_surface_report_names_checked_and_unchecked_fields():
    profile = RouteProfile(name="p", ctx_size=4096, parallel=2, near_full_slack=64)
    assert profile.request_surface == list(DEFAULT_SURFACE)
    covered = {f: f"{contract.NAME}/{f}" for f in DEFAULT_SURFACE if f not in ("tools", "seed")}
    covered["stream_options"] = f"{contract.NAME}/stream"
    ran = CheckResult(name=contract.NAME, verdict="failed", figures={"failed_probes": ["stop"]},
                      raw={"covered": covered})  # fmt: skip
    rep = contract.surface_report(profile, [ran, CheckResult(name="sampling", verdict="passed")])
    assert rep["checked"]["stop"] == {"by": f"{contract.NAME}/stop", "verdict": "failed"}
    assert rep["checked"]["seed"] == {"by": "sampling", "verdict": "passed"}
    assert rep["unchecked"] == {"tools": "no probe for this field"}
    assert rep["not_declared"] == ["frequency_penalty", "presence_penalty"]
    none = contract.surface_report(profile, [])
    assert set(none["unchecked"]) == set(DEFAULT_SURFACE) and not none["checked"]
    assert none["unchecked"]["stop"] == f"{contract.NAME} did not run"


def test_a_surface_names_only_known_fields():
    RouteProfile(name="p", ctx_size=4096, parallel=2, near_full_slack=64, request_surface=list(KNOWN_FIELDS))
    with pytest.raises(ValidationError):
        RouteProfile(name="p", ctx_size=4096, parallel=2, near_full_slack=64, request_surface=["stop", "nonsense"])


def test_a_refused_probe_request_fails_that_probe_saying_what_the_server_answered():
    from orchestrator.server.client import ServerRequestError, ServerUnreachable

    out: list[cp.ProbeResult] = []
    # grammar-not-applied on the tiny model: the json_schema chat came back HTTP 500
    msg = "POST /v1/chat/completions: HTTP 500: server_error: The model produced output that does not match"

    def refused() -> contract.Judged:
        raise ServerRequestError(msg, status=500)

    contract._probe(out, "response_format", ("response_format",), refused)
    assert out[0].problems == [f"response_format: the server answered ServerRequestError: {msg}"]

    def gone() -> contract.Judged:
        raise ServerUnreachable("connection refused")

    with pytest.raises(ServerUnreachable):  # not a contract question: the suite stops on it
        contract._probe(out, "stop", ("stop",), gone)
