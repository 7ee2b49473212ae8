"""`manifest.json`: what a package is, file by file, and the identities derived from it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.errors import PackageError
from orchestrator.hashing import sha256_json

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
_ID_PART = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Frozen):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    kind: Literal["runtime", "test", "meta"]
    mode: str = Field(pattern=r"^0[0-7]{3}$", description="permission bits when deployed: 0755 or 0644")

    @property
    def executable(self) -> bool:
        return bool(int(self.mode, 8) & 0o111)


class TargetRecord(_Frozen):
    name: str
    spec: dict[str, Any]


class PatchRecord(_Frozen):
    name: str
    sha256: str
    base_revision: str | None = None


class PackageManifest(_Frozen):
    schema_version: int = SCHEMA_VERSION
    id: str
    revision: str = Field(pattern=r"^[0-9a-f]{40}$")
    tree: str = Field(pattern=r"^[0-9a-f]{40}$")
    build_number: int
    build_info: str = Field(description="what /props build_info reports: b<N>-<rev10>")
    source_diff: str = Field(description="diff of the built tree against `tree`; empty, proven at build time")
    target: TargetRecord
    cmake_flags: dict[str, str]
    toolchain: dict[str, str]
    build_host: str
    build_cache_key: str
    started_at: str
    finished_at: str
    files: dict[str, FileEntry]
    content_digest: str
    patch: PatchRecord | None = None
    help_file: str = "meta/llama-server.help.txt"

    def runtime_files(self) -> dict[str, FileEntry]:
        return {k: v for k, v in self.files.items() if v.kind == "runtime"}

    def test_files(self) -> dict[str, FileEntry]:
        return {k: v for k, v in self.files.items() if v.kind == "test"}

    @property
    def short_revision(self) -> str:
        return self.revision[:10]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> PackageManifest:
        try:
            return cls.model_validate_json(Path(path).read_bytes())
        except FileNotFoundError:
            raise PackageError(f"{path}: no manifest") from None
        except ValueError as exc:
            raise PackageError(f"{path}: invalid manifest: {exc}") from None


def content_digest(files: dict[str, FileEntry]) -> str:
    """sha256 over the sorted file entries: equal digests mean equal package contents."""
    return sha256_json({k: files[k].model_dump() for k in sorted(files)})


def package_id(profile: str | None, revision: str, target: str) -> str:
    """`<profile-or-'pkg'>-<rev10>-<target>`, e.g. `lab-5423bddf35-cpu-lab`."""
    prefix = profile or "pkg"
    for part, what in ((prefix, "profile"), (target, "target")):
        if not _ID_PART.match(part):
            raise PackageError(f"{what} {part!r} cannot be part of a package id (lowercase letters, digits, '.', '-')")
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise PackageError(f"revision {revision!r} is not a full commit id")
    return f"{prefix}-{revision[:10]}-{target}"


def diff_entries(old: dict[str, FileEntry], new: dict[str, FileEntry]) -> list[str]:
    """One line per differing file: changed content/size/mode, missing, or extra."""
    out = []
    for rel in sorted(set(old) | set(new)):
        a, b = old.get(rel), new.get(rel)
        if a is None:
            out.append(f"{rel}: only in the new build")
        elif b is None:
            out.append(f"{rel}: only in the existing package")
        elif a != b:
            what = [f for f in ("sha256", "size", "kind", "mode") if getattr(a, f) != getattr(b, f)]
            out.append(f"{rel}: {', '.join(what)} differ ({a.sha256[:12]} vs {b.sha256[:12]})")
    return out
