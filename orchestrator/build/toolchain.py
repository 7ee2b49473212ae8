"""Toolchain facts (cmake, ninja, C++ compiler, ccache, nvcc) and the checks made before configure.

CUDA 13 dropped sm_70, so targets may need different CUDA majors: each takes the first nvcc that can
build it, from $CUDACXX, $PAIRCTL_CUDA_ROOTS, PATH and /usr/local/cuda, run only if it and its root
pass the config files' ownership rules.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.targets import Target
from orchestrator.config.trust import FIX, unsafe_reason
from orchestrator.errors import BuildError

CUDA_ROOTS_ENV = "PAIRCTL_CUDA_ROOTS"
CUDA_GUIDE = "docs/guides/cuda-toolchain.md"

_VERSION = re.compile(r"(\d+(?:\.\d+)+)")
_NVCC_RELEASE = re.compile(r"release\s+(\d+)\.(\d+)", re.I)
_NVCC_BUILD = re.compile(r"\bV(\d+\.\d+\.\d+)")
_GPU_ARCH = re.compile(r"^\s*compute_(\d+)[a-z]?\s*$")
_DIST_INFO = re.compile(r"^(nvidia_[a-z0-9_]+)-([0-9][^-]*)\.dist-info$")


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


def configured_toolkit_mismatch(cmake_cache: str, nvcc: str) -> str | None:
    """Why CMake's CUDAToolkit is not the checked nvcc's toolkit, or None: ggml's
    find_package(CUDAToolkit) looks for nvcc on PATH, not at CMAKE_CUDA_COMPILER."""
    m = re.search(r"^CUDAToolkit_NVCC_EXECUTABLE:FILEPATH=(.*)$", cmake_cache, re.M)
    found = m.group(1).strip() if m else ""
    if found and os.path.realpath(found) == os.path.realpath(nvcc):
        return None
    return (f"CMake found the CUDA toolkit of {found or 'no nvcc'}, not of the checked {nvcc}: "
            "its headers and libraries would be another toolkit's")  # fmt: skip


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
    cuda_from: str | None = None  # what installed the toolkit: its wheels or its Debian package
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def cuda_root(self) -> Path | None:
        return Path(os.path.realpath(self.nvcc_path)).parent.parent if self.nvcc_path else None

    def versions(self) -> dict[str, str]:
        """What the manifest records: versions, and for CUDA where nvcc is and what installed it."""
        out = {"cmake": self.cmake, "ninja": self.ninja, "cxx": self.cxx}
        if self.nvcc:
            out["nvcc"] = self.nvcc
            out["nvcc_path"] = str(self.nvcc_path)
            out["cuda_from"] = self.cuda_from or "unknown"
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
    return next((found for c in cands if (found := shutil.which(c))), "")


def nvcc_candidates(env: Mapping[str, str]) -> list[str]:
    """Every nvcc that may build a CUDA target, first choice first: $CUDACXX, bin/nvcc of each
    root in $PAIRCTL_CUDA_ROOTS (os.pathsep-separated), the first on PATH, /usr/local/cuda."""
    roots = [r for r in env.get(CUDA_ROOTS_ENV, "").split(os.pathsep) if r]
    cands = [env.get("CUDACXX", ""), *(os.path.join(r, "bin", "nvcc") for r in roots),
             shutil.which("nvcc", path=env.get("PATH")) or "", "/usr/local/cuda/bin/nvcc"]  # fmt: skip
    return list(dict.fromkeys(c for c in cands if c))


def wheel_versions(root: Path) -> dict[str, str]:
    """{wheel: version} of the NVIDIA wheels a toolkit root came from, read from their dist-info
    folders: ROOT/dist-info (a copied layout) or the folder `pip install --target` filled, two
    levels above ROOT (ROOT is its nvidia/cu13 or nvidia/cuda_nvcc)."""
    found = {}
    for d in (root / "dist-info", root.parent.parent):
        for p in d.iterdir() if d.is_dir() else ():
            if m := _DIST_INFO.match(p.name):
                found[m.group(1).replace("_", "-")] = m.group(2)
    return dict(sorted(found.items()))


def cuda_origin(nvcc: str) -> str:
    """What installed the toolkit of `nvcc`, for the manifest: its wheels, else its Debian package."""
    real = os.path.realpath(nvcc)
    wheels = wheel_versions(Path(real).parent.parent)
    if wheels:
        return "wheels: " + ", ".join(f"{k} {v}" for k, v in wheels.items())
    try:
        pkg = _run(["dpkg-query", "-S", real]).split(":", 1)[0].strip()
        return f"Debian package {pkg} {_run(['dpkg-query', '-W', '-f=${Version}', pkg]).strip()}"
    except BuildError:
        return f"not from wheels or a Debian package: {real}"


def probe_nvcc(nvcc: str) -> tuple[NvccVersion, list[int]]:
    try:
        return parse_nvcc_version(_run([nvcc, "--version"])), parse_gpu_arches(_run([nvcc, "--list-gpu-arch"]))
    except ValueError as exc:
        raise BuildError(f"{nvcc}: {exc}") from None


def pick_nvcc(target: Target) -> tuple[str, str]:
    """(path, version) of the first candidate nvcc that can build `target`; refuse, naming each
    one tried, when none can, and refuse an nvcc whose file or toolkit root others could write."""
    for root in filter(None, os.environ.get(CUDA_ROOTS_ENV, "").split(os.pathsep)):
        if not shutil.which(os.path.join(root, "bin", "nvcc")):
            raise BuildError(f"${CUDA_ROOTS_ENV} lists {root}, which has no executable bin/nvcc",
                             hint=f"name the folder above the toolkit's bin/ ({CUDA_GUIDE})")  # fmt: skip
    refusals = []
    for cand in nvcc_candidates(os.environ):
        path = shutil.which(cand)
        if not path:
            continue
        why = unsafe_reason(Path(path)) or unsafe_reason(Path(os.path.realpath(path)).parent.parent)
        if why:
            raise BuildError(f"refusing nvcc {path} for target {target.name}: {why}", hint=FIX)
        nv, arches = probe_nvcc(path)
        refusal = cuda_refusal(target, nv, arches)
        if refusal is None:
            return path, str(nv)
        refusals.append(f"{refusal} ({path})")
    if not refusals:
        raise BuildError(f"target {target.name} needs nvcc (CUDA toolkit), none found on PATH or in /usr/local/cuda",
                         hint=f"install one, or list a toolkit root in ${CUDA_ROOTS_ENV} ({CUDA_GUIDE})")  # fmt: skip
    raise BuildError("; ".join(refusals), hint=f"set CUDACXX, or list a suitable toolkit root in ${CUDA_ROOTS_ENV} "
                     f"({CUDA_GUIDE} says where each target's toolkit comes from)")  # fmt: skip


def check_toolchain(target: Target) -> Toolchain:
    """Find and version every tool the target needs; raise BuildError naming what is missing."""
    cmake, ninja, cxx = _need("cmake"), _need("ninja"), _need("c++", "CXX", ("g++", "clang++"))
    tools = (("cmake", cmake, "cmake"), ("ninja", ninja, "ninja-build"), ("a C++ compiler", cxx, "g++"))
    missing = [f"{tool} (Debian package {pkg})" for tool, path, pkg in tools if not path]
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
    nvcc_v = nvcc_path = cuda_from = None
    if target.backend == "cuda":
        nvcc_path, nvcc_v = pick_nvcc(target)
        cuda_from = cuda_origin(nvcc_path)
    return Toolchain(
        cmake=versions["cmake"], ninja=versions["ninja"], cxx=versions["cxx"], cxx_path=str(Path(cxx).resolve()),
        ccache=ccache, nvcc=nvcc_v, nvcc_path=nvcc_path, cuda_from=cuda_from,
        paths={"cmake": cmake, "ninja": ninja, "cxx": cxx, **({"ccache": ccache_path} if ccache_path else {})},
    )  # fmt: skip
