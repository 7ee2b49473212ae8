"""Durations as operators write them (`90s`, `30m`, `5min`, `2h`, `1h30m`, `1d`, `1w`): one parser
for lease TTLs, schedule intervals and `--since`, so the same text means the same everywhere."""

from __future__ import annotations

import math
import re

from orchestrator.errors import ConfigError

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(min|[smhdw]?)", re.I)
_UNIT_S = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
EXAMPLES = "e.g. 90s, 30m, 2h, 1h30m, 1d"


def parse_duration(text: str, *, what: str = "duration") -> float:
    """`90`, `90s`, `30m`, `5min`, `2h`, `1h30m`, `1d`, `1w` -> seconds. Zero, negative, junk or
    a number too large for a float (400 digits read as infinity) is a ConfigError naming `what`."""
    s = str(text).strip().replace(" ", "")
    if not s:
        raise ConfigError(f"empty {what}: use {EXAMPLES}")
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos or not m.group(0):
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2).lower()]
        pos = m.end()
    if pos != len(s) or not 0 < total < math.inf:
        raise ConfigError(f"bad {what} {text!r}: use {EXAMPLES}")
    return total
