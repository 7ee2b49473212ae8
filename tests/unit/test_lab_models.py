"""The lab's tiny GGUF models: deterministic, readable, shaped as llama.cpp needs them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader

from orchestrator.hashing import sha256_file
from orchestrator.lab.models import (
    EOS_ID,
    MIN_VOCAB,
    ensure_lab_models,
    lab_vocab,
    models_present,
    write_llama_gguf,
)


def _field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in GGUFReader(path).tensors}


def test_same_seed_gives_byte_identical_files(tmp_path):
    a = write_llama_gguf(tmp_path / "a.gguf", seed=5)
    b = write_llama_gguf(tmp_path / "b.gguf", seed=5)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert a["sha256"] == b["sha256"] == sha256_file(tmp_path / "a.gguf")


def test_other_seed_gives_other_weights(tmp_path):
    write_llama_gguf(tmp_path / "a.gguf", seed=5)
    write_llama_gguf(tmp_path / "b.gguf", seed=6)
    ta, tb = _tensors(tmp_path / "a.gguf"), _tensors(tmp_path / "b.gguf")
    assert ta.keys() == tb.keys()
    assert not np.array_equal(ta["blk.0.attn_q.weight"], tb["blk.0.attn_q.weight"])


def test_lab_model_metadata_is_llama_with_head_size_32(tmp_path):
    models = ensure_lab_models(tmp_path)
    r = GGUFReader(models.paths["target"])
    assert _field(r, "general.architecture") == "llama"
    n_embd, n_head = _field(r, "llama.embedding_length"), _field(r, "llama.attention.head_count")
    assert (n_embd, n_head, _field(r, "llama.block_count")) == (128, 4, 2)
    assert n_embd // n_head == 32 == _field(r, "llama.rope.dimension_count")
    assert _field(r, "llama.context_length") >= 8192
    assert _field(r, "tokenizer.ggml.model") == "llama"
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == _field(r, "llama.vocab_size") == len(_field(r, "tokenizer.ggml.token_type"))
    assert all(f"<0x{b:02X}>" in tokens for b in range(256)), "every byte needs a fallback token"
    assert {t.tensor_type.name for t in r.tensors} == {"F32"}


def test_draft_same_shares_every_tensor_and_draft_other_shares_none(tmp_path):
    models = ensure_lab_models(tmp_path)
    target, same, other = (_tensors(models.paths[k]) for k in ("target", "draft_same", "draft_other"))
    assert target.keys() == same.keys() == other.keys()
    for name, arr in target.items():
        assert np.array_equal(arr, same[name]), name
        if not name.endswith("norm.weight"):
            assert not np.array_equal(arr, other[name]), name


def test_greedy_never_picks_eos_or_unprintable(tmp_path):
    """Output rows of specials and non-printable bytes are zero, so they never win an argmax."""
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, seed=3)
    out = _tensors(path)["output.weight"]
    tokens, _, _ = lab_vocab(out.shape[0])
    assert not out[EOS_ID].any()
    assert not out[tokens.index("<0x0A>")].any() and not out[tokens.index("<0xFF>")].any()
    assert out[tokens.index("a")].any()


def test_models_json_records_hashes_and_detects_a_changed_byte(tmp_path):
    ensure_lab_models(tmp_path)
    index = json.loads((tmp_path / "models.json").read_text())["models"]
    for role, rec in index.items():
        assert rec["sha256"] == sha256_file(tmp_path / rec["file"]), role
        assert rec["shape"]["head_dim"] == 32
    assert models_present(tmp_path)
    p = tmp_path / "draft-other.gguf"
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x01
    p.write_bytes(bytes(data))
    assert not models_present(tmp_path)
    ensure_lab_models(tmp_path)  # rewrites what changed
    assert models_present(tmp_path)
    assert sha256_file(p) == index["draft_other"]["sha256"]


def test_bf16_variant_for_kernel_cases(tmp_path):
    """The kernels' case: BF16 matmuls with K=320 and M=10240."""
    rec = write_llama_gguf(tmp_path / "k.gguf", n_embd=320, n_head=10, n_ff=10240, n_vocab=10240, dtype="bf16", seed=9)
    r = GGUFReader(tmp_path / "k.gguf")
    types = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    assert types["blk.0.ffn_up.weight"] == ("BF16", [320, 10240])  # ggml ne: K=320 in, M=10240 out
    assert types["output.weight"] == ("BF16", [320, 10240])
    assert types["blk.0.attn_norm.weight"][0] == "F32"
    assert rec["shape"]["head_dim"] == 32 and _field(r, "general.file_type") == 32


@pytest.mark.parametrize(
    "kwargs",
    [dict(n_embd=130, n_head=4), dict(n_vocab=MIN_VOCAB - 1), dict(dtype="q4_0"), dict(n_head=4, n_head_kv=3)],
)
def test_impossible_shapes_are_refused(tmp_path, kwargs):
    with pytest.raises(ValueError):
        write_llama_gguf(tmp_path / "x.gguf", **kwargs)
    assert not (tmp_path / "x.gguf").exists()


def test_output_projection_is_one_cycle_over_printable_tokens(tmp_path):
    """Each printable token's embedding scores its successor far above every other token, and the
    successors form a single cycle (no short loop like "aaaa")."""
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, seed=11)
    t = _tensors(path)
    emb, out = t["token_embd.weight"], t["output.weight"]
    speakable = np.flatnonzero(np.abs(out).sum(axis=1) > 0)
    logits = emb[speakable] @ out.T  # what the output layer scores after each printable token
    succ = dict(zip(speakable.tolist(), logits.argmax(axis=1).tolist(), strict=True))
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 20  # a wide greedy margin
    seen, tok = [], int(speakable[0])
    while tok not in seen:
        seen.append(tok)
        tok = succ[tok]
    assert len(seen) == len(speakable) and tok == seen[0]


def test_a_deep_or_huge_models_index_is_rewritten_not_a_recursion_error(tmp_path):
    """Issue 49 item 7: every local file pairctl reads is bounded; a models.json nested 200,000
    deep was a RecursionError out of `lab up` (json.loads), now it reads as a damaged index."""
    from orchestrator.evidence.safejson import INDEX_MAX_BYTES
    from orchestrator.lab.models import models_present

    for content in (b"[" * 200_000 + b"]" * 200_000, b" " * (INDEX_MAX_BYTES + 1)):
        (tmp_path / "models.json").write_bytes(content)
        assert models_present(tmp_path) is False
