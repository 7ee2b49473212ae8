"""Turn what commands hand the journal (paths, models, numpy numbers, `Secret`s) into plain JSON.

Done once, when the journal line is written; the parsed line is what the receipt keeps, so a
caller mutating its dict afterwards cannot change the evidence.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from datetime import date, datetime
from pathlib import PurePath
from typing import Any

from orchestrator.evidence.masking import MASK, is_secret_object, mask_data, may_hold_secret


def _default(obj: Any) -> Any:
    if is_secret_object(obj):
        return MASK
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, date):
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
    return text


def plain(obj: Any) -> Any:
    """A masked, independent, plain-JSON copy of `obj`."""
    return json.loads(dumps(obj))
