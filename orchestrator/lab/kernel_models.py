"""The lab's tiny model variant for the MMVF kernel patch: `ensure_kmmvf_models(home)`.

A BF16 llama with n_embd 320 and n_ff 10240 (BF16 `ffn_gate`/`ffn_up` with K = 320, M = 10240):
with a same-weights draft and `--spec-draft-n-max 3` every verification batch is the 4-column
MUL_MAT the patch targets. Head size 64, because CUDA's flash-attention kernels have none of 32
and a remote CUDA ggml-rpc-server aborted on the first graph. Deterministic bytes (lab.models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.evidence.safejson import read_index
from orchestrator.lab.models import records_match, write_index, write_llama_gguf
from orchestrator.paths import Home

KMMVF_SHAPE: dict[str, Any] = {
    "n_layer": 2,
    "n_embd": 320,
    "n_head": 5,
    "n_ff": 10240,
    "n_vocab": 384,
    "ctx": 4096,
    "dtype": "bf16",
}
KMMVF_SEED = 320_10240
KMMVF_FILES = {"target": "kmmvf-target.gguf", "draft_same": "kmmvf-draft-same.gguf"}
KMMVF_INDEX = "kmmvf.json"


def kmmvf_folder(home: Home) -> Path:
    return home.lab / "models"


def _present(folder: Path) -> bool:
    try:
        data = read_index(folder / KMMVF_INDEX)
        if data.get("shape") != KMMVF_SHAPE or data.get("seed") != KMMVF_SEED:
            return False
        return records_match(folder, KMMVF_FILES, data["models"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def ensure_kmmvf_models(home: Home | Path | str) -> dict[str, Path]:
    """Write (unless intact) the BF16 K320/M10240 `target` and `draft_same`; return role -> path
    (`kmmvf.json` records sha256, size and shape)."""
    home = home if isinstance(home, Home) else Home.resolve(home)
    folder = kmmvf_folder(home)
    folder.mkdir(parents=True, exist_ok=True)
    if not _present(folder):
        records = {
            role: write_llama_gguf(folder / fname, seed=KMMVF_SEED, name=f"pairctl-kmmvf-{role}", **KMMVF_SHAPE)
            for role, fname in KMMVF_FILES.items()
        }
        write_index(folder / KMMVF_INDEX, {"format": 1, "shape": KMMVF_SHAPE, "seed": KMMVF_SEED, "models": records})
    return {role: folder / fname for role, fname in KMMVF_FILES.items()}
