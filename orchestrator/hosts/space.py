"""Free space on a host, measured before a change needs it.

A full disk mid-route-write turned a recoverable failure into a dead pair (the rollback needed
the same write), so a deploy measures first: the package plus a margin under `releases/` before
the upload; the route record (written twice), pidfiles and logs under the root before the first
change. Too little is a refusal naming host, path, free and needed. Measured by the SFTP server's
statvfs, or one `df -Pk PATH` where it has none.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from orchestrator.errors import DiskFull, HostError
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import FreeBytes, FsResult, Transport, fs_batch

MIB = 1 << 20
UPLOAD_MARGIN_BYTES = 16 * MIB  # tar headers, the host's sha256sum output, a log line or two
SWITCH_NEEDED_BYTES = 8 * MIB  # route.json twice (temp + rename), pidfiles, the new services' first log lines


class NoSpace(DiskFull):
    """Not enough free space for the next change; nothing was changed (exit 6, as DiskFull)."""

    nothing_changed = True


@dataclass(frozen=True)
class Space:
    host: str
    path: str
    free_bytes: int

    def require(self, needed: int, what: str) -> None:
        if self.free_bytes < needed:
            raise NoSpace(
                f"no space left on {self.host}:{self.path} for {what}: {_mib(self.free_bytes)} free, "
                f"{_mib(needed)} needed; nothing was changed",
                hint=f"free space under {self.path} on {self.host} (old releases under releases/ can go), "
                "then run the command again",
            )


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def df_cmd(path: str) -> Cmd:
    return Cmd(("df", "-Pk", path))


def parse_df(output: str, host: str, path: str) -> Space:
    """`df -Pk` output: a header, then one line whose 4th field is the available 1K blocks."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    if len(lines) < 2:
        raise HostError(f"{host}: cannot read free space of {path}: df printed {output.strip()[:200]!r}")
    fields = lines[-1].split()
    try:
        avail_k = int(fields[-3])
    except (IndexError, ValueError):
        raise HostError(f"{host}: cannot read free space of {path} from df line {lines[-1][:200]!r}") from None
    return Space(host, path, avail_k * 1024)


def free_space(transport: Transport, path: str, known: FsResult = None) -> Space:
    """Free space under PATH: KNOWN when a batch already read it (fs_batch FreeBytes), else the
    SFTP server's statvfs, else `df -Pk` (an SFTP server without the extension)."""
    if known is None:
        known = fs_batch(transport, [FreeBytes(path)])[0]
    if isinstance(known, int) and not isinstance(known, bool):
        return Space(transport.name, path, known)
    res = transport.run(df_cmd(path), check=False, timeout=30)
    if res.exit_status != 0:
        raise HostError(
            f"{transport.name}: df {path} failed (exit {res.exit_status}): {as_text(res.stderr).strip()[-200:]}"
        )
    return parse_df(as_text(res.stdout), transport.name, path)


def refuses_writes(text: str) -> bool:
    """A host error that says a root takes no new file: full, or read-only (remote/ssh.py)."""
    low = text.lower()
    return "no space left" in low or "read-only" in low


def require_writable(transport: Transport, path: str, what: str) -> None:
    """PATH takes a new file now (one SFTP write and remove): a read-only filesystem is refused
    before any change (exit 6), not half-way after the other host's service was stopped."""
    from orchestrator.hosts.layout import unique_tmp

    probe = unique_tmp(posixpath.join(path, "write-probe"))
    try:
        transport.put_bytes(b"", probe, mode=0o600)
        transport.remove(probe)
    except (HostError, OSError) as exc:
        if isinstance(exc, DiskFull):
            raise
        raise NotWritable(
            f"{transport.name}: {path} does not take a new file ({getattr(exc, 'message', str(exc))[:200]}); "
            f"it is needed for {what}; "
            "nothing was changed",
            hint=f"make {path} writable on {transport.name} (a read-only mount? `mount`, `touch {path}/x`), "
            "then run the command again",
        ) from None


class NotWritable(HostError):
    """An install root that takes no new file: refused before any change (exit 6, host state)."""

    exit_code = DiskFull.exit_code
    nothing_changed = True
