"""Pure build planning: CMake defines, configure/build argv, environment, cache key.

Nothing here runs a process; `builder` executes what this renders, so the exact commands
are testable and shown in logs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.build.git import Revision
from orchestrator.build.harness import harness_inputs
from orchestrator.build.toolchain import Toolchain
from orchestrator.config.targets import Target
from orchestrator.hashing import sha256_json

CACHE_KEY_VERSION = 2  # 2: build paths mapped out of the binaries (path_defines)


def cmake_defines(target: Target, rev: Revision, toolchain: Toolchain) -> dict[str, str]:
    """Every `-D` that can change the binaries: the target's flags plus the revision identity."""
    flags = dict(target.full_cmake_flags())
    flags["LLAMA_BUILD_COMMIT"] = rev.short
    flags["LLAMA_BUILD_NUMBER"] = str(rev.count)
    if target.backend == "cuda" and toolchain.nvcc_path:
        flags["CMAKE_CUDA_COMPILER"] = toolchain.nvcc_path
    return dict(sorted(flags.items()))


def launcher_defines(target: Target, toolchain: Toolchain) -> dict[str, str]:
    """ccache launchers: they change speed, never output, so they stay out of the cache key."""
    if not toolchain.ccache:
        return {}
    out = {"CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache"}
    if target.backend == "cuda":
        out["CMAKE_CUDA_COMPILER_LAUNCHER"] = "ccache"
    return out


def cache_key(tree: str, target: Target, defines: dict[str, str], toolchain: Toolchain) -> str:
    """(tree hash, target, flags digest, output-relevant tool versions) → a folder name."""
    return sha256_json(
        {
            "v": CACHE_KEY_VERSION,
            "tree": tree,
            "target": target.name,
            "defines": defines,
            "toolchain": toolchain.output_relevant(),
            "harness": harness_inputs() if target.kernel_harness else None,
        }
    )[:32]


@dataclass(frozen=True)
class BuildPlan:
    target: Target
    revision: Revision
    work_dir: Path  # Home.build_cache/work/<target>: stable, so ccache sees the same relative paths
    defines: dict[str, str]
    launchers: dict[str, str]
    key: str
    jobs: int | None = None
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def src_dir(self) -> Path:
        return self.work_dir / "src"

    @property
    def build_dir(self) -> Path:
        return self.work_dir / "build"

    @property
    def targets(self) -> list[str]:
        return [*self.target.build_targets, *self.target.test_targets]

    def path_defines(self) -> dict[str, str]:
        """Map the build's own paths out of the binaries (`__FILE__` in ggml's asserts and logs):
        the same inputs then give the same bytes in any home. Not in the cache key, which must
        not depend on where the home is."""
        m = f"-ffile-prefix-map={self.work_dir}=/pairctl-build"
        d = {"CMAKE_C_FLAGS": m, "CMAKE_CXX_FLAGS": m}
        if self.target.backend == "cuda":
            d["CMAKE_CUDA_FLAGS"] = f"-Xcompiler={m}"
        return d

    def configure_argv(self) -> list[str]:
        d = {**self.defines, **self.launchers, **self.path_defines()}
        return ["cmake", "-S", str(self.src_dir), "-B", str(self.build_dir), "-G", "Ninja",
                *(f"-D{k}={v}" for k, v in sorted(d.items()))]  # fmt: skip

    def build_argv(self) -> list[str]:
        argv = ["cmake", "--build", str(self.build_dir), "--target", *self.targets]
        if self.jobs:
            argv += ["--parallel", str(self.jobs)]
        return argv

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env.update(CCACHE_BASEDIR=str(self.work_dir), CCACHE_NOHASHDIR="1", NINJA_STATUS="[%f/%t] ")
        for k, v in self.env_extra.items():  # search paths: ours first, then the caller's
            env[k] = os.pathsep.join(p for p in (v, base.get(k)) if p)
        # The exported tree is not a checkout. Without a ceiling, ggml's CMakeLists finds whatever
        # repository encloses the work dir (e.g. pairctl's own) and bakes its HEAD into the binary.
        env["GIT_CEILING_DIRECTORIES"] = str(self.work_dir)
        return env


def make_plan(
    target: Target, rev: Revision, toolchain: Toolchain, build_cache: Path, *, jobs: int | None = None
) -> BuildPlan:
    defines = cmake_defines(target, rev, toolchain)
    return BuildPlan(
        target=target, revision=rev, work_dir=build_cache / "work" / target.name, defines=defines,
        launchers=launcher_defines(target, toolchain), key=cache_key(rev.tree, target, defines, toolchain), jobs=jobs,
        env_extra=toolkit_env(target, toolchain),
    )  # fmt: skip


def toolkit_env(target: Target, toolchain: Toolchain) -> dict[str, str]:
    """Search paths put first for a CUDA build: nvcc's folder on PATH (its own ptxas, fatbinary,
    nvlink) and the toolkit's library folders (the package's `--help`/`ldd` checks find its cudart)."""
    root = toolchain.cuda_root if target.backend == "cuda" else None
    if root is None or toolchain.nvcc_path is None:
        return {}
    return {"PATH": str(Path(toolchain.nvcc_path).parent),
            "LD_LIBRARY_PATH": f"{root / 'lib64'}{os.pathsep}{root / 'lib'}"}  # fmt: skip
