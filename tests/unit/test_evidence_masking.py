"""Secrets are masked at the source: argv, command-line strings, secret-named keys."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.evidence import jsonable
from orchestrator.evidence.masking import MASK, is_secret_key, mask_argv, mask_data, mask_text, may_hold_secret


class Secret:  # the shape of orchestrator.remote.command.Secret, matched by class name
    def __init__(self, value: str) -> None:
        self.value = value

    def __str__(self) -> str:  # what a careless str() would leak
        return self.value


def test_argv_masks_value_after_secret_flags_and_keeps_flags():
    argv = ["llama-server", "--api-key", "s3cr3t", "--hf-token", "hf_abc", "--port", "8080", "--password", "pw"]
    assert mask_argv(argv) == [
        "llama-server",
        "--api-key",
        MASK,
        "--hf-token",
        MASK,
        "--port",
        "8080",
        "--password",
        MASK,
    ]


def test_argv_masks_equals_form_env_form_and_secret_objects():
    out = mask_argv(["--api-key=s3cr3t", "LLAMA_API_KEY=s3cr3t", Secret("s3cr3t"), "-x"])
    assert out == ["--api-key=***", "LLAMA_API_KEY=***", MASK, "-x"]
    assert "s3cr3t" not in json.dumps(out)


def test_argv_leaves_non_secret_flags_alone():
    argv = ["--api-key-file", "/etc/key", "--max-tokens", "64", "--n-predict", "8", "--ssl-key-file", "k.pem"]
    assert mask_argv(argv) == argv


def test_mask_text_inside_command_lines_urls_and_bearer():
    line = "/opt/llama-server --port 8080 --api-key s3cr3t --token=t0k -m m.gguf"
    assert mask_text(line) == "/opt/llama-server --port 8080 --api-key *** --token=*** -m m.gguf"
    assert mask_text("https://user:pa55@host/x") == "https://user:***@host/x"
    assert mask_text("Authorization: Bearer abc.def") == "Authorization: Bearer ***"


def test_secret_keys_match_on_last_word_only():
    for k in ("api_key", "apiKey", "API-KEY", "hf_token", "token", "password", "client_secret", "Authorization"):
        assert is_secret_key(k), k
    for k in ("n_tokens", "tokens_predicted", "token_count", "bos_token", "eos_token", "secrets_dir_exists", "key"):
        assert not is_secret_key(k), k


def test_mask_data_nested_keys_argv_lists_and_strings():
    data = {
        "api_key": "s3cr3t",
        "n_tokens": 512,
        "nested": [{"password": "pw", "ok": 1}],
        "process_argv": ["llama-server", "--api-key", "s3cr3t", "--port", "1"],
        "cmdline": "llama-server --api-key s3cr3t",
        "none_token": None,
    }
    out = mask_data(data)
    assert "s3cr3t" not in json.dumps(out) and "pw" not in json.dumps(out)
    assert out["n_tokens"] == 512 and out["nested"][0]["ok"] == 1 and out["none_token"] is None
    assert out["process_argv"] == ["llama-server", "--api-key", MASK, "--port", "1"]
    assert data["api_key"] == "s3cr3t"  # a copy: the caller's data is not changed


def test_jsonable_dumps_masks_and_converts():
    from pathlib import Path

    text = jsonable.dumps({"p": Path("/x"), "s": Secret("s3cr3t"), "token": "t0k", "n": {1, 2}})
    assert json.loads(text) == {"p": "/x", "s": MASK, "token": MASK, "n": [1, 2]}


_keys = st.sampled_from(["n_tokens", "tg_tps", "api_key", "token", "x", "hf-token", "cmd", "url", "Bearer", "pass"])
_vals = st.recursive(
    st.none()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["--api-key", "--token=x", "a --password b", "http://u:p@h/", "Bearer x", "s3cr3t"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_keys | st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_vals)
def test_fast_precheck_never_misses_something_mask_data_would_change(value):
    """The 100k-sample fast path skips mask_data when may_hold_secret is False: that must be safe."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if not may_hold_secret(text):
        assert mask_data(json.loads(text)) == json.loads(text)


def test_mask_data_keeps_types_in_argv_like_lists():
    assert mask_data([1, "--api-key", "v", {"a": 2}]) == [1, "--api-key", MASK, {"a": 2}]
