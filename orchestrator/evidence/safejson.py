"""JSON from the evidence store read as hostile input: bounded size, bounded nesting, one error type.

Receipts, heads, index entries and journals can be edited by anyone with the home's files; a
100,000-bracket receipt must be "does not verify" (exit 10), never a RecursionError.
"""

from __future__ import annotations

import json
from typing import Any

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


def loads(data: bytes | str, *, what: str, max_depth: int | None = None) -> Any:
    """Parse `data`, or raise EvidenceError naming `what` (JSON error, too deep, too large).
    `max_depth`: also walk the value (for callers that recurse over it in Python)."""
    if len(data) > MAX_RECEIPT_BYTES:
        raise EvidenceError(f"{what} is {len(data)} bytes, more than any receipt pairctl writes ({MAX_RECEIPT_BYTES})")
    try:
        obj = json.loads(data)
    except RecursionError:
        raise EvidenceError(f"{what} is nested too deeply to be a receipt") from None
    except (ValueError, MemoryError) as exc:
        raise EvidenceError(f"{what} is not JSON: {(str(exc) or type(exc).__name__).splitlines()[0]}") from None
    if max_depth is not None and depth_exceeds(obj, max_depth):
        raise EvidenceError(f"{what} is nested more than {max_depth} levels deep, which no receipt is")
    return obj
