"""Shared test set-up: one pairctl home per test session, and the real CLI in-process.

Area fixtures live in tests/plugins/ (lab hosts, built packages, deployed pairs), so the
session builds and starts each real component once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = [
    p
    for p in ("tests.plugins.lab", "tests.plugins.packages", "tests.plugins.pairs", "tests.plugins.wheel")
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


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def cli(pairctl_home: Path):
    """Run the real `pairctl` in-process: cli("deploy", "--pair", "lab", ...) -> CliResult."""
    from orchestrator.cli import main

    def run(*args: str, home: Path | None = None, inventory: str | None = None, input: str | None = None) -> CliResult:
        argv = ["--home", str(home or pairctl_home)]
        if inventory:
            argv += ["--inventory", inventory]
        argv += list(args)
        runner = CliRunner()
        with runner.isolation(input=input) as streams:
            try:
                main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            out, err = streams[0].getvalue(), streams[1].getvalue()
        return CliResult(code, out.decode(errors="replace"), err.decode(errors="replace"))

    return run
