"""Whether the login user can make a directory on a host, decided from facts read over SFTP only
(no process on the host, no write), so a dry run says what the real run's mkdir would answer.

The facts: the credentials the host's SFTP server runs with, which are the login user's
(/proc/self/status: Uid, Gid, Groups), the nearest directory on the way that exists (owner,
group, mode), and the mount it is on (/proc/self/mounts: the longest mount point holding it, and
its `ro` option). Root (uid 0) writes anywhere but on a read-only mount.

Only the classic permission bits and the mount's `ro` flag are judged: ACLs, chattr's immutable
and append-only flags, SELinux/AppArmor and quotas are out of scope, as is a link on the way
(its target is not stat'ed). Where a fact cannot be read the answer is "cannot tell" (None),
never a refusal: the real run's mkdir still fails, and its caller says so (layout._link_run).
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.remote.transport import FileStat, FsResult

# what mkdir(2) answers, in the words the local transport's OSError carries
READ_ONLY = os.strerror(errno.EROFS)
DENIED = os.strerror(errno.EACCES)


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mounts: where it is mounted, the file system type, its options."""

    point: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """The kernel writes a space, tab, newline or backslash in a mount field as \\040, \\011, \\012,
    \\134 (octal bytes); FIELD is the file decoded as latin-1, so each byte is one character."""
    raw = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)
    return raw.encode("latin-1").decode("utf-8", "replace")


def parse_mounts(data: bytes) -> list[Mount]:
    """/proc/self/mounts (`SOURCE POINT TYPE OPTIONS DUMP PASS` a line) in its order; a line of
    another shape (no absolute mount point) is skipped."""
    out = []
    for line in data.decode("latin-1").splitlines():
        f = line.split()
        if len(f) >= 4 and f[1].startswith("/"):
            out.append(Mount(_unescape(f[1]), _unescape(f[2]), tuple(f[3].split(","))))
    return out


def mount_of(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount PATH (absolute, without links) is on: the longest mount point holding it, and of
    equal ones the last listed (a mount over another hides it). None where none holds it."""
    path = posixpath.normpath(path)
    best: Mount | None = None
    for m in mounts:
        point = m.point.rstrip("/")
        if (path + "/").startswith(point + "/") and (best is None or len(point) >= len(best.point.rstrip("/"))):
            best = m
    return best


@dataclass(frozen=True)
class Creds:
    """Who a file system check sees: the filesystem uid, and every group (the filesystem gid included)."""

    uid: int
    groups: frozenset[int]


def parse_creds(data: bytes) -> Creds | None:
    """/proc/self/status's `Uid:` and `Gid:` (real, effective, saved, filesystem: permission checks
    use the last) and `Groups:`; None where they are not there in that shape."""
    fields: dict[str, list[str]] = {}
    for line in data.decode("latin-1").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.split()
    try:
        uid, gid = int(fields["Uid"][3]), int(fields["Gid"][3])
        groups = frozenset(int(g) for g in fields.get("Groups", []))
    except (KeyError, IndexError, ValueError):
        return None
    return Creds(uid, groups | {gid})


def why_not_made(
    chain: Sequence[tuple[str, FsResult]], creds: Creds | None, mounts: Sequence[Mount] | None
) -> str | None:
    """Why `mkdir -p` of CHAIN's first path would be refused, in mkdir's words (READ_ONLY, DENIED),
    or None: it exists, it can be made, or that cannot be told. CHAIN: that path, then each
    directory above it up to `/`, with its lstat (a FileStat, None where it does not exist). The
    first directory made is made in the nearest one that exists: its mount, then its mode."""
    found = next(((i, r) for i, (_, r) in enumerate(chain) if r is not None), None)
    if found is None or found[0] == 0 or not isinstance(found[1], FileStat) or not found[1].is_dir:
        return None  # it exists (or a link, a file, an unreadable answer on the way: cannot tell)
    where, st = chain[found[0]][0], found[1]
    if mounts and (m := mount_of(mounts, where)) is not None and m.read_only:
        return READ_ONLY
    if creds is None or creds.uid == 0:
        return None
    if st.uid == creds.uid:
        need = stat.S_IWUSR | stat.S_IXUSR
    elif st.gid is None:
        return None  # the transport names no group
    elif st.gid in creds.groups:
        need = stat.S_IWGRP | stat.S_IXGRP
    else:
        need = stat.S_IWOTH | stat.S_IXOTH
    return None if st.mode & need == need else DENIED


def ancestors(path: str) -> list[str]:
    """PATH, then each directory above it up to `/`."""
    out = [posixpath.normpath(path)]
    while out[-1] != "/":
        out.append(posixpath.dirname(out[-1]))
    return out
