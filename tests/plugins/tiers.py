"""The check tier's rule (issue 45): `make check` starts no sshd, builds nothing, serves nothing.

`make check` sets PAIRCTL_TEST_TIER=check. The fixtures that would bring up lab hosts, prepare the
pinned llama.cpp source or build a package call `refuse_in_check(what)` first, so a test that
reaches one from the fast tier fails at once with what to do, instead of quietly making the tier
take minutes. Such a test belongs in tests/integration or tests/e2e, or carries `unit_slow`
(pyproject.toml's markers), which `make check` deselects and `make test` still runs.
"""

from __future__ import annotations

import os

import pytest

TIER_ENV = "PAIRCTL_TEST_TIER"


def in_check_tier() -> bool:
    return os.environ.get(TIER_ENV) == "check"


def refuse_in_check(what: str) -> None:
    if in_check_tier():
        pytest.fail(
            f"{what} in the check tier (make check: no sshd, no builds, no servers): "
            "mark the test `unit_slow` or move it to tests/integration or tests/e2e",
            pytrace=False,
        )
