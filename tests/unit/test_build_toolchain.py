"""Toolchain parsers on captured output (nvcc 13.0 on the lent H200) and the CUDA refusals."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.build.toolchain import (
    NvccVersion,
    check_toolchain,
    cuda_refusal,
    parse_gpu_arches,
    parse_nvcc_version,
    parse_version_line,
)
from orchestrator.config.targets import load_target
from orchestrator.errors import BuildError

DATA = Path(__file__).parent / "data" / "build"
NVCC_VERSION = (DATA / "nvcc-version.txt").read_text()
NVCC_ARCHES = (DATA / "nvcc-list-gpu-arch.txt").read_text()
NVCC_12_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Tue_Oct_29_23:50:19_PDT_2024
Cuda compilation tools, release 12.6, V12.6.85
Build cuda_12.6.r12.6/compiler.35059454_0
"""
NVCC_12_ARCHES = "\n".join(f"compute_{a}" for a in (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90)) + "\n"


def test_parse_nvcc_13_version_captured() -> None:
    v = parse_nvcc_version(NVCC_VERSION)
    assert (v.major, v.minor, v.full) == (13, 0, "13.0.88")


def test_parse_nvcc_13_arches_captured_has_no_sm70() -> None:
    arches = parse_gpu_arches(NVCC_ARCHES)
    assert arches[0] == 75 and arches[-1] == 121
    assert 70 not in arches and 90 in arches and 120 in arches


def test_parsers_reject_garbage() -> None:
    with pytest.raises(ValueError):
        parse_nvcc_version("command not found")
    with pytest.raises(ValueError):
        parse_gpu_arches("sm_70\n")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("cmake version 3.25.1\n\nCMake suite maintained and supported by Kitware", "3.25.1"),
        ("1.11.1\n", "1.11.1"),
        ("c++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022", "12.2.0"),
        ("ccache version 4.7.5\nFeatures: file-storage", "4.7.5"),
    ],
)
def test_parse_version_line(text: str, expected: str) -> None:
    assert parse_version_line(text) == expected


def test_v100_under_cuda13_is_refused_with_the_toolchain_it_needs() -> None:
    why = cuda_refusal(load_target("v100"), parse_nvcc_version(NVCC_VERSION), parse_gpu_arches(NVCC_ARCHES))
    assert why is not None and "CUDA 12.x" in why and "sm_70" in why


def test_v100_under_cuda12_is_accepted() -> None:
    assert (
        cuda_refusal(load_target("v100"), parse_nvcc_version(NVCC_12_VERSION), parse_gpu_arches(NVCC_12_ARCHES)) is None
    )


def test_h200_under_cuda13_is_accepted_and_rtx5060ti_needs_compute_120() -> None:
    v13, a13 = parse_nvcc_version(NVCC_VERSION), parse_gpu_arches(NVCC_ARCHES)
    assert cuda_refusal(load_target("h200"), v13, a13) is None
    assert cuda_refusal(load_target("rtx5060ti"), v13, a13) is None
    why = cuda_refusal(load_target("rtx5060ti"), parse_nvcc_version(NVCC_12_VERSION), parse_gpu_arches(NVCC_12_ARCHES))
    assert why is not None and "compute_120" in why


def test_arch_missing_from_list_is_refused_even_if_major_fits() -> None:
    why = cuda_refusal(load_target("v100"), NvccVersion(12, 9, "12.9.0"), [75, 80, 90])
    assert why is not None and "compute_70" in why


def _fake_nvcc(tmp: Path, version: str, arches: str) -> Path:
    (tmp / "version.txt").write_text(version)
    (tmp / "arches.txt").write_text(arches)
    script = tmp / "bin" / "nvcc"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version) cat "{tmp}/version.txt";; '
        f'--list-gpu-arch) cat "{tmp}/arches.txt";; *) exit 2;; esac\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script.parent


def test_check_toolchain_refuses_v100_with_fake_cuda13_nvcc_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_nvcc(tmp_path, NVCC_VERSION, NVCC_ARCHES)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDACXX", raising=False)
    with pytest.raises(BuildError, match=r"needs a CUDA 12\.x toolchain"):
        check_toolchain(load_target("v100"))


def test_check_toolchain_accepts_v100_with_fake_cuda12_nvcc_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_nvcc(tmp_path, NVCC_12_VERSION, NVCC_12_ARCHES)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDACXX", raising=False)
    tc = check_toolchain(load_target("v100"))
    assert tc.nvcc == "12.6.85" and tc.nvcc_path == str(bindir / "nvcc")


def test_check_toolchain_cpu_target_finds_cmake_ninja_cxx() -> None:
    tc = check_toolchain(load_target("cpu-lab"))
    assert tc.cmake and tc.ninja and tc.cxx and tc.nvcc is None
