"""The whole build pipeline on a tiny CMake project that mimics llama.cpp's outputs.

Real git, cmake, ninja and compiler, seconds instead of minutes: export, proof of an empty source
diff, configure with the revision's build info, compile, package, cache hit, verify-on-rebuild.
The real llama.cpp build is covered by tests/e2e/test_build.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.build.builder import BuildRequest, build
from orchestrator.build.store import PackageStore, make_writable
from orchestrator.errors import BuildError, PackageError
from orchestrator.lab.source import git_env
from orchestrator.paths import Home

CMAKE = """cmake_minimum_required(VERSION 3.16)
project(fake C)
add_compile_definitions(COMMIT="${LLAMA_BUILD_COMMIT}" NUMBER=${LLAMA_BUILD_NUMBER} RPC_${GGML_RPC})
add_executable(llama-server server.c)
add_executable(ggml-rpc-server rpc.c)
add_executable(test-backend-ops tbo.c)
add_executable(unrelated rpc.c)
"""
SERVER = (
    r"""#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--version")) { """
    r"""fprintf(stderr, "version: 0 (build %d, commit %s)\n", NUMBER, COMMIT); return 0; }
  if (argc > 1 && !strcmp(argv[1], "--help")) { """
    r"""printf("--rpc SERVERS   comma separated list of RPC servers\n"); return 0; }
  return 1;
}
"""
)
TARGET = """name: cpu-fake
backend: cpu
cmake_flags: {CMAKE_BUILD_TYPE: Release}
build_targets: [llama-server, ggml-rpc-server]
test_targets: [test-backend-ops]
kernel_harness: false
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=git_env(), check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, Path, Home]:
    repo = tmp_path / "src"
    repo.mkdir()
    (repo / "CMakeLists.txt").write_text(CMAKE)
    (repo / "server.c").write_text(SERVER)
    (repo / "rpc.c").write_text("int main(void) { return 0; }\n")
    (repo / "tbo.c").write_text("int main(void) { return 0; }\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "fake baseline")
    _git(repo, "tag", "baseline")
    target = tmp_path / "cpu-fake.yaml"
    target.write_text(TARGET)
    return repo, target, Home.resolve(tmp_path / "home")


def test_build_package_cache_hit_and_verify(fake: tuple[Path, Path, Home]) -> None:
    repo, target, home = fake
    req = BuildRequest(source=repo, rev="baseline", targets=(str(target),), profile="lab")
    (first,) = build(home, req, interactive=False)
    commit = _git(repo, "rev-parse", "HEAD")
    m = first.package.manifest
    assert first.status == "built" and not first.cached
    assert m.id == f"lab-{commit[:10]}-cpu-fake" and m.revision == commit and m.build_info == f"b1-{commit[:10]}"
    assert (
        m.source_diff == "" and m.cmake_flags["GGML_RPC"] == "ON" and m.cmake_flags["LLAMA_BUILD_COMMIT"] == commit[:10]
    )
    assert set(m.files) == {"bin/llama-server", "bin/ggml-rpc-server", "tests/bin/test-backend-ops",
                            "meta/llama-server.help.txt", "meta/version.txt"}  # fmt: skip
    assert "unrelated" not in str(m.files)  # only the listed targets are packaged
    assert f"commit {commit[:10]}" in (first.package.path / "meta" / "version.txt").read_text()
    assert PackageStore(home.store).verify(m.id).ok
    from orchestrator.evidence.store import EvidenceStore

    receipt = EvidenceStore(home.evidence).path_of(first.receipt or "missing")
    assert receipt.is_file() and m.content_digest in receipt.read_text()

    (again,) = build(home, req, interactive=False)
    assert again.status == "verified" and again.cached and again.package.manifest == m


def test_rebuild_differing_from_existing_package_is_refused(fake: tuple[Path, Path, Home]) -> None:
    repo, target, home = fake
    req = BuildRequest(source=repo, rev="baseline", targets=(str(target),))
    (first,) = build(home, req, interactive=False)
    path = first.package.path
    make_writable(path)
    with open(path / "bin" / "ggml-rpc-server", "ab") as f:
        f.write(b"\0")
    before = (path / "bin" / "ggml-rpc-server").read_bytes()
    with pytest.raises(PackageError, match=r"bin/ggml-rpc-server") as info:
        build(home, req, interactive=False)
    assert "nothing was replaced" in str(info.value) and "bin/llama-server" not in str(info.value)
    assert (path / "bin" / "ggml-rpc-server").read_bytes() == before


def test_working_copy_edits_never_reach_the_package(fake: tuple[Path, Path, Home]) -> None:
    repo, target, home = fake
    (repo / "server.c").write_text("#error working copy\n")
    with pytest.raises(BuildError, match="uncommitted"):
        build(home, BuildRequest(source=repo, rev="baseline", targets=(str(target),)), interactive=False)
    _git(repo, "checkout", "--", "server.c")
    (res,) = build(home, BuildRequest(source=repo, rev="baseline", targets=(str(target),)), interactive=False)
    assert res.status == "built"


def test_compile_failure_is_a_build_error_with_the_log(fake: tuple[Path, Path, Home]) -> None:
    repo, target, home = fake
    (repo / "rpc.c").write_text("this is not C\n")
    _git(repo, "commit", "-q", "-am", "broken")
    with pytest.raises(BuildError, match=r"cmake --build failed .*full log"):
        build(home, BuildRequest(source=repo, rev="HEAD", targets=(str(target),)), interactive=False)
    assert not PackageStore(home.store).ids()


def test_gitattributes_never_change_the_exported_bytes(fake: tuple[Path, Path, Home]) -> None:
    """Issue 49 item 6: a commit whose `.gitattributes` asks for `ident`, CRLF conversion and a
    filter driver (defined in the repository's own config, which `git archive` obeys) built with
    an export that was not the commit: `$Id$` expanded in the binary, CRLF CMakeLists.txt, a
    smudged source. The package must be built from the commit's blobs, byte for byte."""
    repo, target, home = fake
    (repo / "server.c").write_text(SERVER.replace('printf("--rpc', 'printf("$Id$\\n--rpc'))
    (repo / ".gitattributes").write_text("*.c ident\nCMakeLists.txt ident text eol=crlf\nrpc.c filter=evil\n")
    (repo / "CMakeLists.txt").write_text("# $Id$\n" + CMAKE)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "attributes")
    # defined after the commit, so `git add` never ran it: only an export can
    _git(repo, "config", "filter.evil.smudge", "sed s/return.0/return 7/")
    _git(repo, "config", "filter.evil.clean", "cat")
    (res,) = build(home, BuildRequest(source=repo, rev="HEAD", targets=(str(target),)), interactive=False)
    help_text = (res.package.path / "meta" / "llama-server.help.txt").read_text()
    assert "$Id$" in help_text and "$Id:" not in help_text
    src = home.root / "build-cache"
    exported = {p.name: p.read_bytes() for p in src.rglob("src/*") if p.is_file()}
    for name in ("CMakeLists.txt", "rpc.c", "server.c", ".gitattributes"):
        blob = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", f"HEAD:{name}"], env=git_env(),
                              check=True, capture_output=True).stdout  # fmt: skip
        assert exported[name] == blob, name
