"""`pairctl logs`: the last lines of a pair's service output files and, with `follow`, what is
appended. A read only. The host is untrusted: only a regular file (never through a link), at most
LOG_TAIL_MAX bytes a look; a host that does not answer is named, the other's log still shown."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.engine.plan import pair_view
from orchestrator.errors import HostError, HostStateError
from orchestrator.hosts.probes import service_dir
from orchestrator.remote.command import Cmd
from orchestrator.remote.pool import TransportPool
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import Transport
from orchestrator.roles import ROLES, SERVICE_OF_ROLE, Role

LOG_TAIL_MAX = 1 << 20  # bytes read per look: the last lines of a log, or what grew between two polls
READ_S = 20.0  # one read's bound (an exec over a live connection)


@dataclass
class HostLog:
    host: str
    role: Role
    path: str
    lines: list[str] = field(default_factory=list)
    size: int | None = None  # bytes in the file when read; None: no file (never started)
    error: str | None = None  # why nothing was read (unreachable, not a regular file)
    exit_code: int = 0  # 4 unreachable, 6 a log that is not a regular file
    truncated: bool = False  # more than LOG_TAIL_MAX bytes were new: only the last of them shown

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "exit_code"}  # the exit code is the command's


def roles_of(which: str) -> tuple[Role, ...]:
    chosen = tuple(r for r in ROLES if which in (r, "both", "all"))
    if not chosen:
        raise ValueError(which)
    return chosen


def _size(t: Transport, path: str) -> int | None:
    st = t.stat(path)
    if st is None:
        return None
    if not st.is_file:
        raise HostStateError(f"{path} is not a regular file (a link or device is never read)")
    return st.size


def _read_from(t: Transport, path: str, offset: int, size: int) -> tuple[bytes, bool]:
    """Bytes [offset, size) of the file, at most LOG_TAIL_MAX of its end (tail -c reads from the end)."""
    want = size - offset
    n = min(want, LOG_TAIL_MAX)
    if n <= 0:
        return b"", False
    res = t.run(Cmd.of("tail", "-c", str(n), "--", path), check=False, timeout=READ_S)
    if res.exit_status != 0:
        raise HostError(f"reading {path} failed (exit {res.exit_status}): {as_text(res.stderr).strip()[-200:]}")
    return (res.stdout_bytes or res.stdout.encode())[-n:], want > LOG_TAIL_MAX


def tail(pool: TransportPool, inventory: Inventory, pair: str, which: str, lines: int) -> list[HostLog]:
    """The last `lines` lines of each chosen service's output file."""
    view = pair_view(inventory, pair)
    out = []
    for role in roles_of(which):
        host, layout, name = view.hosts[role], view.layouts[role], SERVICE_OF_ROLE[role]
        log = HostLog(host, role, layout.log(name + ".out"))
        try:
            t = pool.get(host)
            log.path = posixpath.join(service_dir(t, layout.root, name), name + ".out")
            log.size = _size(t, log.path)
            if log.size is not None:
                # the last lines are within the last LOG_TAIL_MAX bytes, or only those are shown
                data, log.truncated = _read_from(t, log.path, 0, log.size)
                log.lines = as_text(data).splitlines()[-lines:] if lines > 0 else []
        except (HostError, HostStateError) as exc:
            log.error, log.exit_code = exc.message, int(exc.exit_code)
        out.append(log)
    return out


def follow(
    pool: TransportPool,
    logs: list[HostLog],
    *,
    seconds: float,
    poll_s: float = 1.0,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[str, str]]:
    """(host, line) as lines are appended, until `seconds` have passed. A file that shrank was
    rotated (the supervisor keeps log_keep old files): read again from its start."""
    end = now() + seconds
    offsets = {log.host: log.size or 0 for log in logs if log.error is None}
    while now() < end:
        sleep(max(0.0, min(poll_s, end - now())))
        for log in logs:
            if log.host not in offsets:
                continue
            try:
                t = pool.get(log.host)
                size = _size(t, log.path)
                if size is None:
                    continue
                start = offsets[log.host] if size >= offsets[log.host] else 0
                data, cut = _read_from(t, log.path, start, size)
            except (HostError, HostStateError) as exc:
                yield log.host, f"(stopped following: {exc.message})"
                del offsets[log.host]
                continue
            if cut:
                yield log.host, f"(... {size - start - LOG_TAIL_MAX} bytes skipped)"
                start = size - LOG_TAIL_MAX
            done = data[: data.rfind(b"\n") + 1]  # a partial last line waits for its newline
            offsets[log.host] = start + len(done)
            for line in as_text(done).splitlines():
                yield log.host, line
