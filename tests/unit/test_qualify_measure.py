"""`measure` on llama-server's real answers, captured from the pinned build (lab profile: 2 slots,
Q8 KV, draft-simple same-weights draft, --rpc to a CPU ggml-rpc-server; lab-code fixture cut to
200 tokens, 128 generated, cache_prompt false, ignore_eos). Replayed through the real SSE parser."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from orchestrator.qualify.analysis import sample_problem
from orchestrator.qualify.measure import Prompt, measure, prompts_for, request_params
from orchestrator.qualify.plan import load_plan
from orchestrator.server import parsers

DATA = Path(__file__).parent / "data" / "qualify"


class Replay:
    def __init__(self, sse: str):
        self.sse = sse
        self.sent = None

    def tokenize(self, text):
        return parsers.parse_tokenize((DATA / "tokenize-lab-code.json").read_bytes())

    @contextmanager
    def stream_completion(self, prompt, n_predict, **params):
        self.sent = (prompt, n_predict, params)
        yield None, parsers.parse_sse_lines(self.sse.splitlines())


def test_real_stream_gives_a_valid_sample():
    ids = tuple(parsers.parse_tokenize((DATA / "tokenize-lab-code.json").read_bytes())[:200])
    client = Replay((DATA / "stream-lab-code-200-128.sse").read_text())
    row = measure(
        client,
        Prompt("code", "code", "f" * 64, ids),
        n_predict=128,
        params=request_params(42, 0.0),
        memory=lambda: (28816 * 1024, "test"),
        base={"pair": 0, "arm": "baseline", "seq": 0},
    )
    assert row["ok"] and row["error"] is None
    assert (row["prompt_n"], row["predicted_n"], row["cache_n"]) == (200, 128, 0)
    assert (row["draft_n"], row["draft_n_accepted"]) == (96, 95)
    assert row["predicted_per_second"] > 900 and row["prompt_ms"] > 0 and row["stop_type"] == "limit"
    assert 0 < row["ttft_s"] <= row["wall_s"] and row["chunks"] == 129
    assert sample_problem(row, 128) is None
    prompt, n, params = client.sent
    assert prompt == list(ids) and n == 128 and params["cache_prompt"] is False and params["ignore_eos"] is True


def test_stream_cut_before_the_final_event_is_a_failed_sample_not_a_crash():
    text = (DATA / "stream-lab-code-200-128.sse").read_text()
    cut = text[: text.rindex("data:")]  # drop the final event that carries the timings
    row = measure(Replay(cut), Prompt("code", "code", "f" * 64, (1, 2)), n_predict=128, params={}, memory=None, base={})
    assert row["ok"] is False and "without a final event" in row["error"]
    assert "request failed" in sample_problem(row, 128)


def test_server_error_mid_stream_is_a_failed_sample():
    row = measure(
        Replay('data: {"error": {"code": 500, "message": "boom", "type": "server_error"}}\n'),
        Prompt("code", "code", "f" * 64, (1,)),
        n_predict=128,
        params={},
        memory=None,
        base={},
    )
    assert row["ok"] is False and "ParseError" in row["error"]


def test_prompts_cut_to_declared_tokens_with_the_servers_tokenizer():
    loaded = load_plan("lab")
    client = Replay("")
    ps = prompts_for(loaded, client.tokenize, 2048)
    assert [len(p.tokens) for p in ps] == [200, 200]
    assert ps[0].tokens == tuple(client.tokenize("")[:200])
