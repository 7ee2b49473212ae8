"""Shared base for config models: unknown keys and coercion are errors, models are frozen."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _allows_bool(annotation: Any) -> bool:
    """Does a field's type accept a bool as such (not only by pydantic's lax bool -> int)?"""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_allows_bool(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _allows_bool(typing.get_args(annotation)[0])
    return annotation not in (int, float, str) and origin is None and not isinstance(annotation, type)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's `port: true` is a bool; lax pydantic would make it 1. A bool only where a bool is meant."""
        if isinstance(value, bool) and info.field_name is not None:
            f = cls.model_fields.get(info.field_name)
            if f is not None and not _allows_bool(f.annotation):
                raise ValueError(f"expected {_type_name(f.annotation)}, found the boolean {str(value).lower()}")
        return value


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
