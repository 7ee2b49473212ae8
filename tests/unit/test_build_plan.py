"""Pure build planning: package ids, cache keys, CMake argv, manifests' digests, ninja progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.build.git import Revision
from orchestrator.build.manifest import FileEntry, content_digest, diff_entries, package_id
from orchestrator.build.plan import cache_key, cmake_defines, make_plan
from orchestrator.build.progress import parse_ninja_status
from orchestrator.build.toolchain import Toolchain
from orchestrator.config.targets import load_target
from orchestrator.errors import PackageError

REV = Revision(
    commit="5423bddf352adc41a8cc59ed02d38a511b333d30", tree="8af9376af703ec4710b4cbed626457c52d5b9069", count=11434
)
TC = Toolchain(cmake="3.25.1", ninja="1.11.1", cxx="12.2.0", cxx_path="/usr/bin/g++-12", ccache="4.7.5")


def test_package_id_from_profile_revision_target() -> None:
    assert package_id("lab", REV.commit, "cpu-lab") == "lab-5423bddf35-cpu-lab"
    assert package_id(None, REV.commit, "v100") == "pkg-5423bddf35-v100"
    assert package_id("final-bf16", REV.commit, "v100") == "final-bf16-5423bddf35-v100"


@pytest.mark.parametrize("profile,rev", [("Bad/Name", REV.commit), ("lab", "5423bddf35"), ("../x", REV.commit)])
def test_package_id_refuses_bad_parts(profile: str, rev: str) -> None:
    with pytest.raises(PackageError):
        package_id(profile, rev, "cpu-lab")


def test_build_info_names_the_revision() -> None:
    assert REV.build_info == "b11434-5423bddf35"


def test_defines_carry_revision_rpc_and_target_flags() -> None:
    d = cmake_defines(load_target("cpu-lab"), REV, TC)
    assert d["GGML_RPC"] == "ON" and d["GGML_CUDA"] == "OFF"
    assert d["LLAMA_BUILD_COMMIT"] == "5423bddf35" and d["LLAMA_BUILD_NUMBER"] == "11434"
    assert d["BUILD_SHARED_LIBS"] == "OFF"


def test_cache_key_changes_with_tree_target_flags_toolchain_and_revision() -> None:
    t = load_target("cpu-lab")
    base = cache_key(REV.tree, t, cmake_defines(t, REV, TC), TC)
    assert base == cache_key(REV.tree, t, cmake_defines(t, REV, TC), TC)  # deterministic
    other_rev = Revision(commit="c7de202" + "0" * 33, tree=REV.tree, count=11433)  # same tree, other commit
    assert cache_key(REV.tree, t, cmake_defines(t, other_rev, TC), TC) != base  # build info differs
    assert cache_key("0" * 40, t, cmake_defines(t, REV, TC), TC) != base
    assert cache_key(REV.tree, load_target("h200"), cmake_defines(t, REV, TC), TC) != base
    newer = Toolchain(cmake="3.25.1", ninja="1.11.1", cxx="13.1.0", cxx_path="/usr/bin/g++-13", ccache="4.7.5")
    assert cache_key(REV.tree, t, cmake_defines(t, REV, TC), newer) != base
    no_ccache = Toolchain(cmake="3.25.1", ninja="1.12.0", cxx="12.2.0", cxx_path="/usr/bin/g++-12")
    assert cache_key(REV.tree, t, cmake_defines(t, REV, TC), no_ccache) == base  # launchers never change output


def test_plan_argv_and_env(tmp_path: Path) -> None:
    plan = make_plan(load_target("cpu-lab"), REV, TC, tmp_path / "cache")
    argv = plan.configure_argv()
    assert argv[:2] == ["cmake", "-S"] and "-G" in argv and argv[argv.index("-G") + 1] == "Ninja"
    assert "-DGGML_RPC=ON" in argv and "-DLLAMA_BUILD_COMMIT=5423bddf35" in argv
    assert "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" in argv
    assert f"-DCMAKE_CXX_FLAGS=-ffile-prefix-map={plan.work_dir}=/pairctl-build" in argv  # no home path in the binaries
    assert plan.build_argv()[-3:] == ["llama-server", "ggml-rpc-server", "test-backend-ops"]
    assert plan.work_dir == tmp_path / "cache" / "work" / "cpu-lab"
    env = plan.env({"PATH": "/usr/bin"})
    assert env["CCACHE_BASEDIR"] == str(plan.work_dir) and env["CCACHE_NOHASHDIR"] == "1"
    assert env["GIT_CEILING_DIRECTORIES"] == str(plan.work_dir)  # no enclosing repo's HEAD in the binaries


def test_cuda_plan_uses_checked_nvcc_and_cuda_launcher(tmp_path: Path) -> None:
    tc = Toolchain(cmake="3.25.1", ninja="1.11.1", cxx="12.2.0", cxx_path="/usr/bin/g++-12", ccache="4.7.5",
                   nvcc="12.6.85", nvcc_path="/opt/cuda-12.6/bin/nvcc")  # fmt: skip
    plan = make_plan(load_target("v100"), REV, tc, tmp_path)
    argv = plan.configure_argv()
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in argv and "-DGGML_CUDA=ON" in argv
    assert "-DCMAKE_CUDA_COMPILER=/opt/cuda-12.6/bin/nvcc" in argv
    assert "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache" in argv
    assert f"-DCMAKE_CUDA_FLAGS=-Xcompiler=-ffile-prefix-map={plan.work_dir}=/pairctl-build" in argv
    other = make_plan(load_target("v100"), REV, tc, tmp_path / "another home")
    assert other.key == plan.key  # where the home is never changes the cache key


def test_cuda_plan_puts_the_toolkits_own_tools_and_libraries_first(tmp_path: Path) -> None:
    """A wheel toolkit is on no search path, and another CUDA's ptxas may come first on PATH: the
    build and the package check search nvcc's folder and its root's libraries before the caller's."""
    root = tmp_path / "site" / "nvidia" / "cu13"
    tc = Toolchain(cmake="3.25.1", ninja="1.11.1", cxx="12.2.0", cxx_path="/usr/bin/g++-12",
                   nvcc="13.5.37", nvcc_path=str(root / "bin" / "nvcc"))  # fmt: skip
    plan = make_plan(load_target("rtx5060ti"), REV, tc, tmp_path)
    env = plan.env({"PATH": "/usr/local/bin:/usr/bin", "LD_LIBRARY_PATH": "/x"})
    assert env["PATH"] == f"{root / 'bin'}:/usr/local/bin:/usr/bin"
    assert env["LD_LIBRARY_PATH"] == f"{root / 'lib64'}:{root / 'lib'}:/x"
    assert plan.key == make_plan(load_target("rtx5060ti"), REV, tc, tmp_path / "b").key
    assert make_plan(load_target("cpu-lab"), REV, TC, tmp_path).env({"PATH": "/usr/bin"})["PATH"] == "/usr/bin"


def test_manifest_toolchain_records_where_nvcc_came_from() -> None:
    deb = "Debian package nvidia-cuda-toolkit 11.8.89~11.8.0-5~deb12u1"
    tc = Toolchain(cmake="3.25.1", ninja="1.11.1", cxx="12.2.0", cxx_path="/usr/bin/g++-12", nvcc="11.8.89",
                   nvcc_path="/usr/bin/nvcc", cuda_from=deb)  # fmt: skip
    assert tc.versions() == {
        "cmake": "3.25.1", "ninja": "1.11.1", "cxx": "12.2.0", "nvcc": "11.8.89", "nvcc_path": "/usr/bin/nvcc",
        "cuda_from": deb,
    }  # fmt: skip
    assert "cuda_from" not in TC.versions() and "nvcc_path" not in tc.output_relevant()


def _e(h: str, kind: str = "runtime", mode: str = "0755") -> FileEntry:
    return FileEntry(sha256=h * 64, size=10, kind=kind, mode=mode)  # type: ignore[arg-type]


def test_content_digest_is_order_independent_and_content_sensitive() -> None:
    a = {"bin/llama-server": _e("a"), "tests/bin/test-backend-ops": _e("b", "test")}
    b = dict(reversed(list(a.items())))
    assert content_digest(a) == content_digest(b)
    assert content_digest(a) != content_digest({**a, "bin/llama-server": _e("c")})
    assert content_digest(a) != content_digest({**a, "bin/llama-server": _e("a", mode="0644")})


def test_diff_entries_names_each_differing_file() -> None:
    old = {"bin/a": _e("a"), "bin/b": _e("b"), "bin/gone": _e("c")}
    new = {"bin/a": _e("a"), "bin/b": _e("d"), "bin/extra": _e("e")}
    lines = diff_entries(old, new)
    assert len(lines) == 3
    assert any(line.startswith("bin/b: sha256") for line in lines)
    assert any(line.startswith("bin/gone: only in the existing") for line in lines)
    assert any(line.startswith("bin/extra: only in the new") for line in lines)
    assert diff_entries(old, dict(old)) == []


def test_ninja_status_lines() -> None:
    assert parse_ninja_status("[12/215] Building CXX object common/arg.cpp.o\n") == (12, 215)
    assert parse_ninja_status("ninja: no work to do.") is None
    assert parse_ninja_status("-- Configuring done") is None
