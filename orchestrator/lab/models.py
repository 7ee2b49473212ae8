"""Tiny llama GGUF models written from fixed seeds, for the lab and for kernel cases (pure:
same arguments, byte-identical file).

Shapes: the plain `llama` architecture, head size 32 (Q8 KV with flash attention), a byte-fallback
SPM vocabulary that tokenizes any text. Weights: the output projection maps each printable token
to the next of one random cycle, so the greedy choice wins by ~30 logits (numeric noise is ~0.01)
while attention and FFN still make output depend on context: greedy output is deterministic,
identical with and without drafting, printable, and never stops on EOS (set `n_predict`).
`draft-same` has the target's weights (drafts always accepted); `draft-other` another cycle
(drafts rejected).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from orchestrator.evidence import atomic
from orchestrator.evidence.safejson import read_index
from orchestrator.hashing import sha256_file

Dtype = Literal["f32", "f16", "bf16"]

# Token layout of the lab vocabulary (SPM, llama.cpp `tokenizer.ggml.model = llama`).
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = 3
N_BYTES = 256
SPACE = "\u2581"  # SentencePiece's word-boundary mark
PRINTABLE = [SPACE] + [chr(c) for c in range(0x21, 0x7F)]  # 95 single-character pieces
MIN_VOCAB = N_SPECIAL + N_BYTES + len(PRINTABLE)

# gguf's token types (llama.cpp llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6

# Seeds of the lab's three models: draft-same shares the target's seed on purpose.
TARGET_SEED = 20260
OTHER_SEED = 777


@dataclass(frozen=True)
class ModelShape:
    """What a tiny llama GGUF looks like; recorded in models.json."""

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 256
    n_vocab: int = 384
    ctx: int = 8192
    dtype: Dtype = "f32"
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.head_dim % 2:
            raise ValueError(f"head size {self.head_dim} must be even (RoPE)")
        if self.n_vocab < MIN_VOCAB:
            raise ValueError(f"n_vocab {self.n_vocab} is below the lab vocabulary's {MIN_VOCAB} fixed tokens")
        if min(self.n_layer, self.n_ff, self.ctx) < 1:
            raise ValueError("n_layer, n_ff and ctx must be positive")
        if self.dtype not in ("f32", "f16", "bf16"):
            raise ValueError(f"dtype {self.dtype!r}: expected f32, f16 or bf16")


def lab_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: 3 specials, 256 `<0xNN>` bytes, 95 printable pieces, then distinct
    printable `▁<number>` fillers."""
    if n_vocab < MIN_VOCAB:
        raise ValueError(f"n_vocab must be at least {MIN_VOCAB}")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(N_BYTES)] + list(PRINTABLE)
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * N_BYTES + [_NORMAL] * len(PRINTABLE)
    tokens += [f"{SPACE}{i}" for i in range(n_vocab - len(tokens))]
    types += [_NORMAL] * (n_vocab - len(types))
    scores = [0.0] * N_SPECIAL + [0.0] * N_BYTES + [-float(i) for i in range(n_vocab - N_SPECIAL - N_BYTES)]
    return tokens, scores, types


def _silent_rows(n_vocab: int) -> list[int]:
    """Tokens greedy decoding must never pick: specials, control bytes and non-ASCII bytes."""
    rows = list(range(N_SPECIAL))
    rows += [N_SPECIAL + b for b in range(N_BYTES) if b < 0x20 or b >= 0x7F]
    return rows


def _weights(
    shape: ModelShape, seed: int, *, output_scale: float = 1.0, perturb: float = 0.0, perturb_seed: int = 0
) -> dict[str, np.ndarray]:
    """Named float32 arrays in numpy (out, in) order, as llama.cpp's llama loader names them.
    `output_scale` multiplies the output projection (small: near-ties); `perturb` adds seeded
    noise of that share of each matrix's spread. At their defaults the weights are unchanged."""
    rng = np.random.default_rng(seed)
    d, ff, v = shape.n_embd, shape.n_ff, shape.n_vocab
    kv = shape.n_head_kv * shape.head_dim

    def mat(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    t: dict[str, np.ndarray] = {"token_embd.weight": mat(v, d, 1.0)}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(d, dtype=np.float32)
        t[p + "attn_q.weight"] = mat(d, d, d**-0.5)
        t[p + "attn_k.weight"] = mat(kv, d, d**-0.5)
        t[p + "attn_v.weight"] = mat(kv, d, d**-0.5)
        t[p + "attn_output.weight"] = mat(d, d, d**-0.5)
        t[p + "ffn_norm.weight"] = np.ones(d, dtype=np.float32)
        t[p + "ffn_gate.weight"] = mat(ff, d, d**-0.5)
        t[p + "ffn_up.weight"] = mat(ff, d, d**-0.5)
        t[p + "ffn_down.weight"] = mat(d, ff, ff**-0.5)
    t["output_norm.weight"] = np.ones(d, dtype=np.float32)
    silent = set(_silent_rows(v))
    speakable = np.array([i for i in range(v) if i not in silent])
    order = rng.permutation(speakable)  # one cycle: order[k] is followed by order[k+1]
    out = np.zeros((v, d), dtype=np.float32)
    out[np.roll(order, -1)] = t["token_embd.weight"][order]
    t["output.weight"] = out
    if output_scale != 1.0:
        t["output.weight"] = (out * np.float32(output_scale)).astype(np.float32)
    if perturb:
        noise = np.random.default_rng(perturb_seed)
        for name, a in t.items():
            if a.ndim == 2 and name != "token_embd.weight":
                spread = float(a.std()) or 1.0
                t[name] = (a + noise.standard_normal(a.shape) * spread * perturb).astype(np.float32)
    return t


def write_llama_gguf(
    path: Path | str,
    *,
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 4,
    n_ff: int = 256,
    n_vocab: int = 384,
    seed: int = TARGET_SEED,
    dtype: Dtype = "f32",
    ctx: int = 8192,
    n_head_kv: int | None = None,
    name: str = "pairctl-lab",
    extra: dict[str, Any] | None = None,
    output_scale: float = 1.0,
    perturb: float = 0.0,
    perturb_seed: int = 0,
) -> dict[str, Any]:
    """Write a random-weight llama GGUF (matrices in `dtype`, norms f32; `extra` metadata keys) by
    temp file and rename; return its models.json record (sha256, size, shape)."""
    import gguf  # heavy optional dependency: only writing a lab model needs the GGUF writer

    shape = ModelShape(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv or n_head,
        n_ff=n_ff,
        n_vocab=n_vocab,
        ctx=ctx,
        dtype=dtype,
    )
    shape.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(name)
        w.add_context_length(shape.ctx)
        w.add_embedding_length(shape.n_embd)
        w.add_block_count(shape.n_layer)
        w.add_feed_forward_length(shape.n_ff)
        w.add_head_count(shape.n_head)
        w.add_head_count_kv(shape.n_head_kv)
        w.add_layer_norm_rms_eps(shape.rms_eps)
        w.add_rope_dimension_count(shape.head_dim)
        w.add_rope_freq_base(shape.rope_freq_base)
        w.add_vocab_size(shape.n_vocab)
        w.add_file_type({"f32": 0, "f16": 1, "bf16": 32}[dtype])  # llama_ftype ALL_F32 / MOSTLY_F16 / MOSTLY_BF16
        tokens, scores, types = lab_vocab(shape.n_vocab)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(UNK_ID)
        w.add_bos_token_id(BOS_ID)
        w.add_eos_token_id(EOS_ID)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(True)
        w.add_uint32("pairctl.lab.seed", seed)
        for key, value in (extra or {}).items():
            _add_extra(w, key, value)
        if output_scale != 1.0:
            w.add_float32("pairctl.lab.output_scale", output_scale)
        if perturb:
            w.add_float32("pairctl.lab.perturb", perturb)
            w.add_uint32("pairctl.lab.perturb_seed", perturb_seed)
        weights = _weights(shape, seed, output_scale=output_scale, perturb=perturb, perturb_seed=perturb_seed)
        for tname, arr in weights.items():
            _add_tensor(w, tname, arr, dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {
        "file": path.name,
        "sha256": sha256_file(path),
        "size": path.stat().st_size,
        "seed": seed,
        "architecture": "llama",
        "shape": {**asdict(shape), "head_dim": shape.head_dim},
    }


def _add_tensor(w: Any, name: str, arr: np.ndarray, dtype: Dtype) -> None:
    import gguf  # heavy optional dependency: only writing a lab model needs the GGUF writer

    if arr.ndim == 1 or dtype == "f32":
        w.add_tensor(name, arr.astype(np.float32))
    elif dtype == "f16":
        w.add_tensor(name, arr.astype(np.float16))
    else:
        q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.BF16)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)


def _add_extra(w: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value) if value >= 0 else w.add_int32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        raise TypeError(f"extra[{key!r}]: unsupported value type {type(value).__name__}")


# --- the lab's three models ---------------------------------------------------------------

ROLE_FILES = {
    "target": "target.gguf",
    "draft_same": "draft-same.gguf",
    "draft_other": "draft-other.gguf",
    "sensitive": "sensitive.gguf",
    "draft_perturbed": "draft-perturbed-085.gguf",  # named for its noise: a changed one is written anew
}
ROLE_SEEDS = {role: OTHER_SEED if role == "draft_other" else TARGET_SEED for role in ROLE_FILES}
# `sensitive`: the target with its output projection scaled down, so next-token distributions have
# near-ties and small numeric changes flip tokens (the reference-logprob profile). `draft_perturbed`:
# the target plus seeded noise (0.85 accepts about 77% of drafts), for both speculative paths.
SENSITIVE_OUTPUT_SCALE = 0.08
DRAFT_PERTURB = 0.85
ROLE_OPTIONS: dict[str, dict[str, Any]] = {
    "sensitive": {"output_scale": SENSITIVE_OUTPUT_SCALE},
    "draft_perturbed": {"perturb": DRAFT_PERTURB, "perturb_seed": 31337},
}


@dataclass(frozen=True)
class LabModels:
    """The lab's model folder: role -> path, and the recorded identities."""

    folder: Path
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def paths(self) -> dict[str, Path]:
        return {role: self.folder / f for role, f in ROLE_FILES.items()}


def records_match(folder: Path, files: dict[str, str], records: Any) -> bool:
    """Whether every role's file (role -> file name) in `folder` has its recorded size and sha256."""
    if not isinstance(records, dict):
        return False
    for role, fname in files.items():
        rec, p = records.get(role), folder / fname
        if not rec or not p.is_file() or p.stat().st_size != rec.get("size") or sha256_file(p) != rec.get("sha256"):
            return False
    return True


def write_index(path: Path, index: dict[str, Any]) -> None:
    """A models index (sorted JSON), replacing the old one at once."""
    atomic.replace(path, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())


def models_present(folder: Path) -> bool:
    """Whether models.json exists and every model file matches its recorded sha256 and size."""
    try:
        records = read_index(folder / "models.json")["models"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return records_match(folder, ROLE_FILES, records)


def ensure_lab_models(folder: str | os.PathLike[str]) -> LabModels:
    """Write target / draft-same / draft-other and models.json unless already intact (`folder`
    may be a str: scripts pass argv through)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if models_present(folder):
        return LabModels(folder, read_index(folder / "models.json")["models"])
    records = {
        role: write_llama_gguf(
            folder / fname, seed=ROLE_SEEDS[role], name=f"pairctl-lab-{role}", **ROLE_OPTIONS.get(role, {})
        )
        for role, fname in ROLE_FILES.items()
    }
    write_index(folder / "models.json", {"format": 1, "models": records})
    return LabModels(folder, records)
