"""Text for a person's terminal: control characters from hosts and evidence are shown, not obeyed.

Lease owners, route record fields, server answers and receipts are written by others; an ESC in one
would act on the operator's terminal. Every console renders its strings with `visible`; pairctl's own
styling is added after.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# C0 controls except tab and newline, DEL, and C1 controls (0x9b is a one-byte CSI).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# What must happen before anything else writes to the terminal: the live progress display
# (orchestrator/progress.py) clears its spinner lines, so a table never lands on one.
_before_output: list[Callable[[], None]] = []
_hooks_lock = threading.Lock()


def on_output(hook: Callable[[], None] | None) -> None:
    """Install (or, with None, remove) the one hook run before any other console writes."""
    with _hooks_lock:
        _before_output.clear()
        if hook is not None:
            _before_output.append(hook)


def before_output() -> None:
    with _hooks_lock:
        hooks = list(_before_output)
    for hook in hooks:
        hook()


def size(n_bytes: int | float | None) -> str:
    """Bytes for a person: `1.2 GB`, `47.1 MB`, `512 B` (decimal units, as `df -H`)."""
    if n_bytes is None:
        return "-"
    n = float(n_bytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns


def visible(text: str) -> str:
    """`text` with each control character written as its escape (`\\x1b`), tab and newline kept."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def console(*, live_display: bool = False, **kwargs: Any) -> Console:
    """A rich Console whose strings (printed, or table cells) pass through `visible`. Its output
    first clears a live progress display (`before_output`), unless it is that display's own."""
    from rich.console import Console  # start-up: only commands that print with rich load it

    class _Console(Console):
        def render_str(self, text: str, **kw: Any) -> Any:
            return super().render_str(visible(text), **kw)

        def print(self, *objects: Any, **kw: Any) -> None:
            if not live_display:
                before_output()
            super().print(*objects, **kw)

    return _Console(**kwargs)
