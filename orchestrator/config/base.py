"""Shared base for config models: unknown keys and coercion are errors, models are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)
