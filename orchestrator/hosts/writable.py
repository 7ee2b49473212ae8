"""What SFTP says of a path's file system, with no process on the host and no write: the mount it
is on (/proc/self/mounts, for layout.fs_type's tmpfs warning) and whether `mkdir -p` of a missing
directory would be refused as read-only (why_not_made, for layout.check_state_dir).

Only what the kernel states is predicted: a read-only file system, from statvfs's f_flag
(ST_RDONLY) of the nearest existing directory. Mode bits are not predicted: they are not the
authority on NFS, CIFS or FUSE (the server decides; id-mapping shows 'nobody'), nor where ACLs or
capabilities grant more than they show. The mounts table is not used for it either:
/proc/self/mounts lists mounts in attach order (initramfs mounts moved in come before /), so a
longest-prefix or "a later mount hides earlier ones" rule misjudges. A parent the login user cannot
write is still refused by the real run (layout._link_run: exit 6, the same message), just not by a
dry run; so is anything where statvfs is unsupported or an answer cannot be read (no prediction).
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.remote.transport import FileStat, FsResult

# what mkdir(2) answers on a read-only file system, in the words the local transport's OSError carries
READ_ONLY = os.strerror(errno.EROFS)
# statvfs's f_flag bit for a read-only mount (Linux ST_RDONLY; OpenSSH's SSH2_FXE_STATVFS_ST_RDONLY)
ST_RDONLY = 0x1


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mounts: where it is mounted and the file system type."""

    point: str
    fstype: str


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
        if len(f) >= 3 and f[1].startswith(b"/"):
            out.append(Mount(_unescape(f[1]), _unescape(f[2])))
    return out


def mount_of(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The longest mount point holding PATH (absolute, without links); of equal points the last
    listed (mounted over the others). None where none holds it."""
    path = posixpath.normpath(path) + "/"
    held = [m for m in reversed(mounts) if path.startswith(m.point.rstrip("/") + "/")]
    return max(held, key=lambda m: len(m.point.rstrip("/")), default=None)  # max: the first of equals


def why_not_made(lstats: Sequence[FsResult], flags: Sequence[FsResult]) -> str | None:
    """Why `mkdir -p` of a path would be refused (READ_ONLY, mkdir's words), or None: it exists,
    it can be made, or that cannot be told. LSTATS: the path's, then each directory's above it up
    to `/` (ancestors; an error answer as a value); FLAGS: the statvfs f_flag of each of those
    above (an int, or the error). mkdir -p makes its first directory in the nearest one that exists:
    judged where that is a directory (links above it are followed by lstat and statvfs alike)."""
    i = next((i for i, r in enumerate(lstats) if r is not None), 0)
    if i == 0 or not (isinstance(r := lstats[i], FileStat) and r.is_dir):
        return None  # there, nothing there at all, a link, a file or an unreadable answer: cannot tell
    flag = flags[i - 1]
    return READ_ONLY if isinstance(flag, int) and flag & ST_RDONLY else None


def ancestors(path: str) -> list[str]:
    """PATH, then each directory above it up to `/`."""
    out = [posixpath.normpath(path)]
    while (up := posixpath.dirname(out[-1])) != out[-1]:
        out.append(up)
    return out
