"""Durable file writes: temp file, fsync, then link/rename into place, then fsync the directory."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes, mode: int) -> Path:
    tmp = path.parent / f".tmp-{path.name}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        os.fchmod(fd, mode)  # read-only before it is ever visible under its final name
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def write_once(path: Path, data: bytes, *, mode: int = 0o444) -> bool:
    """Create `path` with `data` by link() (an existing file is never touched); False if it existed
    (the caller checks its bytes)."""

    tmp = _write_temp(path, data, mode)
    try:
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return created


def replace(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Atomically replace `path` (small mutable pointers: chain heads)."""
    tmp = _write_temp(path, data, mode)
    os.replace(tmp, path)
    fsync_dir(path.parent)
