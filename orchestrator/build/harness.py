"""Compile the kernel validation harness against a llama.cpp build tree's own ggml.

It links the same static ggml libraries, flags and compiler as the package's `ggml-rpc-server`, read
from the build tree's `build.ninja` and `CMakeCache.txt` rather than guessed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import BuildError
from orchestrator.hashing import sha256_file
from orchestrator.log import get_logger
from orchestrator.paths import KERNELS

HARNESS_NAME = "ggml-kernel-cases"
HARNESS_DIR = KERNELS / "harness"
HARNESS_SOURCES = ("kernel_cases.cpp",)
LINK_LIKE = "bin/ggml-rpc-server"  # the build output whose link line the harness copies
CXX_STD = "-std=c++17"


def harness_sources() -> list[Path]:
    """The C++ files the harness is built from (the build engineer hashes them into the build's inputs)."""
    return [HARNESS_DIR / name for name in HARNESS_SOURCES]


def harness_inputs() -> dict[str, str]:
    """{relative name: sha256} of the harness sources, for build cache keys and package manifests."""
    return {f"kernels/harness/{p.name}": sha256_file(p) for p in harness_sources()}


@dataclass(frozen=True)
class LinkLine:
    """How CMake linked one executable: compiler, flags and libraries (paths relative to the build dir)."""

    cxx: str
    flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    link_path: tuple[str, ...]
    link_libraries: tuple[str, ...]


def _ninja_unescape(value: str) -> str:
    """Ninja escapes `$`, space and colon with `$`."""
    return re.sub(r"\$([$ :])", r"\1", value)


def parse_ninja_link(build_ninja: str, output: str = LINK_LIKE) -> dict[str, str]:
    """The variables of the `build <output>: ...` statement in a build.ninja text."""
    lines = build_ninja.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.startswith("build ") and line[6:].split(":", 1)[0].replace("$ ", " ").strip() == output:
            start = i
            break
    if start is None:
        raise BuildError(f"build.ninja has no build statement for {output}; cannot link the kernel harness like it")
    variables: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        key, sep, value = line.strip().partition(" = ")
        if sep:
            variables[key] = value
    return variables


def parse_cmake_cache(text: str) -> dict[str, str]:
    """`NAME:TYPE=value` lines of a CMakeCache.txt."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith(("#", "//")):
            continue
        m = re.match(r"^([^:=]+)(?::[^=]*)?=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def link_line(build_ninja: str, cmake_cache: str, output: str = LINK_LIKE) -> LinkLine:
    v = parse_ninja_link(build_ninja, output)
    cache = parse_cmake_cache(cmake_cache)
    cxx = cache.get("CMAKE_CXX_COMPILER")
    if not cxx:
        raise BuildError("CMakeCache.txt has no CMAKE_CXX_COMPILER")

    def split(key: str) -> tuple[str, ...]:
        return tuple(shlex.split(_ninja_unescape(v.get(key, ""))))

    libs = split("LINK_LIBRARIES")
    if not any("ggml" in part for part in libs):
        raise BuildError(f"the link line of {output} names no ggml library: {' '.join(libs)[:300]}")
    return LinkLine(
        cxx=cxx, flags=split("FLAGS"), link_flags=split("LINK_FLAGS"), link_path=split("LINK_PATH"), link_libraries=libs
    )


def compile_argv(line: LinkLine, *, sources: list[Path], include_dirs: list[Path], out: Path) -> list[str]:
    """The compiler's argv (run with cwd = the build dir, where the library paths are relative)."""
    return [
        line.cxx,
        CXX_STD,
        *line.flags,
        *(f"-I{d}" for d in include_dirs),
        *line.link_flags,
        *(str(s) for s in sources),
        "-o",
        str(out),
        *line.link_path,
        *line.link_libraries,
    ]


def build_harness(build_dir: Path | str, src_dir: Path | str, out_dir: Path | str, target: Any = None) -> list[Path]:
    """Compile `ggml-kernel-cases` into `out_dir` against `build_dir`'s ggml; return the files made.

    `src_dir`: the source tree the build dir was configured from (ggml's headers); `target` is only
    logged. Call after the build of `ggml-rpc-server`; the result goes under the package's tests/bin/."""
    build_dir, src_dir, out_dir = Path(build_dir).resolve(), Path(src_dir).resolve(), Path(out_dir).resolve()
    log = get_logger(step="build.harness", build_dir=str(build_dir), target=getattr(target, "name", target))
    ninja, cache = build_dir / "build.ninja", build_dir / "CMakeCache.txt"
    for f in (ninja, cache):
        if not f.is_file():
            raise BuildError(f"{f} not found: build_harness needs a configured Ninja build tree")
    include = src_dir / "ggml" / "include"
    if not (include / "ggml-rpc.h").is_file():
        raise BuildError(f"{include} has no ggml-rpc.h: {src_dir} is not the llama.cpp tree of this build")
    line = link_line(ninja.read_text(encoding="utf-8"), cache.read_text(encoding="utf-8"))
    missing = [lib for lib in line.link_libraries if lib.endswith(".a") and not (build_dir / lib).exists()]
    if missing:
        raise BuildError(f"ggml libraries missing in {build_dir}: {missing}; build ggml-rpc-server first")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / HARNESS_NAME
    argv = compile_argv(line, sources=harness_sources(), include_dirs=[include], out=out)
    log.info("compiling kernel harness", argv=argv)
    proc = subprocess.run(argv, cwd=build_dir, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise BuildError(f"compiling the kernel harness failed ({shlex.join(argv[:3])} ...):\n{tail}")
    return [out]
