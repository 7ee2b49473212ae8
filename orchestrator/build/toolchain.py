"""Toolchain facts (cmake, ninja, C++ compiler, ccache, nvcc) and the checks made before configure.

Parsers are pure and tested on captured output. The one check that matters most: CUDA 13
dropped sm_70, so a V100 build must stop before configure when only CUDA 13 is available.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.targets import Target
from orchestrator.errors import BuildError

_VERSION = re.compile(r"(\d+(?:\.\d+)+)")
_NVCC_RELEASE = re.compile(r"release\s+(\d+)\.(\d+)", re.I)
_NVCC_BUILD = re.compile(r"\bV(\d+\.\d+\.\d+)")
_GPU_ARCH = re.compile(r"^\s*compute_(\d+)[a-z]?\s*$")


@dataclass(frozen=True)
class NvccVersion:
    major: int
    minor: int
    full: str  # e.g. "13.0.48", or "13.0" if no build number is printed

    def __str__(self) -> str:
        return self.full


def parse_version_line(text: str) -> str:
    """First dotted version in the output (`cmake version 3.25.1`, `1.11.1`, `g++ (Debian 12.2.0-14) 12.2.0`)."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    found: list[str] = _VERSION.findall(first)  # one group: findall yields its strings
    if not found:
        raise ValueError(f"no version number in {first!r}")
    return found[-1] if "(" in first else found[0]


def parse_nvcc_version(text: str) -> NvccVersion:
    """`nvcc --version` → NvccVersion (from 'Cuda compilation tools, release 13.0, V13.0.48')."""
    m = _NVCC_RELEASE.search(text)
    if not m:
        raise ValueError("nvcc --version output has no 'release X.Y'")
    b = _NVCC_BUILD.search(text)
    return NvccVersion(int(m.group(1)), int(m.group(2)), b.group(1) if b else f"{m.group(1)}.{m.group(2)}")


def parse_gpu_arches(text: str) -> list[int]:
    """`nvcc --list-gpu-arch` (one `compute_NN` per line) → sorted arch numbers."""
    arches = {int(m.group(1)) for line in text.splitlines() if (m := _GPU_ARCH.match(line))}
    if not arches:
        raise ValueError("nvcc --list-gpu-arch listed no compute_NN architectures")
    return sorted(arches)


def cuda_refusal(target: Target, nvcc: NvccVersion, arches: list[int]) -> str | None:
    """Why this nvcc cannot build `target`, or None. Pure, so it is tested without a GPU."""
    assert target.cuda_arch is not None
    need = []
    if target.cuda_major_max is not None:
        need.append(f"CUDA {target.cuda_major_max}.x or older")
    if target.cuda_major_min is not None:
        need.append(f"CUDA {target.cuda_major_min}.x or newer")
    needs = " and ".join(need) or "a CUDA toolkit that lists it"
    if target.cuda_major_max is not None and nvcc.major > target.cuda_major_max:
        return (
            f"target {target.name} (sm_{target.cuda_arch}) needs a CUDA {target.cuda_major_max}.x toolchain; "
            f"found nvcc {nvcc} (CUDA {nvcc.major}), which cannot build sm_{target.cuda_arch}"
        )
    if target.cuda_major_min is not None and nvcc.major < target.cuda_major_min:
        return f"target {target.name} (sm_{target.cuda_arch}) needs {needs}; found nvcc {nvcc}"
    if target.cuda_arch not in arches:
        listed = f"compute_{arches[0]} .. compute_{arches[-1]}" if arches else "nothing"
        return (
            f"target {target.name} needs compute_{target.cuda_arch}, but nvcc {nvcc} --list-gpu-arch offers "
            f"{listed} without it; install {needs}"
        )
    return None


@dataclass(frozen=True)
class Toolchain:
    """The versions recorded in the manifest and mixed into the build cache key."""

    cmake: str
    ninja: str
    cxx: str
    cxx_path: str
    ccache: str | None = None
    nvcc: str | None = None
    nvcc_path: str | None = None
    paths: dict[str, str] = field(default_factory=dict)

    def versions(self) -> dict[str, str]:
        out = {"cmake": self.cmake, "ninja": self.ninja, "cxx": self.cxx}
        if self.nvcc:
            out["nvcc"] = self.nvcc
        if self.ccache:
            out["ccache"] = self.ccache
        return out

    def output_relevant(self) -> dict[str, str]:
        """Versions that can change the binaries (ccache and ninja cannot)."""
        out = {"cmake": self.cmake, "cxx": f"{self.cxx_path} {self.cxx}"}
        if self.nvcc:
            out["nvcc"] = self.nvcc
        return out


def _run(argv: list[str], timeout: float = 60) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {argv[0]}: {exc}") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:500]}")
    return proc.stdout + proc.stderr


def _need(name: str, env_var: str | None = None, extra: tuple[str, ...] = ()) -> str:
    cands = ([os.environ[env_var]] if env_var and os.environ.get(env_var) else []) + [name, *extra]
    for c in cands:
        found = shutil.which(c)
        if found:
            return found
    return ""


def find_nvcc() -> str:
    return _need("nvcc", "CUDACXX", ("/usr/local/cuda/bin/nvcc",))


def probe_nvcc(nvcc: str) -> tuple[NvccVersion, list[int]]:
    try:
        return parse_nvcc_version(_run([nvcc, "--version"])), parse_gpu_arches(_run([nvcc, "--list-gpu-arch"]))
    except ValueError as exc:
        raise BuildError(f"{nvcc}: {exc}") from None


def check_toolchain(target: Target) -> Toolchain:
    """Find and version every tool the target needs; raise BuildError naming what is missing."""
    missing = []
    cmake, ninja, cxx = _need("cmake"), _need("ninja"), _need("c++", "CXX", ("g++", "clang++"))
    for tool, path, pkg in (("cmake", cmake, "cmake"), ("ninja", ninja, "ninja-build"), ("a C++ compiler", cxx, "g++")):
        if not path:
            missing.append(f"{tool} (Debian package {pkg})")
    if missing:
        raise BuildError("toolchain incomplete: missing " + ", ".join(missing), hint="`make setup` installs them")
    try:
        versions = {
            k: parse_version_line(_run([p, "--version"])) for k, p in (("cmake", cmake), ("ninja", ninja), ("cxx", cxx))
        }
    except ValueError as exc:
        raise BuildError(f"cannot read a tool version: {exc}") from None
    ccache_path = _need("ccache")
    ccache = parse_version_line(_run([ccache_path, "--version"])) if ccache_path else None
    nvcc_v = nvcc_path = None
    if target.backend == "cuda":
        nvcc_path = find_nvcc()
        if not nvcc_path:
            raise BuildError(
                f"target {target.name} needs nvcc (CUDA toolkit), none found on PATH or in /usr/local/cuda"
            )
        nv, arches = probe_nvcc(nvcc_path)
        why = cuda_refusal(target, nv, arches)
        if why:
            raise BuildError(why, hint=f"put a suitable nvcc first on PATH (or set CUDACXX); used {nvcc_path}")
        nvcc_v = str(nv)
    return Toolchain(
        cmake=versions["cmake"], ninja=versions["ninja"], cxx=versions["cxx"], cxx_path=str(Path(cxx).resolve()),
        ccache=ccache, nvcc=nvcc_v, nvcc_path=nvcc_path,
        paths={"cmake": cmake, "ninja": ninja, "cxx": cxx, **({"ccache": ccache_path} if ccache_path else {})},
    )  # fmt: skip
