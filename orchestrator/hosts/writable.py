"""Whether the login user can make a directory on a host, decided from facts read over SFTP only
(no process on the host, no write), so a dry run says what the real run's mkdir would answer.

The facts: the credentials the host's SFTP server runs with, which are the login user's
(/proc/self/status: Uid, Gid, Groups, CapEff), the nearest directory on the way that exists (owner,
group, mode), and whether its file system is mounted read-only: the kernel's own answer where the
SFTP server has statvfs@openssh.com (its f_flag's ST_RDONLY), else /proc/self/mounts (the mount
that holds it, a later mount over a path hiding the earlier ones at or under it, and its `ro`
option). Root (uid 0), and a user with CAP_DAC_OVERRIDE, pass the mode bits, never a read-only mount.

Only the classic permission bits and the read-only flag are judged: chattr's immutable and
append-only flags, SELinux/AppArmor and quotas are out of scope, and so are ACLs: a grant by an ACL
entry the mode bits do not show (a shared sticky parent granting a user or group by ACL, say) is
refused here although its mkdir would work. The check judges only the computed default state dir
(layout.check_state_dir): setting hosts.NAME.state_dir to a path is the way past a false refusal.
A link, or something not a directory, at or above the nearest existing directory is not judged
(lstat below a link follows it). Where a fact cannot be read the answer is "cannot tell" (None),
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
# statvfs's f_flag bit for a read-only mount (Linux ST_RDONLY; OpenSSH's SSH2_FXE_STATVFS_ST_RDONLY)
ST_RDONLY = 0x1
# CapEff's bit of CAP_DAC_OVERRIDE (linux/capability.h): mode bits do not stop its holder
CAP_DAC_OVERRIDE = 1


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mounts: where it is mounted, the file system type, its options."""

    point: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


# the kernel escapes only space, tab, newline and backslash (\040 \011 \012 \134): one byte each,
# so never past \377; a \4xx-\7xx is no escape and stays as written
_OCTAL = re.compile(rb"\\([0-3][0-7]{2})")


def _unescape(field: bytes) -> str:
    return _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field).decode("utf-8", "replace")


def parse_mounts(data: bytes) -> list[Mount]:
    """/proc/self/mounts (`SOURCE POINT TYPE OPTIONS DUMP PASS` a line) in its order; a line of
    another shape (no absolute mount point) is skipped. Split on the bytes the kernel writes
    between lines and fields (b"\\n", b" ") only: a UTF-8 mount point may hold any other byte
    (0x85, 0xa0, 0x0b), which str.splitlines and str.split would cut it at."""
    out = []
    for line in data.split(b"\n"):
        f = line.split(b" ")
        if len(f) >= 4 and f[1].startswith(b"/"):
            out.append(Mount(_unescape(f[1]), _unescape(f[2]), tuple(_unescape(f[3]).split(","))))
    return out


def _holds(point: str, path: str) -> bool:
    return (path + "/").startswith(point.rstrip("/") + "/")


def mount_of(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount PATH (absolute, without links) is on: of the mounts still visible (a mount at P
    hides every one listed before it at or under P), the longest point holding it. None where
    none holds it."""
    path = posixpath.normpath(path)
    seen: list[Mount] = []
    for m in mounts:
        seen = [s for s in seen if not _holds(m.point, s.point)]
        seen.append(m)
    held = [m for m in seen if _holds(m.point, path)]
    return max(held, key=lambda m: len(m.point.rstrip("/")), default=None)


@dataclass(frozen=True)
class Creds:
    """Who a file system check sees: the filesystem uid, every group (the filesystem gid included),
    and whether CAP_DAC_OVERRIDE lets it past the mode bits."""

    uid: int
    groups: frozenset[int]
    dac_override: bool = False


def parse_creds(data: bytes) -> Creds | None:
    """/proc/self/status's `Uid:` and `Gid:` (real, effective, saved, filesystem: permission checks
    use the last), `Groups:` and `CapEff:` (hex; missing reads as none); None where the ids are not
    there in that shape."""
    fields: dict[bytes, list[bytes]] = {}
    for line in data.split(b"\n"):
        key, sep, value = line.partition(b":")
        if sep:
            fields[key] = value.split()
    try:
        uid, gid = int(fields[b"Uid"][3]), int(fields[b"Gid"][3])
        groups = frozenset(int(g) for g in fields.get(b"Groups", []))
        cap = int(fields.get(b"CapEff", [b"0"])[0], 16)
    except (KeyError, IndexError, ValueError):
        return None
    return Creds(uid, groups | {gid}, bool(cap >> CAP_DAC_OVERRIDE & 1))


def nearest(chain: Sequence[tuple[str, FsResult]]) -> str | None:
    """Where `mkdir -p` of CHAIN's first path makes its first directory: the nearest directory
    that exists, where every entry from it up to `/` is a directory, not a link (an lstat below a
    link follows it). None where the first path exists or that cannot be told."""
    found = next((i for i, (_, r) in enumerate(chain) if r is not None), None)
    if found is None or found == 0:
        return None
    if not all(isinstance(r, FileStat) and r.is_dir for _, r in chain[found:]):
        return None  # a link, a file, an unreadable answer on the way: cannot tell
    return chain[found][0]


def why_not_made(
    chain: Sequence[tuple[str, FsResult]], creds: Creds | None, mounts: Sequence[Mount] | None, flags: FsResult = None
) -> str | None:
    """Why `mkdir -p` of CHAIN's first path would be refused, in mkdir's words (READ_ONLY, DENIED),
    or None: it exists, it can be made, or that cannot be told. CHAIN: that path, then each
    directory above it up to `/`, with its lstat (a FileStat, None where it does not exist). The
    first directory made is made in the nearest one that exists (`nearest`): read-only by FLAGS
    (its statvfs f_flag, an int) where the host said, else by MOUNTS; then its mode."""
    where = nearest(chain)
    if where is None:
        return None
    st = next(r for p, r in chain if p == where)
    assert isinstance(st, FileStat)
    if isinstance(flags, int):
        if flags & ST_RDONLY:
            return READ_ONLY
    elif mounts and (m := mount_of(mounts, where)) is not None and m.read_only:
        return READ_ONLY
    if creds is None or creds.uid == 0 or creds.dac_override:
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
