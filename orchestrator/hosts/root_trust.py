"""Whether an install root on a host may be used: by owner and mode, as OpenSSH's StrictModes.

pairctl runs `sh <root>/bin/pairctl-svc` as the SSH user and writes there, so whoever else can
write the helper, pairctl's folders or a directory on the way could run code as that user. So
every directory from `/` to the root, the root, its folders and the helper must be owned by the
login user or root, not group/other writable (a sticky directory on the way may be), and not
links; only run/ may be a link, to the host's state_dir as written, and leases/ only to
run/leases. Read over SFTP in one pipelined batch, before the helper is read or run.
"""

from __future__ import annotations

import posixpath
import secrets
import stat
from typing import Any

from orchestrator.errors import HostStateError
from orchestrator.remote.transport import ConnectionLost, FileStat, FsResult, Lstat, Transport, Unreachable, fs_batch

# the install root's own folders and files pairctl runs or writes (HostLayout names them)
_DIRS = ("bin", "run", "releases", "leases", "secrets")
_FILES = ("bin/pairctl-svc",)


def login_uid(transport: Transport) -> int | None:
    """The uid the transport acts as on the host, where it can tell (None: root only counts). An
    unreachable host is not "cannot tell": that error goes up (else the next read retries)."""
    fn: Any = getattr(transport, "login_uid", None)
    try:
        return int(fn()) if fn is not None else None
    except (Unreachable, ConnectionLost):
        raise
    except (OSError, TypeError, ValueError):
        return None


def _judge(path: str, st: FileStat, owners: set[int], *, sticky_ok: bool, want_dir: bool) -> str | None:
    if st.is_link:
        return f"{path} is a link (pairctl follows no link on the way to or inside its install root)"
    if want_dir and not st.is_dir:
        return f"{path} is not a directory"
    if not want_dir and not st.is_file:
        return f"{path} is not a regular file"
    if st.uid not in owners:
        return f"{path} is owned by uid {st.uid}, not the login user or root"
    if st.mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and st.mode & stat.S_ISVTX):
        who = "others" if st.mode & stat.S_IWOTH else "its group"
        return f"{path} is writable by {who} (mode {st.perms:04o})"
    return None


def root_problem(transport: Transport, root: str, state: str | None = None) -> str | None:
    """Why ROOT on this host may not be used, or None (also None when it does not exist yet: the
    directories above it are still judged, since pairctl will create it there). run/ may be a
    link to STATE (the host's state_dir), exactly, and nowhere else."""
    uid = login_uid(transport)
    owners = {0} | ({uid} if uid is not None else set())
    parts = [p for p in root.split("/") if p]
    chain = ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
    dirs = [posixpath.join(root, d) for d in _DIRS]
    files = [posixpath.join(root, f) for f in _FILES]
    # every lstat at once (one SFTP round trip), judged in the same order as one by one
    got = fs_batch(transport, [Lstat(p) for p in (*chain, *dirs, *files)])
    seen = dict(zip((*chain, *dirs, *files), got, strict=True))
    for i, path in enumerate(chain):
        st = _stat_of(seen[path])
        if st is None:
            return None  # pairctl creates the rest (makedirs, 0755) under a directory judged safe
        last = i == len(chain) - 1
        why = _judge(path, st, owners, sticky_ok=not last, want_dir=True)
        if why:
            return why
        if last and uid is None:
            owners.add(st.uid)  # cannot tell the login user: the root's own owner, judged above
    links = {"run": state, "leases": "run/leases"}  # the only links a root holds, each to exactly this
    for name, p in zip(_DIRS, dirs, strict=True):
        st = _stat_of(seen[p])
        if st is not None and st.is_link and name in links and st.uid in owners:
            if (target := transport.readlink(p)) != links[name] or target is None:
                want = f"this host's state_dir {state}" if name == "run" else links[name]
                return f"{p} is a link to {target!r}, not to {want}"
            if name == "run" and (why := root_problem(transport, target)):
                return why
            continue
        if st is not None and (why := _judge(p, st, owners, sticky_ok=False, want_dir=True)):
            return why
    for p in files:
        st = _stat_of(seen[p])
        if st is not None and (why := _judge(p, st, owners, sticky_ok=False, want_dir=False)):
            return why
    return None


def _stat_of(r: FsResult) -> FileStat | None:
    assert r is None or isinstance(r, FileStat), r  # an Lstat gives a FileStat or None
    return r


def check_root(transport: Transport, root: str, state: str | None = None) -> None:
    """Refuse (exit 6, before anything there is run or written) an install root others can change."""
    why = root_problem(transport, root, state)
    if why:
        raise HostStateError(
            f"{transport.name}: refusing install root {root}: {why}",
            hint=f"on {transport.name}, make it owned by the login user or root and not group/world-writable "
            "(chown, chmod go-w), with no link on the way; or choose another install_root",
        )


def put_new(transport: Transport, data: bytes, path: str, mode: int) -> None:
    """Write PATH by rename from a temporary name next to it that is unique to this call and
    created exclusively (O_EXCL: a planted file or link there fails the write, never followed)."""
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp-{secrets.token_hex(6)}")
    transport.put_private(data, tmp)
    try:
        if mode != 0o600:
            transport.chmod(tmp, mode)
        transport.rename(tmp, path)
    except BaseException:
        try:
            transport.remove(tmp)
        except OSError:
            pass
        raise
