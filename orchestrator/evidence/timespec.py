"""`--since 2h` / `--since 3d` / `--since 2026-12-01T10:00Z`: a point in time, UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    now = now or datetime.now(UTC)
    try:
        seconds = parse_duration(text, what="--since")
    except ConfigError:
        pass
    else:
        try:
            return now - timedelta(seconds=seconds)
        except (OverflowError, ValueError):  # before year 1: everything is newer
            why = "reaches back before year 1; use a shorter duration or an ISO time (2026-12-01T10:00Z)"
            raise ValueError(f"--since {text!r} {why}") from None
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        why = "use a duration (30m, 2h, 3d, 1w) or an ISO time (2026-12-01T10:00Z)"
        raise ValueError(f"--since {text!r}: {why}") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)
