"""Text for a person's terminal: control characters from hosts and evidence are shown, not obeyed.

Lease owners and purposes, route record fields, server answers and receipts are written by
others; an ESC in one of them (`\\x1b[2J`, an OSC title or clipboard sequence) would act on the
operator's terminal. Every console pairctl prints through renders its strings with `visible`;
pairctl's own styling (rich's tables) is added after, so it still works.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# C0 controls except tab and newline, DEL, and C1 controls (0x9b is a one-byte CSI).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with each control character written as its escape (`\\x1b`), tab and newline kept."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def console(**kwargs: Any) -> Console:
    """A rich Console whose strings (printed, or table cells) pass through `visible`."""
    from rich.console import Console  # start-up: only commands that print with rich load it

    class _Console(Console):
        def render_str(self, text: str, **kw: Any) -> Any:
            return super().render_str(visible(text), **kw)

    return _Console(**kwargs)
