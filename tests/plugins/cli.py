"""The real `pairctl` in this process: the one runner the `cli` fixture (tests/conftest.py) and
the fault harness (tests/faults/harness.py) share. It calls `orchestrator.cli.main` with typer's
stream isolation, so a test sees exactly what an operator's terminal would, and the exit code
`main` ends with; no interpreter start-up per command."""

from __future__ import annotations

import os
from dataclasses import dataclass

from typer.testing import CliRunner

from orchestrator.cli import main
from orchestrator.config.search import CONFIG_ENV


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(argv: list[str], *, input: str | None = None) -> CliResult:
    """`pairctl ARGV...` in-process: its exit code, stdout and stderr (decoded, never raising).

    PAIRCTL_CONFIG is put back afterwards, as a real process's exit would: `--config`
    exports PAIRCTL_CONFIG for child processes, and one test's config directory must not become
    every later test's (it once gave a unit test an e2e test's impossible speed floor)."""
    saved = os.environ.get(CONFIG_ENV)
    try:
        return _run(argv, input=input)
    finally:
        if saved is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = saved


def _run(argv: list[str], *, input: str | None) -> CliResult:
    with CliRunner().isolation(input=input) as streams:
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return CliResult(code, out.decode(errors="replace"), err.decode(errors="replace"))
