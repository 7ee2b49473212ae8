"""Fan-out over pairs: bounded, every pair gets its outcome, one failure stops nothing."""

from __future__ import annotations

import threading

import pytest

from orchestrator.errors import CheckFailed, ConfigError, LeaseHeldError
from orchestrator.ops.fleet import fan_out, select_pairs


class Inv:
    pairs = {"a": 1, "b": 2, "c": 3}

    def pair(self, name):
        if name not in self.pairs:
            raise ConfigError(f"no pair named {name!r}")
        return self.pairs[name]


def test_select_pairs():
    assert select_pairs(Inv(), None, True) == ["a", "b", "c"]
    assert select_pairs(Inv(), ["b", "a", "b"], False) == ["b", "a"]
    with pytest.raises(ConfigError):
        select_pairs(Inv(), ["a"], True)
    with pytest.raises(ConfigError):
        select_pairs(Inv(), [], False)
    with pytest.raises(ConfigError, match="'zz'"):
        select_pairs(Inv(), ["a", "zz"], False)


def test_bounded_and_failures_collected():
    running, peak, lock = 0, 0, threading.Lock()
    # Two calls must be inside fn at once to pass (each pair of calls meets here): proves they
    # overlap without relying on two sleeps overlapping; a serial fan-out breaks the barrier.
    together = threading.Barrier(2, timeout=10)

    def fn(p):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        together.wait()
        with lock:
            running -= 1
        if p == "b":
            raise CheckFailed("acceptance failed")
        return p.upper()

    r = fan_out(["a", "b", "c", "d"], fn, parallel=2)
    assert peak == 2
    assert [o.pair for o in r.outcomes] == ["a", "b", "c", "d"]
    assert [o.ok for o in r.outcomes] == [True, False, True, True]
    assert r.outcomes[2].value == "C" and r.exit_code() == 1 and not r.ok
    assert "acceptance failed" in r.failed()[0].error


def test_exit_code_of_mixed_failures_and_unexpected_errors():
    def fn(p):
        if p == "a":
            raise LeaseHeldError("held")
        raise ZeroDivisionError("boom")

    r = fan_out(["a", "b"], fn, parallel=2)
    assert [o.exit_code for o in r.outcomes] == [5, 1]
    assert r.exit_code() == 1
    assert "ZeroDivisionError" in r.outcomes[1].error
    assert fan_out(["a"], fn).exit_code() == 5


def test_ok_predicate():
    r = fan_out(["a", "b"], lambda p: {"passed": p == "a"}, parallel=2, ok=lambda v: v["passed"])
    assert [o.ok for o in r.outcomes] == [True, False]
