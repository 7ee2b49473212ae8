"""tests/plugins/pairs.py `three_judgements` (issue 45): which runs judge each check three times.

The e2e tests that use it (test_accept's baseline deploy, test_real_model's three accepts) take
whichever path their home gives them: a deploy that judged every check (answers already recorded)
or one that recorded answers for some (a fresh home, as CI's). Both paths are pinned here, with the
`accept` runs they ask for, so the one a lab run did not take is still shown to judge each check
three times.
"""

from __future__ import annotations

import pytest

from tests.plugins.pairs import three_judgements

SUITE = ("identity", "two_lane_near_full", "answer_fixtures", "reference_logprobs")


def _accepts(verdicts: dict[str, str]):
    asked: list[tuple[str, ...]] = []

    def accept(*args: str) -> dict[str, str]:
        asked.append(args)
        names = args[1::2] if args else SUITE  # --checks NAME ...: a limited run reports those
        return {n: verdicts[n] for n in names}

    return accept, asked


def test_a_deploy_that_judged_every_check_is_the_first_of_three():
    accept, asked = _accepts(dict.fromkeys(SUITE, "passed"))
    judged = three_judgements(dict.fromkeys(SUITE, "passed"), accept)
    assert asked == [(), ()]  # two whole-suite accepts, nothing more
    assert judged == {n: ["passed"] * 3 for n in SUITE}


def test_checks_the_deploy_only_recorded_get_a_third_accept_limited_to_them():
    deployed = {**dict.fromkeys(SUITE, "passed"), "answer_fixtures": "skipped", "reference_logprobs": "skipped"}
    accept, asked = _accepts(dict.fromkeys(SUITE, "passed"))
    judged = three_judgements(deployed, accept)
    assert asked == [(), (), ("--checks", "answer_fixtures", "--checks", "reference_logprobs")]
    assert judged == {n: ["passed"] * 3 for n in SUITE}  # no `skipped` left: each judged three times


def test_a_verdict_that_differs_between_runs_shows_in_the_three():
    accept, _ = _accepts({**dict.fromkeys(SUITE, "passed"), "two_lane_near_full": "failed"})
    judged = three_judgements(dict.fromkeys(SUITE, "passed"), accept)
    assert judged["two_lane_near_full"] == ["passed", "failed", "failed"]


def test_a_deploy_whose_checks_are_not_the_suite_is_refused():
    accept, _ = _accepts(dict.fromkeys(SUITE, "passed"))
    with pytest.raises(AssertionError):
        three_judgements({"identity": "passed"}, accept)
