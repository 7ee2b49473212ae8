"""Answer fixtures: bounded prompts with expected answers, frozen by sha256.

A fixture file (`manifests/fixtures/*.yaml`, kind `fixtures`) lists prompts with either a
regex the answer must match or `same_as_baseline` (the answer must equal the baseline pair's).
Each fixture carries the sha256 of its own canonical content, so an edited fixture cannot be
compared against results of the old one: the loader refuses a stale hash, and results are
matched to the baseline by fixture sha256, not by name.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import AfterValidator, Field, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.loader import load_model
from orchestrator.errors import ConfigError
from orchestrator.hashing import sha256_json


class Expect(StrictModel):
    regex: str | None = Field(default=None, description="the answer must match (re.search, DOTALL)")
    same_as_baseline: bool = Field(default=False, description="the answer must equal the baseline pair's answer")
    json_keys: list[str] | None = Field(
        default=None,
        description="the answer must hold a JSON object (fenced or bare) that parses and has these keys",
    )

    @model_validator(mode="after")
    def _one(self) -> Expect:
        given = sum((self.regex is not None, self.same_as_baseline, self.json_keys is not None))
        if given != 1:
            raise ValueError("give exactly one of regex, json_keys or same_as_baseline: true")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from None
        return self


class Fixture(StrictModel):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    family: str = "general"
    prompt: str = Field(min_length=1)
    n_predict: int = Field(default=64, ge=1, le=65536)
    chat: bool = Field(
        default=False, description="the prompt is a user message, sent through the model's chat template"
    )
    expect: Expect
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of canonical JSON of the other fields")

    def content(self) -> dict[str, Any]:
        """What the sha256 covers. Fields added later count only when set, so every fixture
        written before them keeps its hash."""
        d = self.model_dump(exclude={"sha256"}, mode="json")
        if not d.get("chat"):
            d.pop("chat", None)
        if d["expect"].get("json_keys") is None:
            d["expect"].pop("json_keys", None)
        return d

    def computed_sha256(self) -> str:
        return fixture_sha256(self.content())

    @model_validator(mode="after")
    def _hash(self) -> Fixture:
        want = self.computed_sha256()
        if self.sha256 != want:
            raise ValueError(
                f"fixture {self.id}: sha256 {self.sha256[:12]}… does not match its content ({want}); "
                "a changed fixture is a new fixture: update its sha256 on purpose"
            )
        return self


def fixture_sha256(content: dict[str, Any]) -> str:
    return sha256_json(content)


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_F = TypeVar("_F", bound=_HasId)


def unique_ids(fixtures: list[_F]) -> list[_F]:
    """A fixture set names each fixture once (answer and reference sets alike)."""
    ids = [f.id for f in fixtures]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"duplicate fixture ids: {dup}")
    return fixtures


class FixtureSet(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    fixtures: Annotated[list[Fixture], AfterValidator(unique_ids)] = Field(min_length=1)

    def sha256(self) -> str:
        return sha256_json([f.sha256 for f in self.fixtures])


def load_fixture_set(name_or_path: str) -> FixtureSet:
    p = search.resolve_ref("fixtures", name_or_path)
    if not p.exists():
        raise ConfigError(f"{p}: fixture set not found")
    return load_model(FixtureSet, p)
