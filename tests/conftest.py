"""Shared test set-up: one pairctl home per test session, and the real CLI in-process.

Area fixtures live in tests/plugins/ (lab hosts, built packages, deployed pairs), so the
session builds and starts each real component once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.plugins.cli import CliResult, run_cli

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = [
    p
    for p in (
        "tests.plugins.workers",  # first: lab.py and packages.py import it
        "tests.plugins.bytecode",
        "tests.plugins.durations",
        "tests.plugins.history",
        "tests.plugins.lab",
        "tests.plugins.packages",
        "tests.plugins.pairs",
        "tests.plugins.qualify",
        "tests.plugins.wheel",
    )
    if (REPO / (p.replace(".", "/") + ".py")).exists()
]


def _test_home() -> Path:
    env = os.environ.get("PAIRCTL_TEST_HOME")
    return Path(env).resolve() if env else REPO / ".state" / "test"


@pytest.fixture(scope="session")
def pairctl_home() -> Path:
    """The pairctl state directory shared by every test in the session (lab, store, caches)."""
    home = _test_home()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PAIRCTL_HOME"] = str(home)
    return home


@pytest.fixture
def cli(pairctl_home: Path):
    """Run the real `pairctl` in-process: cli("deploy", "--pair", "lab", ...) -> CliResult."""

    def run(*args: str, home: Path | None = None, inventory: str | None = None, input: str | None = None) -> CliResult:
        argv = ["--home", str(home or pairctl_home)]
        if inventory:
            argv += ["--inventory", inventory]
        return run_cli(argv + list(args), input=input)

    return run


@pytest.fixture(autouse=True)
def _config_env_restored():
    """No test's config directory outlives it: `--config` and `config check` export
    PAIRCTL_CONFIG in this process, which a later test's profile lookup would read."""
    saved = os.environ.get("PAIRCTL_CONFIG")
    yield
    if saved is None:
        os.environ.pop("PAIRCTL_CONFIG", None)
    else:
        os.environ["PAIRCTL_CONFIG"] = saved
