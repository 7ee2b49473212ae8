"""Releases on a host: upload a package (a tar stream as one exec's stdin) under a temporary name,
verify every file's sha256 on the host against the manifest, rename into `releases/<id>`. A
present release that verifies is not sent again.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import secrets
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from orchestrator import progress
from orchestrator.errors import HostError, PackageError
from orchestrator.hosts import space
from orchestrator.hosts.layout import HostLayout, tmp_release_name
from orchestrator.hosts.probes import hash_problems, parse_sha256sum
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import Transport


def expected_hashes(manifest: Any) -> dict[str, str]:
    """{relpath: sha256} of every file the manifest names (runtime and test)."""
    files = getattr(manifest, "files", None)
    if files is None and isinstance(manifest, Mapping):
        files = manifest["files"]
    if files is None:
        raise TypeError(f"{type(manifest).__name__} names no files")
    out = {}
    for rel, entry in files.items():
        out[rel] = entry["sha256"] if isinstance(entry, Mapping) else entry.sha256
    return out


@lru_cache(maxsize=2)
def _packed(package_dir: str) -> bytes:
    """One tar per package per process (a lab pair sends the same package to both hosts);
    packages are immutable, so the path identifies the content."""
    return pack(Path(package_dir))


def pack(package_dir: Path) -> bytes:
    """The package folder as an uncompressed tar (regular files, dirs and symlinks; stable order)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(package_dir):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = Path(dirpath) / name
                rel = full.relative_to(package_dir).as_posix()
                info = tar.gettarinfo(str(full), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def manifest_lines(expected: Mapping[str, str]) -> bytes:
    """The manifest as `sha256sum` output lines ("HASH  ./PATH"), what the helper compares with."""
    return "".join(f"{h}  ./{rel}\n" for rel, h in sorted(expected.items())).encode()


class ReleaseMismatch(PackageError):
    """A present release does not match its manifest; the step that found it changed nothing."""

    nothing_changed = True


def check_hash_output(expected: Mapping[str, str], output: str, host: str, where: str) -> int:
    """Compare the helper's `list_files` output (sha256sum lines, then `entries=N`) with the
    manifest (pure): every file with its sha256, and nothing else but manifest.json (a planted
    library in lib/ would be loaded first). Returns the number verified; raises ReleaseMismatch."""
    sums = "\n".join(line for line in output.splitlines() if _SHA_LINE.match(line))
    observed = parse_sha256sum(sums)
    problems = hash_problems(expected, observed)
    problems += [f"{p}: not in the manifest" for p in sorted(set(observed) - set(expected) - {"manifest.json"})]
    counts = [line.split("=", 1)[1].strip() for line in output.splitlines() if line.startswith("entries=")]
    if len(counts) != 1 or not counts[0].isdigit():
        problems.append(
            "the host's helper printed no entry count (an older pairctl-svc? deploy installs the current one)"
        )
    elif int(counts[0]) != len(observed):
        problems.append(
            f"{counts[0]} entries but {len(observed)} regular files listed: a link, fifo or device "
            "(or a name sha256sum cannot print) is there"
        )
    if problems:
        raise ReleaseMismatch(
            f"{host}: {where} does not match its manifest: "
            + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""),
            hint="a release is never modified in place; remove that directory on the host and deploy again",
        )
    return len(expected)


_SHA_LINE = re.compile(r"^[0-9a-f]{64} [ *]")


@dataclass(frozen=True)
class ReleaseResult:
    host: str
    package_id: str
    reused: bool
    bytes_sent: int
    files_verified: int
    deferred: bool = False  # present release: verified by the exec that stops its service, before it does
    leftovers_removed: tuple[str, ...] = ()  # partial uploads of earlier runs, removed first

    def to_dict(self) -> dict[str, Any]:
        d = {
            "host": self.host,
            "package": self.package_id,
            "reused": self.reused,
            "bytes_sent": self.bytes_sent,
            "files_verified": self.files_verified,
        }
        if self.leftovers_removed:
            d["leftovers_removed"] = list(self.leftovers_removed)
        if self.deferred:
            d["verified"] = "on the host, by sha256sum in the exec that stops its service, before it stops it"
        return d


def ensure_release(
    transport: Transport, layout: HostLayout, package: Any, present: bool, host: str, *, defer_present: bool = False
) -> ReleaseResult:
    """Make `releases/<id>` exist on the host, every file verified by sha256 on the host. Absent:
    one exec unpacks into `releases/.<id>.tmp-<nonce>` and prints what landed, compared here, then
    renamed. Present: one `sha256sum` exec; with `defer_present` none: the stop exec verifies."""
    pid = package.manifest.id
    expected = expected_hashes(package.manifest)
    # under the lease nobody else is uploading: a killed upload's directory goes now, sent or not
    removed = tuple(discard_leftovers(transport, layout))
    if present and defer_present:
        return ReleaseResult(host, pid, True, 0, 0, deferred=True, leftovers_removed=removed)
    if present:
        res = transport.run(layout.hash_cmd(pid), timeout=300)
        n = check_hash_output(expected, as_text(res.stdout), host, f"releases/{pid}")
        return ReleaseResult(host, pid, True, 0, n, leftovers_removed=removed)
    data = _packed(str(package.path))
    space.free_space(transport, layout.releases).require(len(data) + space.UPLOAD_MARGIN_BYTES, f"the upload of {pid}")
    tmp = tmp_release_name(pid, secrets.token_hex(4))
    t0 = time.monotonic()
    try:
        res = transport.run(layout.unpack_cmd(tmp), stdin=data, timeout=600)
    except HostError as exc:
        try:  # a tar that ran out of space (or was cut off) leaves no partial directory
            transport.run(layout.discard_cmd(tmp), check=False, timeout=120)
        except HostError:
            pass  # the next deploy under the lease removes it (discard_leftovers)
        if "no space left" in str(exc).lower():
            raise space.NoSpace(
                f"no space left on {host}:{layout.releases} while unpacking {pid} "
                f"({len(data)} bytes); the partial upload was removed, nothing else changed"
            ) from None
        # tar's last line names no cause: a root that takes no new file is said as such
        space.require_writable(transport, layout.releases, f"the upload of {pid}")
        raise
    progress.event("upload", f"upload {pid} to {host}: {progress.rate(len(data), time.monotonic() - t0)}", host=host)
    try:
        n = check_hash_output(expected, as_text(res.stdout), host, f"the upload of {pid}")
    except PackageError:
        transport.run(layout.discard_cmd(tmp), check=False, timeout=120)
        raise
    transport.rename(posixpath.join(layout.releases, tmp), layout.release(pid))
    return ReleaseResult(host, pid, False, len(data), n, leftovers_removed=removed)


_TMP_NAME = re.compile(r"^\.[A-Za-z0-9][A-Za-z0-9._-]*\.tmp-[0-9a-f]+$")


def leftovers(transport: Transport, layout: HostLayout) -> list[str]:
    """Temporary upload directories under releases/ (a killed or failed upload's): `status` lists them."""
    try:
        names = transport.listdir(layout.releases)
    except (FileNotFoundError, OSError):
        return []
    return sorted(n for n in names if _TMP_NAME.match(n))


def discard_leftovers(transport: Transport, layout: HostLayout) -> list[str]:
    """Remove every leftover upload directory (the caller holds the host's lease)."""
    found = leftovers(transport, layout)
    for name in found:
        transport.run(layout.discard_cmd(name), timeout=120)
    return found
