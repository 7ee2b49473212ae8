"""Whether a config directory or file may be believed: by owner and mode, never by location.

A config file decides what runs as the operator, so whoever can write it, or replace a directory on
the way to it, is as powerful as the operator. As OpenSSH's StrictModes and git's safe.directory:
file, config directory and every directory on the way (of the path given and of where links lead)
owned by the user or root and not group/world-writable (a sticky directory like /tmp excepted). A
link is judged by where it leads: only its directory's owner can replace it, and that is judged too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.errors import ConfigError

FIX = "remove it, or make it yours and not group/world-writable (chown, chmod go-w), or run pairctl elsewhere"


def _owner_ok(st: os.stat_result, uid: int) -> bool:
    return st.st_uid in (uid, 0)


def _who(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _judge(path: Path, st: os.stat_result, uid: int, *, sticky_ok: bool) -> str | None:
    if not _owner_ok(st, uid):
        return f"{path} is owned by {_who(st.st_uid)}, not you ({_who(uid)}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _ancestors(path: Path) -> list[Path]:
    """/, /a, /a/b for /a/b/c (never PATH itself)."""
    return list(reversed(path.parents))


def unsafe_reason(path: Path, *, uid: int | None = None, sticky_ok: bool = False) -> str | None:
    """Why PATH (a file or directory) may not be believed, or None. Judges PATH itself (a sticky
    world-writable directory passes only with STICKY_OK) and every directory above it, both on
    the path as given and on the path its links resolve to."""
    uid = os.geteuid() if uid is None else uid
    given = Path(os.path.abspath(path))
    real = Path(os.path.realpath(given))
    seen: set[Path] = set()
    for chain in (given, real):
        for d in _ancestors(chain):
            if d in seen:
                continue
            seen.add(d)
            try:
                st = os.lstat(d)
            except OSError as e:
                return f"{d}: cannot stat ({e.strerror})"
            if stat.S_ISLNK(st.st_mode):
                continue  # judged where it leads (the resolved chain) and by its parent
            why = _judge(d, st, uid, sticky_ok=True)
            if why:
                return why
    try:
        st = os.stat(real)
    except OSError as e:
        return f"{real}: cannot stat ({e.strerror})"
    return _judge(real, st, uid, sticky_ok=sticky_ok)


def owned_by_user(path: Path, uid: int | None = None) -> bool:
    """Whether PATH (followed) is owned by the invoking user or root (False when absent)."""
    uid = os.geteuid() if uid is None else uid
    try:
        return _owner_ok(os.stat(path), uid)
    except OSError:
        return False


def check_config_dir(root: Path, origin: str) -> None:
    """Refuse a config directory (and the way to it) that someone else could have written."""
    why = unsafe_reason(root)
    if why:
        raise ConfigError(f"refusing config directory {root} (from {origin}): {why}", hint=FIX)


def check_config_file(path: Path) -> None:
    """Refuse a manifest file (and the way to it) that someone else could have written."""
    why = unsafe_reason(path)
    if why:
        raise ConfigError(f"refusing {path}: {why}", hint=FIX)
