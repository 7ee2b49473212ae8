"""Issue 28: answer fixtures whose content is checked on the real model (a JSON reply must parse
and carry its keys), and fields added to fixtures keep every older fixture's sha256."""

from __future__ import annotations

import pytest

from orchestrator.checks.answer_fixtures import json_object_has
from orchestrator.checks.fixtures import load_fixture_set


@pytest.mark.parametrize(
    "answer, ok",
    [
        ('{"name": "Ada", "age": 31}', True),
        ('Here you go:\n```json\n{\n  "name": "Ada",\n  "age": 31\n}\n```', True),
        ('Sure! {"name": "Ada", "age": 31} Hope this helps.', True),
        ('{"name": "Ada"}', False),  # a key missing
        ('{"name": "Ada", "age": 31', False),  # cut off: does not parse
        ("Ada is 31 years old.", False),
        ('["name", "age"]', False),  # not an object
    ],
)
def test_json_answers_must_parse_and_carry_their_keys(answer: str, ok: bool) -> None:
    assert json_object_has(answer, ["name", "age"]) is ok


def test_the_older_fixture_sets_keep_their_hashes() -> None:
    """`chat` and `expect.json_keys` count in a fixture's sha256 only when set: the lab set loads
    (its hashes are checked on load) and the real model's set uses both."""
    lab = load_fixture_set("lab")
    assert all("chat" not in f.content() for f in lab.fixtures)
    real = load_fixture_set("smollm2")
    assert {f.id for f in real.fixtures if f.chat} == {"capital-france", "small-sum", "json-person"}
    assert next(f for f in real.fixtures if f.id == "json-person").expect.json_keys == ["name", "age"]
