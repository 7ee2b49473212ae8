"""Reference-answer fixtures: prompts whose answers are recorded once from the reference pair and
compared as logprobs (`checks.reference_logprobs`). A set is identified by the sha256 of its
content, which is part of the reference-answer key: an edited set needs new reference answers.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from orchestrator.checks.fixtures import unique_ids
from orchestrator.config.base import StrictModel
from orchestrator.config.loader import load_model
from orchestrator.errors import ConfigError
from orchestrator.hashing import sha256_json
from orchestrator.paths import MANIFESTS

Endpoint = Literal["completion", "v1_completions", "chat"]
DEFAULT_SET = "oracle-lab"


class OracleFixture(StrictModel):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    endpoint: Endpoint = "completion"
    prompt: str | None = Field(default=None, min_length=1, description="text prompt (chat: the user message)")
    near_full: bool = Field(default=False, description="seeded token ids filling the slot instead of a text prompt")
    seed: int = 0
    n_predict: int = Field(default=24, ge=1, le=4096)

    @model_validator(mode="after")
    def _one(self) -> OracleFixture:
        if (self.prompt is None) == (not self.near_full):
            raise ValueError(f"fixture {self.id}: give exactly one of prompt or near_full: true")
        if self.near_full and self.endpoint == "chat":
            raise ValueError(f"fixture {self.id}: a near-full token prompt cannot go through chat")
        return self


class OracleFixtureSet(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    near_full_margin: int = Field(default=8, ge=1, description="tokens left free in the slot by near-full fixtures")
    fixtures: Annotated[list[OracleFixture], AfterValidator(unique_ids)] = Field(min_length=1)

    def sha256(self) -> str:
        return sha256_json(self.model_dump(mode="json"))


def seeded_text(seed: int, n_chars: int) -> str:
    """Printable ASCII words drawn from `seed`: tokenized by the server, then cut to a token count."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?()"
    words = []
    total = 0
    while total < n_chars:
        w = "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        words.append(w)
        total += len(w) + 1
    return " ".join(words)


def load_oracle_set(name_or_path: str) -> OracleFixtureSet:
    p = Path(name_or_path)
    if not p.suffix:
        p = MANIFESTS / "fixtures" / "reference" / f"{name_or_path}.yaml"
    if not p.exists():
        raise ConfigError(
            f"{p}: reference fixture set not found",
            hint=f"sets live in {MANIFESTS / 'fixtures' / 'reference'}; the default is {DEFAULT_SET}",
        )
    return load_model(OracleFixtureSet, p)
