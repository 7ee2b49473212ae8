"""The package store on small synthetic packages: atomic install, read-only, verify by file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.build.manifest import PackageManifest, TargetRecord, content_digest
from orchestrator.build.store import PackageStore, entries_for, hash_files, make_writable
from orchestrator.errors import PackageError
from orchestrator.hashing import sha256_file

REV = "9d37488533b01a0ea7d113a42bd6eae78cc331ef"
TREE = "27d5f643d32b32ff0a28caf6eb53a7612bc5de96"


def _install(store: PackageStore, pid: str = "lab-9d37488533-cpu-lab") -> PackageManifest:
    tmp = store.new_temp_dir()
    (tmp / "bin").mkdir()
    (tmp / "tests" / "bin").mkdir(parents=True)
    (tmp / "meta").mkdir()
    for rel, data in (("bin/llama-server", b"\x7fELF server" * 1000), ("bin/ggml-rpc-server", b"\x7fELF rpc"),
                      ("tests/bin/test-backend-ops", b"\x7fELF tests")):  # fmt: skip
        (tmp / rel).write_bytes(data)
        (tmp / rel).chmod(0o755)
    (tmp / "meta" / "llama-server.help.txt").write_text("--rpc SERVERS\n")
    kinds = {"bin/llama-server": "runtime", "bin/ggml-rpc-server": "runtime", "tests/bin/test-backend-ops": "test",
             "meta/llama-server.help.txt": "meta"}  # fmt: skip
    files = entries_for(tmp, kinds)
    m = PackageManifest(
        id=pid, revision=REV, tree=TREE, build_number=1, build_info="b1-9d37488533", source_diff="",
        target=TargetRecord(name="cpu-lab", spec={}), cmake_flags={"GGML_RPC": "ON"}, toolchain={"cmake": "3.25.1"},
        build_host="h", build_cache_key="k", started_at="t0", finished_at="t1", files=files,
        content_digest=content_digest(files),
    )  # fmt: skip
    store.install(tmp, m)
    return m


def test_install_is_read_only_and_listed(tmp_path: Path) -> None:
    store = PackageStore(tmp_path / "packages")
    m = _install(store)
    pkg = store.get(m.id)
    assert store.ids() == [m.id] and [p.id for p in store.list()] == [m.id]
    assert not os.access(pkg.path / "bin" / "llama-server", os.W_OK) or os.geteuid() == 0
    assert not (pkg.path.stat().st_mode & 0o222) and not ((pkg.path / "bin" / "llama-server").stat().st_mode & 0o222)
    assert pkg.manifest.runtime_files().keys() == {"bin/llama-server", "bin/ggml-rpc-server"}
    assert pkg.manifest.test_files().keys() == {"tests/bin/test-backend-ops"}
    assert pkg.manifest.files["bin/llama-server"].sha256 == sha256_file(pkg.bin("llama-server"))
    assert store.verify(m.id).ok
    assert not list(store.root.glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["byte", "missing", "extra", "mode"])
def test_verify_reports_the_damaged_file(tmp_path: Path, damage: str) -> None:
    store = PackageStore(tmp_path / "packages")
    m = _install(store)
    root = store.path_of(m.id)
    make_writable(root)
    target = root / "bin" / "ggml-rpc-server"
    if damage == "byte":
        data = bytearray(target.read_bytes())
        data[3] ^= 0x01
        target.write_bytes(data)
    elif damage == "missing":
        target.unlink()
    elif damage == "extra":
        (root / "bin" / "evil").write_bytes(b"x")
    else:
        target.chmod(0o644)
    report = store.verify(m.id, check=False)
    assert not report.ok
    name = "bin/evil" if damage == "extra" else "bin/ggml-rpc-server"
    assert [p for p in report.problems if p.startswith(name)], report.problems
    with pytest.raises(PackageError, match=name):
        store.verify(m.id)


def test_manifest_entry_tampering_breaks_content_digest(tmp_path: Path) -> None:
    store = PackageStore(tmp_path / "packages")
    m = _install(store)
    root = store.path_of(m.id)
    make_writable(root)
    text = (root / "manifest.json").read_text().replace('"kind": "test"', '"kind": "runtime"')
    (root / "manifest.json").write_text(text)
    assert any("content_digest" in p for p in store.verify(m.id, check=False).problems)


def test_unknown_id_is_a_package_error(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="no package"):
        PackageStore(tmp_path).get("nope")
    with pytest.raises(PackageError, match="invalid package id"):
        PackageStore(tmp_path).get("../etc")


def test_parallel_hashing_matches_sequential(tmp_path: Path) -> None:
    files = []
    for i in range(6):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(100_000 + i))
        files.append(p)
    assert hash_files(files, workers=4) == {p: sha256_file(p) for p in files} == hash_files(files, workers=1)


@pytest.mark.parametrize("how", ["file", "dir", "package"])
def test_symlink_in_the_store_fails_verification(tmp_path: Path, how: str) -> None:
    """Issue 16 item 12: a file swapped for a link to an identical copy (same hash) is still refused."""
    store = PackageStore(tmp_path / "packages")
    m = _install(store)
    root = store.path_of(m.id)
    make_writable(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    if how == "file":
        target = root / "bin" / "ggml-rpc-server"
        (outside / "rpc").write_bytes(target.read_bytes())
        (outside / "rpc").chmod(0o755)
        target.unlink()
        target.symlink_to(outside / "rpc")
    elif how == "dir":
        import shutil

        shutil.copytree(root / "meta", outside / "meta")
        shutil.rmtree(root / "meta")
        (root / "meta").symlink_to(outside / "meta")
    else:
        import shutil

        shutil.copytree(root, outside / m.id, symlinks=True)
        shutil.rmtree(root)
        root.symlink_to(outside / m.id)
    report = store.verify(m.id, check=False)
    assert not report.ok and any("symbolic link" in p for p in report.problems), report.problems
    with pytest.raises(PackageError, match="symbolic link"):
        store.verify(m.id)


def test_a_missing_package_says_how_to_get_it_by_its_id(tmp_path):
    """Issue 48 item 5: a second operator's home lacks the package another home deployed; deploy,
    rollback and status name the build that makes the same id (or the copy to verify)."""
    from orchestrator.build.store import how_to_get
    from orchestrator.errors import PackageError

    store = PackageStore(tmp_path / "packages")
    pid = "lab-5423bddf35-cpu-lab"
    with pytest.raises(PackageError) as exc:
        store.get(pid)
    hint = exc.value.hint or ""
    assert f"no package {pid!r}" in exc.value.message
    assert "`pairctl build --rev 5423bddf35 --target cpu-lab --profile lab`" in hint
    assert f"`pairctl packages verify {pid}`" in hint and "--source DIR" in hint
    assert "--profile" not in how_to_get("pkg-5423bddf35-v100")  # the default prefix needs none
    assert "--rev REV" in how_to_get("odd")
