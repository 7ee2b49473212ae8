"""`pairctl build` end to end: real CPU builds of the lab source, real binaries, real store.

The session fixtures (tests/plugins/packages.py) run the real `pairctl build`; the first run in
a fresh home compiles llama.cpp, later runs hit the build cache and verify.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.build.manifest import MANIFEST_NAME
from orchestrator.build.store import Package, PackageStore, make_writable
from orchestrator.hashing import sha256_file
from orchestrator.paths import Home
from tests.plugins.packages import LAB_PROFILE, LAB_TARGET, REV_B_TAG, run_pairctl

pytestmark = pytest.mark.e2e


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_manifest_matches_files_revision_and_tree(lab_packages: Package, lab_source: Path) -> None:
    m = lab_packages.manifest
    commit = _git(lab_source, "rev-parse", "baseline^{commit}")
    assert m.id == f"{LAB_PROFILE}-{commit[:10]}-{LAB_TARGET}"
    assert m.revision == commit and m.tree == _git(lab_source, "rev-parse", "baseline^{tree}")
    assert m.build_number == 1 and m.build_info == f"b1-{commit[:10]}"
    assert m.source_diff == "" and m.cmake_flags["GGML_RPC"] == "ON"
    assert set(m.runtime_files()) >= {"bin/llama-server", "bin/ggml-rpc-server"}
    assert set(m.test_files()) == {"tests/bin/test-backend-ops", "tests/bin/ggml-kernel-cases"}  # + the kernel harness
    assert "meta/llama-server.help.txt" in m.files and "--rpc" in lab_packages.help_text
    for rel, entry in m.files.items():
        p = lab_packages.path / rel
        assert sha256_file(p) == entry.sha256 and p.stat().st_size == entry.size, rel
    assert not (lab_packages.path / "bin" / "llama-server").stat().st_mode & 0o222  # read-only


def test_no_build_path_in_the_package(lab_packages: Package, pairctl_home: Path) -> None:
    """ggml's asserts and logs carry `__FILE__`: without -ffile-prefix-map the build folder (under
    this home) is in llama-server 100+ times, so the same inputs built in another home hashed
    differently. The manifest's flags, too, are free of the home."""
    home = str(pairctl_home.resolve()).encode()
    for rel in lab_packages.manifest.files:
        assert home not in (lab_packages.path / rel).read_bytes(), rel
    assert str(pairctl_home.resolve()) not in json.dumps(lab_packages.manifest.cmake_flags)


def test_llama_server_version_names_the_revision(lab_packages: Package) -> None:
    out = subprocess.run(
        [str(lab_packages.bin("llama-server")), "--version"], capture_output=True, text=True, timeout=60
    )
    text = out.stdout + out.stderr
    assert f"commit {lab_packages.manifest.short_revision}" in text and "build 1," in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_running_server_reports_build_info_in_props(lab_packages: Package, pairctl_home: Path, tmp_path: Path) -> None:
    from orchestrator.lab.models import ensure_lab_models

    model = ensure_lab_models(Home.resolve(pairctl_home).lab / "models").paths["target"]
    port = _free_port()
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [str(lab_packages.bin("llama-server")), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
         "-c", "512", "-np", "1", "-t", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "llama-server not healthy in 60 s"
            time.sleep(0.1)
        props = httpx.get(f"{base}/props", timeout=10).json()
        assert props["build_info"] == lab_packages.manifest.build_info
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _copy_to_temp_store(pkg: Package, home: Path) -> Path:
    dest = Home.resolve(home).store / pkg.id
    shutil.copytree(pkg.path, dest, symlinks=True)
    make_writable(dest)
    return dest


def test_verify_rejects_one_changed_byte_on_a_copy(lab_packages: Package, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    copy = _copy_to_temp_store(lab_packages, home)
    ok = cli("--json", "packages", "verify", lab_packages.id, home=home)
    assert ok.exit_code == 0 and json.loads(ok.stdout)["ok"], ok.output
    victim = copy / "bin" / "ggml-rpc-server"
    with open(victim, "r+b") as f:
        f.seek(victim.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))
    bad = cli("--json", "packages", "verify", lab_packages.id, home=home)
    assert bad.exit_code == 6, bad.output
    report = json.loads(bad.stdout)
    assert not report["ok"] and [p for p in report["problems"] if p.startswith("bin/ggml-rpc-server: sha256")]
    assert len(report["problems"]) == 1
    assert (
        PackageStore(Home.resolve(pairctl_home_of(lab_packages)).store).verify(lab_packages.id).ok
    )  # shared one untouched


def pairctl_home_of(pkg: Package) -> Path:
    return pkg.path.parent.parent


def test_dirty_tree_is_refused(lab_source: Path, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(lab_source), str(clone)], check=True)
    assert cli("build", "--source", str(clone), "--rev", "nope-not-a-rev", "--target", LAB_TARGET).exit_code == 6
    (clone / "tools" / "server" / "stray.cpp").write_text("// not committed\n")
    r = cli("build", "--source", str(clone), "--rev", "baseline", "--target", LAB_TARGET)
    assert r.exit_code == 6 and "uncommitted changes or untracked files" in r.stderr and "stray.cpp" in r.stderr


def test_revision_that_is_not_a_commit_is_refused(lab_source: Path, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("build", "--source", str(lab_source), "--rev", "baseline^{tree}", "--target", LAB_TARGET)
    assert r.exit_code == 6 and "not a commit" in r.stderr


def test_expect_tree_mismatch_is_refused(lab_source: Path, lab_rev_b: str, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli(
        "build", "--source", str(lab_source), "--rev", REV_B_TAG, "--expect-tree", "baseline", "--target", LAB_TARGET
    )
    assert r.exit_code == 6 and "tree mismatch" in r.stderr, r.output


def test_rebuild_same_inputs_skips_cmake_and_verifies(lab_packages: Package, pairctl_home: Path) -> None:
    before = (lab_packages.path / MANIFEST_NAME).read_bytes()
    proc = run_pairctl(
        pairctl_home, "--json", "build", "--target", LAB_TARGET, "--rev", "baseline", "--profile", LAB_PROFILE
    )
    assert proc.returncode == 0, proc.stderr
    (res,) = json.loads(proc.stdout)
    assert res["status"] == "verified" and res["cached"] is True and res["id"] == lab_packages.id
    assert (lab_packages.path / MANIFEST_NAME).read_bytes() == before


def test_rebuild_into_a_differing_existing_id_is_refused_and_replaces_nothing(
    lab_packages: Package, lab_source: Path, pairctl_home: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    copy = _copy_to_temp_store(lab_packages, home)
    help_file = copy / "meta" / "llama-server.help.txt"
    help_file.write_text(help_file.read_text() + "tampered\n")
    key = lab_packages.manifest.build_cache_key  # reuse the shared home's outputs: no compile here
    shutil.copytree(
        Home.resolve(pairctl_home).build_cache / "outputs" / key, Home.resolve(home).build_cache / "outputs" / key
    )
    snapshot = {p: sha256_file(p) for p in copy.rglob("*") if p.is_file()}
    proc = run_pairctl(
        home,
        "build",
        "--source",
        str(lab_source),
        "--target",
        LAB_TARGET,
        "--rev",
        "baseline",
        "--profile",
        LAB_PROFILE,
    )
    assert proc.returncode == 6, proc.stderr
    assert "already exists and differs" in proc.stderr and "meta/llama-server.help.txt" in proc.stderr
    assert "bin/llama-server" not in proc.stderr.split("differs", 1)[1]
    assert {p: sha256_file(p) for p in copy.rglob("*") if p.is_file()} == snapshot


def test_second_revision_package_names_its_own_revision(
    lab_packages: Package, lab_packages_b: Package, lab_rev_b: str
) -> None:
    a, b = lab_packages.manifest, lab_packages_b.manifest
    assert (
        b.revision == lab_rev_b
        and b.id == f"{LAB_PROFILE}-{lab_rev_b[:10]}-{LAB_TARGET}"
        and b.build_info == f"b2-{lab_rev_b[:10]}"
    )
    assert a.tree != b.tree and a.id != b.id
    out = subprocess.run(
        [str(lab_packages_b.bin("llama-server")), "--version"], capture_output=True, text=True, timeout=60
    )
    assert f"commit {lab_rev_b[:10]}" in out.stdout + out.stderr
    assert PackageStore(lab_packages_b.path.parent).verify(b.id).ok


def test_packages_list_and_show(lab_packages: Package, cli) -> None:  # type: ignore[no-untyped-def]
    listed = cli("--json", "packages", "list")
    assert listed.exit_code == 0 and lab_packages.id in [p["id"] for p in json.loads(listed.stdout)]
    shown = cli("--json", "packages", "show", lab_packages.id)
    assert shown.exit_code == 0 and json.loads(shown.stdout)["content_digest"] == lab_packages.manifest.content_digest
    assert (
        cli("packages", "show", "no-such-package").exit_code == 2
    )  # an ID naming no package: a usage error (issue 34)
