"""Issue 21 item 5: every acceptance request is bounded by the work it asks for, and the suite
stops after a required check found the server not answering (pure: no server)."""

from __future__ import annotations

import pytest

from orchestrator.checks import budget, suite
from orchestrator.checks.base import CheckContext, CheckResult
from orchestrator.config.profiles import load_profile
from orchestrator.server.client import ServerUnreachable


def test_request_seconds_is_work_over_floor_speed_plus_margin() -> None:
    assert budget.request_seconds(3000, 200, lanes=1, floor_pp=300, floor_tg=20, margin_s=30) == 10 + 10 + 30
    assert budget.request_seconds(3000, 200, lanes=2, floor_pp=300, floor_tg=20, margin_s=30) == 2 * 20 + 30
    with pytest.raises(ValueError):
        budget.request_seconds(10, 10, lanes=0)
    with pytest.raises(ValueError):
        budget.request_seconds(10, 10, floor_tg=0)


def test_lab_profile_requests_are_bounded_in_minutes_not_an_hour() -> None:
    """Today every completion waits 1800 s and every other request 600 s: a SIGSTOPped server
    hung the deploy for an hour. The lab profile's largest request (two near-full lanes at once)
    now has about a minute; the production profile's scales with its 266240-token context."""
    lab = budget.for_profile(load_profile("lab"))
    assert 30 < lab.completion_s < 180, lab
    assert lab.control_s <= 30
    assert "lane(s)" in lab.why and "tok/s" in lab.why
    prod = budget.for_profile(load_profile("production"))
    assert prod.completion_s > 10 * lab.completion_s  # derived from the profile, not a constant
    per_slot = load_profile("production").per_slot_ctx()
    gen = round(per_slot * 0.125)
    assert prod.completion_s == budget.request_seconds(per_slot - gen, gen, lanes=2)


@pytest.mark.parametrize(
    "message, transport",
    [
        ("ServerUnreachable: POST http://127.0.0.2:8080/completion: timed out (ReadTimeout)", True),
        ("ServerUnreachable: GET http://x/slots: connection refused", True),
        ("lane 0 generated 3 tokens, expected 256", False),
    ],
)
def test_transport_failures_are_told_from_wrong_answers(message: str, transport: bool) -> None:
    assert budget.is_transport_failure(message) is transport


class _IdleServer:
    """Only what the suite itself asks between checks (/slots: all idle)."""

    retries: list[str] = []

    def slots(self, timeout: float = 10):
        return []


def test_suite_stops_after_a_required_check_finds_the_server_not_answering() -> None:
    ran: list[str] = []

    def hung(ctx: CheckContext) -> CheckResult:
        ran.append("two_lane")
        raise ServerUnreachable("POST http://127.0.0.2:8080/completion: timed out (ReadTimeout)")

    def later(name: str):
        def fn(ctx: CheckContext) -> CheckResult:
            ran.append(name)
            return CheckResult(name=name, verdict="passed")

        return fn

    names = list(suite.CHECKS)[1:4]  # the first three model checks after identity
    ctx = CheckContext(client=_IdleServer(), profile=load_profile("lab"), pair="lab")  # type: ignore[arg-type]
    res = suite.run_suite(
        ctx, only=names, overrides={names[0]: hung, names[1]: later(names[1]), names[2]: later(names[2])}
    )
    assert ran == ["two_lane"], ran  # nothing waited on the dead server after the first timeout
    assert not res.passed
    by = {r.name: r for r in res.results}
    assert by[names[0]].verdict == "error"
    assert all(by[n].verdict == "skipped" and "not answering" in by[n].message for n in names[1:])
