"""`--since 2h` / `--since 3d` / `--since 2026-12-01T10:00Z`: a point in time, UTC."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_REL = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$", re.I)
_UNIT = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    now = now or datetime.now(timezone.utc)
    m = _REL.match(text.strip())
    if m:
        return now - timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2).lower()])
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: use a duration (30m, 2h, 3d, 1w) or an ISO time (2026-12-01T10:00Z)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
