"""JSON from the evidence store read as hostile input (anyone with the home's files can edit it):
bounded size and nesting, one error type; a 100,000-bracket receipt "does not verify", no crash."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from orchestrator.errors import EvidenceError

MAX_RECEIPT_BYTES = 1 << 30  # a receipt with a million samples is ~100 MB
MAX_DEPTH = 200  # receipts nest a few levels (steps -> data -> lists); far below json's recursion limit


def depth_exceeds(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Iterative, so a deep value cannot overflow the stack while it is measured."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return True
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return False


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file, never through a link (/dev/zero would be
    read forever, a FIFO block): a link or special file is an EvidenceError, OSError passes."""
    try:  # O_NONBLOCK: a FIFO does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EvidenceError(f"{path} is a symbolic link, not a file pairctl wrote") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EvidenceError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file (see open_regular); more is an EvidenceError."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise EvidenceError(f"{path} is {size} bytes, more than pairctl writes there ({limit})")
        data = f.read(size + 1)  # not read(limit): that allocates the limit up front
    if len(data) > limit:
        raise EvidenceError(f"{path} is more than {limit} bytes, more than pairctl writes there")
    return data


def read_receipt(path: Path) -> bytes:
    """A receipt file's bytes (a regular file of at most MAX_RECEIPT_BYTES)."""
    return read_bounded(path, MAX_RECEIPT_BYTES)


class Unbounded(ValueError):
    """JSON that is not JSON, or larger or deeper than its reader allows; the message says which."""


def parse_bounded(data: bytes | str, *, max_bytes: int, max_depth: int | None, noun: str) -> Any:
    """`json.loads` for hostile bytes: at most `max_bytes`, nested at most `max_depth` (None: what
    the parser survives); Unbounded names the bound (`noun`: what no such file is)."""
    if len(data) > max_bytes:
        raise Unbounded(f"is {len(data)} bytes, more than any {noun} pairctl writes ({max_bytes})")
    try:
        obj = json.loads(data)
    except RecursionError:
        raise Unbounded(f"is nested too deeply to be a {noun}") from None
    except (ValueError, MemoryError) as exc:
        raise Unbounded(f"is not JSON: {(str(exc) or type(exc).__name__).splitlines()[0]}") from None
    if max_depth is not None and depth_exceeds(obj, max_depth):
        raise Unbounded(f"is nested more than {max_depth} levels deep, which no {noun} is")
    return obj


def loads(data: bytes | str, *, what: str, max_depth: int | None = None) -> Any:
    """Parse `data`, or raise EvidenceError naming `what` (JSON error, too deep, too large).
    `max_depth`: also walk the value (for callers that recurse over it in Python)."""
    try:
        return parse_bounded(data, max_bytes=MAX_RECEIPT_BYTES, max_depth=max_depth, noun="receipt")
    except Unbounded as exc:
        raise EvidenceError(f"{what} {exc}") from None


def read_json(path: Path, *, max_bytes: int, max_depth: int, noun: str) -> Any:
    """A local state file's JSON (bisect state, lab indexes), bounded; Unbounded names the file
    and the bound (callers make it their own one-line error); OSError passes through."""
    with open_regular_or_unbounded(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise Unbounded(f"{path} is {size} bytes, more than any {noun} pairctl writes ({max_bytes})")
        data = f.read(max_bytes + 1)
    try:
        return parse_bounded(data, max_bytes=max_bytes, max_depth=max_depth, noun=noun)
    except Unbounded as exc:
        raise Unbounded(f"{path} {exc}") from None


def open_regular_or_unbounded(path: Path) -> BinaryIO:
    """open_regular with its refusals (a link, a special file) as Unbounded."""
    try:
        return open_regular(path)
    except EvidenceError as exc:
        raise Unbounded(exc.message) from None


INDEX_MAX_BYTES = 1 << 20  # the lab's models.json, real-model.json, host.json: a few hundred bytes each
INDEX_MAX_DEPTH = 16


def read_index(path: Path) -> Any:
    """A small JSON index pairctl wrote in its home, with the index bounds (Unbounded is a
    ValueError: a caller rewriting a damaged index rewrites a huge or deep one too)."""
    return read_json(path, max_bytes=INDEX_MAX_BYTES, max_depth=INDEX_MAX_DEPTH, noun="index")
