"""Releases on a host: upload a package under a temporary name, verify every file's sha256 on
the host against the manifest, rename into `releases/<id>`. An already present release that
verifies is not sent again.

Packing is pure (a tar stream in memory, sent as stdin of one remote command, so a package is
one round trip, not one per file); verification parses `sha256sum` output with
`probes.parse_sha256sum` and compares in Python.
"""

from __future__ import annotations

import io
import os
import secrets
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from orchestrator.errors import PackageError
from orchestrator.hosts.layout import HostLayout, tmp_release_name
from orchestrator.hosts.probes import hash_problems, parse_sha256sum


def expected_hashes(manifest: Any) -> dict[str, str]:
    """{relpath: sha256} of every file the manifest names (runtime and test)."""
    files = getattr(manifest, "files", None)
    if files is None and isinstance(manifest, Mapping):
        files = manifest["files"]
    out = {}
    for rel, entry in files.items():
        out[rel] = entry["sha256"] if isinstance(entry, Mapping) else entry.sha256
    return out


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


@dataclass(frozen=True)
class ReleaseResult:
    host: str
    package_id: str
    reused: bool
    bytes_sent: int
    files_verified: int

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "package": self.package_id, "reused": self.reused,
                "bytes_sent": self.bytes_sent, "files_verified": self.files_verified}


def verify_on_host(transport: Any, layout: HostLayout, dirname: str, expected: Mapping[str, str], host: str) -> int:
    res = transport.run(layout.hash_cmd(dirname), timeout=300)
    problems = hash_problems(expected, parse_sha256sum(_text(res.stdout)))
    if problems:
        raise PackageError(
            f"{host}: releases/{dirname} does not match its manifest: " + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""),
            hint="a release is never modified in place; remove that directory on the host and deploy again",
        )
    return len(expected)


def ensure_release(transport: Any, layout: HostLayout, package: Any, present: bool, host: str) -> ReleaseResult:
    """Make `releases/<id>` exist on the host and verify it; send bytes only when absent."""
    pid = package.manifest.id
    expected = expected_hashes(package.manifest)
    if present:
        n = verify_on_host(transport, layout, pid, expected, host)
        return ReleaseResult(host, pid, True, 0, n)
    tmp = tmp_release_name(pid, secrets.token_hex(4))
    data = pack(Path(package.path))
    transport.run(layout.unpack_cmd(tmp), stdin=data, timeout=600)
    try:
        n = verify_on_host(transport, layout, tmp, expected, host)
    except PackageError:
        transport.run(layout.discard_cmd(tmp), check=False, timeout=120)
        raise
    transport.run(layout.commit_cmd(tmp, pid), timeout=60)
    return ReleaseResult(host, pid, False, len(data), n)


def _text(out: str | bytes) -> str:
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else out
