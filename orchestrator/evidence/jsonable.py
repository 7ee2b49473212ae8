"""Turn what commands hand the journal (paths, models, numpy numbers, `Secret`s) into plain JSON,
once, when the line is written: a caller mutating its dict afterwards cannot change the evidence."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from datetime import date
from pathlib import PurePath
from typing import Any

from orchestrator.evidence.masking import MASK, is_secret_object, mask_data, may_hold_secret


def _default(obj: Any) -> Any:
    if is_secret_object(obj):
        return MASK
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, date):  # datetime too
        return obj.isoformat()
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable evidence: {obj!r:.80}")


def dumps(obj: Any) -> str:
    """Compact JSON text (not canonical: key order as given) with secrets masked."""
    text = json.dumps(obj, default=_default, separators=(",", ":"), ensure_ascii=False)
    if may_hold_secret(text):
        text = json.dumps(mask_data(json.loads(text)), separators=(",", ":"), ensure_ascii=False)
    if has_lone_surrogate(text):
        text = json.dumps(escape_surrogates(json.loads(text)), separators=(",", ":"), ensure_ascii=False)
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Text that cannot be encoded as UTF-8: a host's non-UTF-8 argv decoded with
    surrogateescape, or a server's JSON answer holding "\\ud800"."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def escape_surrogates(obj: Any) -> Any:
    """A copy of plain JSON `obj` whose strings encode as UTF-8: a lone surrogate becomes the text
    `\\udcff`, never an encoding error mid-run nor a receipt `verify` cannot canonicalise."""
    if isinstance(obj, str):
        return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, dict):
        return {escape_surrogates(k): escape_surrogates(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [escape_surrogates(v) for v in obj]
    return obj


def plain(obj: Any) -> Any:
    """A masked, independent, plain-JSON copy of `obj`."""
    return json.loads(dumps(obj))
