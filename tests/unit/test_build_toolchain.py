"""Toolchain parsers on captured output (nvcc 13.0 on the lent H200) and the CUDA refusals."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.build.toolchain import (
    CUDA_ROOTS_ENV,
    NvccVersion,
    check_toolchain,
    configured_toolkit_mismatch,
    cuda_refusal,
    nvcc_candidates,
    parse_gpu_arches,
    parse_nvcc_version,
    parse_version_line,
    wheel_versions,
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


def _clean_cuda_env(monkeypatch: pytest.MonkeyPatch, *, path_first: Path | None = None) -> None:
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.delenv(CUDA_ROOTS_ENV, raising=False)
    if path_first is not None:
        monkeypatch.setenv("PATH", f"{path_first}{os.pathsep}{os.environ['PATH']}")


def test_nvcc_candidates_order_cudacxx_roots_path_default(tmp_path: Path) -> None:
    bindir = _fake_nvcc(tmp_path, NVCC_VERSION, NVCC_ARCHES)
    env = {"CUDACXX": "/x/nvcc", CUDA_ROOTS_ENV: f"/r12{os.pathsep}{os.pathsep}/r13", "PATH": str(bindir)}
    assert nvcc_candidates(env) == [
        "/x/nvcc",
        "/r12/bin/nvcc",
        "/r13/bin/nvcc",
        str(bindir / "nvcc"),
        "/usr/local/cuda/bin/nvcc",
    ]


def test_v100_takes_the_cuda12_root_when_path_has_cuda13(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two toolkits side by side, as for v100 + rtx5060ti: each target gets the first that can build it."""
    new, old = tmp_path / "cu13", tmp_path / "cu12"
    new.mkdir(), old.mkdir()
    _clean_cuda_env(monkeypatch, path_first=_fake_nvcc(new, NVCC_VERSION, NVCC_ARCHES))
    _fake_nvcc(old, NVCC_12_VERSION, NVCC_12_ARCHES)
    (old / "dist-info" / "nvidia_cuda_nvcc-12.6.85.dist-info").mkdir(parents=True)
    monkeypatch.setenv(CUDA_ROOTS_ENV, str(old))
    tc = check_toolchain(load_target("v100"))
    assert tc.nvcc_path == str(old / "bin" / "nvcc") and tc.cuda_root == old
    v = tc.versions()
    assert (v["nvcc"], v["nvcc_path"], v["cuda_from"]) == ("12.6.85", str(old / "bin" / "nvcc"),
                                                           "wheels: nvidia-cuda-nvcc 12.6.85")  # fmt: skip
    assert check_toolchain(load_target("rtx5060ti")).nvcc_path == str(new / "bin" / "nvcc")


def test_refusal_names_every_nvcc_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _clean_cuda_env(monkeypatch, path_first=_fake_nvcc(a, NVCC_VERSION, NVCC_ARCHES))
    _fake_nvcc(b, NVCC_VERSION, NVCC_ARCHES)
    monkeypatch.setenv(CUDA_ROOTS_ENV, str(b))
    with pytest.raises(BuildError) as err:
        check_toolchain(load_target("v100"))
    assert str(a / "bin" / "nvcc") in err.value.message and str(b / "bin" / "nvcc") in err.value.message
    assert CUDA_ROOTS_ENV in (err.value.hint or "")


def test_a_toolkit_root_others_can_write_is_refused_before_nvcc_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cu12"
    root.mkdir()
    _fake_nvcc(root, NVCC_12_VERSION, NVCC_12_ARCHES)
    (tmp_path / "ran").mkdir()
    (root / "bin" / "nvcc").write_text(f"#!/bin/sh\ntouch {tmp_path}/ran/yes\n")
    root.chmod(0o777)
    _clean_cuda_env(monkeypatch)
    monkeypatch.setenv(CUDA_ROOTS_ENV, str(root))
    with pytest.raises(BuildError, match=r"refusing nvcc .*writable by others"):
        check_toolchain(load_target("v100"))
    assert not (tmp_path / "ran" / "yes").exists()


def test_wheel_versions_of_a_pip_target_folder(tmp_path: Path) -> None:
    """`pip install --target SITE` puts CUDA 13 in SITE/nvidia/cu13 and the dist-info beside `nvidia`."""
    root = tmp_path / "nvidia" / "cu13"
    root.mkdir(parents=True)
    for d in ("nvidia_cuda_nvcc-13.5.37.dist-info", "nvidia_cublas-13.10.0.20.dist-info", "typer-0.9.dist-info"):
        (tmp_path / d).mkdir()
    assert wheel_versions(root) == {"nvidia-cublas": "13.10.0.20", "nvidia-cuda-nvcc": "13.5.37"}
    assert wheel_versions(tmp_path / "absent" / "nvidia" / "cu13") == {}


def test_configured_toolkit_must_be_the_checked_nvccs() -> None:
    """Captured: with /usr/local/bin/nvcc (CUDA 13.0) first on PATH, CMake took 13.0's headers and
    Debian's CUDA 11 cublas for a build whose nvcc was a CUDA 13.5 wheel."""
    cache = (
        "CUDAToolkit_BIN_DIR:PATH=/usr/local/cuda-13.0/bin\nCUDAToolkit_NVCC_EXECUTABLE:FILEPATH=/usr/local/bin/nvcc"  # noqa: E501
    )
    why = configured_toolkit_mismatch(cache, "/w/nvidia/cu13/bin/nvcc")
    assert why is not None and "/usr/local/bin/nvcc" in why and "/w/nvidia/cu13/bin/nvcc" in why
    ok = "CUDAToolkit_NVCC_EXECUTABLE:FILEPATH=/w/nvidia/cu13/bin/nvcc\n"
    assert configured_toolkit_mismatch(ok, "/w/nvidia/cu13/bin/nvcc") is None
    assert configured_toolkit_mismatch("", "/usr/bin/nvcc") is not None


def test_a_listed_root_without_nvcc_is_named_not_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo in the list would otherwise build silently with whatever nvcc comes next."""
    _clean_cuda_env(monkeypatch, path_first=_fake_nvcc(tmp_path, NVCC_12_VERSION, NVCC_12_ARCHES))
    monkeypatch.setenv(CUDA_ROOTS_ENV, str(tmp_path / "cuda-12.9"))
    with pytest.raises(BuildError, match=r"lists .*cuda-12\.9, which has no executable bin/nvcc"):
        check_toolchain(load_target("v100"))
