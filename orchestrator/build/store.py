"""The package store: immutable, read-only package folders under `Home.store`, one per id.

A package is assembled in a temporary folder inside the store, then renamed into place and
made read-only, so a reader never sees half a package. It is never modified in place.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.build.manifest import MANIFEST_NAME, FileEntry, PackageManifest, content_digest
from orchestrator.errors import PackageError
from orchestrator.hashing import sha256_file


def hash_files(
    paths: Iterable[Path], *, workers: int | None = None, on_done: Callable[[Path], None] | None = None
) -> dict[Path, str]:
    """sha256 of many files in parallel threads (hashlib releases the GIL on large buffers)."""
    paths = list(paths)
    workers = workers or min(8, os.cpu_count() or 1, max(1, len(paths)))
    out: dict[Path, str] = {}
    with ThreadPoolExecutor(max_workers=workers) if workers > 1 else contextlib.nullcontext() as pool:
        for p, h in zip(paths, pool.map(sha256_file, paths) if pool else map(sha256_file, paths), strict=True):
            out[p] = h
            if on_done:
                on_done(p)
    return out


def file_mode(path: Path) -> str:
    """The mode a file has when deployed: 0755 if anyone may execute it, else 0644."""
    return "0755" if path.stat().st_mode & 0o111 else "0644"


def _chmod_tree(root: Path, mode: Callable[[int], int]) -> None:
    """`mode(old mode)` on every folder and file under root (links keep theirs)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for p in [Path(dirpath), *(Path(dirpath) / n for n in filenames if not (Path(dirpath) / n).is_symlink())]:
            p.chmod(mode(p.stat().st_mode))


def make_read_only(root: Path) -> None:
    _chmod_tree(root, lambda m: m & ~0o222)


def make_writable(root: Path) -> None:
    _chmod_tree(root, lambda m: m | stat.S_IWUSR)


def remove_tree(root: Path) -> None:
    if root.exists():
        make_writable(root)
        shutil.rmtree(root)


def list_files(root: Path) -> list[str]:
    """Relative paths of every file under root except the manifest itself."""
    out = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                out.append(rel)
    return sorted(out)


def not_regular(root: Path) -> list[str]:
    """Relative paths under root that are symlinks (to files or folders) or not regular files."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if p.is_symlink() or not (p.is_dir() if name in dirnames else stat.S_ISREG(p.lstat().st_mode)):
                out.append(p.relative_to(root).as_posix())
    return sorted(out)


@dataclass(frozen=True)
class Package:
    path: Path
    manifest: PackageManifest

    @property
    def id(self) -> str:
        return self.manifest.id

    def bin(self, name: str) -> Path:
        """Path of a runtime binary, e.g. `pkg.bin("llama-server")`."""
        return self.path / "bin" / name

    @property
    def help_text(self) -> str:
        return (self.path / self.manifest.help_file).read_text(encoding="utf-8", errors="replace")


@dataclass
class VerifyReport:
    id: str
    files_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


_PACKAGE_ID = re.compile(r"^(?P<profile>[a-z0-9][a-z0-9.-]*?)-(?P<rev>[0-9a-f]{10})-(?P<target>[a-z0-9][a-z0-9.-]*)$")


def how_to_get(package_id: str) -> str:
    """How a home that lacks `package_id` gets it: build the same revision here (the same inputs
    give the same id and files) or copy the folder from the home that built it and verify it."""
    copy = (
        "or copy its folder from the home that built it into this home's packages/ and check it with "
        f"`pairctl packages verify {package_id}`"
    )
    m = _PACKAGE_ID.match(package_id)
    if m is None:
        return f"build it from its revision (`pairctl build --rev REV --target TARGET`), {copy}"
    cmd = f"pairctl build --rev {m['rev']} --target {m['target']}"
    if m["profile"] != "pkg":
        cmd += f" --profile {m['profile']}"
    return (
        f"build it here from the same revision (the same inputs give the same id): `{cmd}` "
        f"(add `--source DIR` when that commit is not in the lab source), {copy}"
    )


class PackageStore:
    """`PackageStore(home.store)`: get / list / verify packages; install new ones atomically."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path_of(self, package_id: str) -> Path:
        if not package_id or "/" in package_id or package_id.startswith("."):
            raise PackageError(f"invalid package id {package_id!r}")
        return self.root / package_id

    def exists(self, package_id: str) -> bool:
        return (self.path_of(package_id) / MANIFEST_NAME).is_file()

    def get(self, package_id: str) -> Package:
        path = self.path_of(package_id)
        if not (path / MANIFEST_NAME).is_file():
            known = ", ".join(self.ids()) or "none"
            raise PackageError(
                f"no package {package_id!r} in {self.root} (known: {known})", hint=how_to_get(package_id)
            )
        manifest = PackageManifest.load(path / MANIFEST_NAME)
        if manifest.id != package_id:
            raise PackageError(f"{path}: manifest says id {manifest.id!r}, folder says {package_id!r}")
        return Package(path=path, manifest=manifest)

    def ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if not p.name.startswith(".") and (p / MANIFEST_NAME).is_file()
        )

    def list(self) -> list[Package]:
        return [self.get(i) for i in self.ids()]

    def verify(self, package_id: str, *, check: bool = True, workers: int | None = None) -> VerifyReport:
        """Rehash every file against the manifest; report each difference by file (raise if `check`)."""
        pkg = self.get(package_id)
        report = verify_tree(pkg.path, pkg.manifest, workers=workers)
        if pkg.path.is_symlink():
            report.problems.insert(0, f"{pkg.path}: the package folder is a symbolic link, not a folder of the store")
        if check and not report.ok:
            raise PackageError(
                f"package {package_id} fails verification ({len(report.problems)} problem(s)):\n"
                + "\n".join(f"  {p}" for p in report.problems)
            )
        return report

    def new_temp_dir(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))

    def install(self, tmp: Path, manifest: PackageManifest) -> Package:
        """Write the manifest into `tmp`, make it read-only and rename it to its id (atomic)."""
        (tmp / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        make_read_only(tmp)
        tmp.chmod(0o555)
        dest = self.path_of(manifest.id)
        try:
            os.rename(tmp, dest)
        except OSError as exc:
            remove_tree(tmp)
            raise PackageError(f"cannot move the new package into {dest}: {exc}") from None
        return self.get(manifest.id)

    def remove(self, package_id: str) -> None:
        """Delete a package (tests and explicit operator clean-up only)."""
        remove_tree(self.path_of(package_id))


def verify_tree(root: Path, manifest: PackageManifest, *, workers: int | None = None) -> VerifyReport:
    report = VerifyReport(id=manifest.id)
    if content_digest(manifest.files) != manifest.content_digest:
        report.problems.append(f"{MANIFEST_NAME}: content_digest does not match its file entries")
    for rel in not_regular(root):
        report.problems.append(
            f"{rel}: not a regular file (a symbolic link or special file; packages hold "
            "copies only, so a link could point anywhere)"
        )
    present = set(list_files(root))
    for rel in sorted(present - set(manifest.files)):
        report.problems.append(f"{rel}: not in the manifest")
    checkable = {rel: e for rel, e in manifest.files.items() if rel in present}
    for rel in sorted(set(manifest.files) - present):
        report.problems.append(f"{rel}: missing")
    hashes = hash_files([root / rel for rel in checkable], workers=workers)
    for rel, entry in sorted(checkable.items()):
        p = root / rel
        size = p.stat().st_size
        got = hashes[p]
        if got != entry.sha256:
            report.problems.append(f"{rel}: sha256 {got} != manifest {entry.sha256}")
        elif size != entry.size:
            report.problems.append(f"{rel}: size {size} != manifest {entry.size}")
        if entry.executable and not os.access(p, os.X_OK):
            report.problems.append(f"{rel}: not executable")
        report.files_checked += 1
    return report


def entries_for(root: Path, kinds: dict[str, str], *, workers: int | None = None,
                on_done: Callable[[Path], None] | None = None) -> dict[str, FileEntry]:  # fmt: skip
    """FileEntry for each relpath in `kinds` ({relpath: runtime|test|meta})."""
    hashes = hash_files([root / r for r in kinds], workers=workers, on_done=on_done)
    return {
        rel: FileEntry(
            sha256=hashes[root / rel], size=(root / rel).stat().st_size, kind=kind, mode=file_mode(root / rel)
        )
        for rel, kind in sorted(kinds.items())
    }
