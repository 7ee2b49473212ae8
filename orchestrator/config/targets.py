"""Build targets: one CUDA arch (or none) + toolchain constraints + CMake flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.loader import load_model
from orchestrator.paths import MANIFESTS

# Flags pairctl always sets itself; a target may not override them.
RESERVED_CMAKE = {
    "GGML_RPC",
    "LLAMA_BUILD_COMMIT",
    "LLAMA_BUILD_NUMBER",
    "GGML_CUDA",
    "CMAKE_CUDA_ARCHITECTURES",
    "CMAKE_C_FLAGS",
    "CMAKE_CXX_FLAGS",
    "CMAKE_CUDA_FLAGS",
}


class Target(StrictModel):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    backend: Literal["cpu", "cuda"]
    cuda_arch: int | None = Field(default=None, ge=50, le=200, description="e.g. 70 for sm_70 (V100)")
    cuda_major_min: int | None = Field(default=None, description="oldest CUDA major that can build this arch")
    cuda_major_max: int | None = Field(default=None, description="newest CUDA major that can build this arch")
    cmake_flags: dict[str, str] = Field(default_factory=dict)
    build_targets: list[str] = Field(default_factory=lambda: ["llama-server", "ggml-rpc-server"])
    test_targets: list[str] = Field(default_factory=list)
    gpu_name_hint: str | None = Field(default=None, description="substring expected in nvidia-smi's GPU name")
    kernel_harness: bool = Field(
        default=True, description="build kernels/harness against this build's ggml into tests/bin"
    )

    @model_validator(mode="after")
    def _check(self) -> Target:
        if self.backend == "cuda" and self.cuda_arch is None:
            raise ValueError("a cuda target needs cuda_arch (e.g. 70 for V100)")
        if self.backend == "cpu" and self.cuda_arch is not None:
            raise ValueError("a cpu target cannot have cuda_arch")
        bad = RESERVED_CMAKE & set(self.cmake_flags)
        if bad:
            raise ValueError(f"cmake_flags may not set {sorted(bad)}: pairctl sets them from the target and revision")
        for req in ("llama-server", "ggml-rpc-server"):
            if req not in self.build_targets:
                raise ValueError(f"build_targets must include {req}")
        if self.cuda_major_min and self.cuda_major_max and self.cuda_major_min > self.cuda_major_max:
            raise ValueError("cuda_major_min is greater than cuda_major_max")
        return self

    def full_cmake_flags(self) -> dict[str, str]:
        flags = {"GGML_RPC": "ON", **self.cmake_flags}
        if self.backend == "cuda":
            flags["GGML_CUDA"] = "ON"
            flags["CMAKE_CUDA_ARCHITECTURES"] = str(self.cuda_arch)
        else:
            flags["GGML_CUDA"] = "OFF"
        return dict(sorted(flags.items()))


def targets_dir() -> Path:
    return MANIFESTS / "targets"


def load_target(name_or_path: str) -> Target:
    return load_model(Target, search.resolve_ref("target", name_or_path))
