"""The real `pairctl` in this process: the one runner the `cli` fixture (tests/conftest.py) and
the fault harness (tests/faults/harness.py) share. It calls `orchestrator.cli.main` with typer's
stream isolation, so a test sees exactly what an operator's terminal would, and the exit code
`main` ends with; no interpreter start-up per command."""

from __future__ import annotations

from dataclasses import dataclass

from typer.testing import CliRunner

from orchestrator.cli import main


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(argv: list[str], *, input: str | None = None) -> CliResult:
    """`pairctl ARGV...` in-process: its exit code, stdout and stderr (decoded, never raising)."""
    with CliRunner().isolation(input=input) as streams:
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return CliResult(code, out.decode(errors="replace"), err.decode(errors="replace"))
