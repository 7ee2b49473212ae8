"""The check tier's rule (tests/plugins/tiers.py): under `make check` a fixture that would start
the lab's sshd hosts, prepare the pinned source or build a package fails the test that asked,
saying what to do; in every other run it does nothing."""

from __future__ import annotations

import pytest

from tests.plugins.tiers import TIER_ENV, refuse_in_check


def test_the_check_tier_refuses_a_lab_and_says_what_to_do(monkeypatch):
    monkeypatch.setenv(TIER_ENV, "check")
    with pytest.raises(pytest.fail.Exception, match=r"the lab's sshd hosts in the check tier .*unit_slow"):
        refuse_in_check("the lab's sshd hosts")


def test_outside_the_check_tier_nothing_is_refused(monkeypatch):
    monkeypatch.delenv(TIER_ENV, raising=False)
    refuse_in_check("the lab's sshd hosts")
    monkeypatch.setenv(TIER_ENV, "test")
    refuse_in_check("a package build (baseline)")
