"""Progress for the long build steps: a rich bar on a TTY, log lines everywhere else."""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Protocol

from orchestrator import progress
from orchestrator.log import get_logger

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")


def parse_ninja_status(line: str) -> tuple[int, int] | None:
    """`[12/215] Building CXX object ...` → (12, 215); anything else → None."""
    m = _NINJA.match(line)
    return (int(m.group(1)), int(m.group(2))) if m else None


class Reporter(Protocol):
    def phase(self, name: str, total: int | None = None) -> None: ...
    def update(self, completed: int, total: int | None = None) -> None: ...
    def close(self) -> None: ...


class LogReporter:
    """Non-TTY progress (CI logs, pipes): one line on stderr (a progress event) and one log event
    per phase and per 10% of a counted phase, so a 17-minute cold compile shows it is moving."""

    def __init__(self, target: str, **bind: Any) -> None:
        self.log = get_logger(target=target, **bind)
        self.target = target
        self.name = ""
        self._last_decile = -1
        self._t0 = time.monotonic()

    def phase(self, name: str, total: int | None = None) -> None:
        self.name, self._last_decile, self._t0 = name, -1, time.monotonic()
        self.log.info("build phase", phase=name, total=total)
        progress.event("build.phase", f"build {self.target}: {name}" + (f" ({total} items)" if total else ""))

    def update(self, completed: int, total: int | None = None) -> None:
        if total:
            decile = completed * 10 // total
            if decile != self._last_decile:
                self._last_decile = decile
                self.log.info("build progress", phase=self.name, completed=completed, total=total)
                elapsed = time.monotonic() - self._t0
                progress.event(
                    "build.progress",
                    f"build {self.target}: {self.name} [{completed}/{total}] {progress.eta(completed, total, elapsed)}",
                )

    def close(self) -> None:
        pass


class RichReporter:
    """TTY progress: one bar per phase (configure, compile [n/N], hash)."""

    def __init__(self, label: str) -> None:
        # rich.progress: start-up time; only an interactive build draws a progress bar
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.label = label
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=False,
        )  # fmt: skip
        self.progress.start()
        self.task: Any = None

    def phase(self, name: str, total: int | None = None) -> None:
        if self.task is not None:
            t = self.progress.tasks[-1]
            self.progress.update(self.task, completed=t.total if t.total else 1, total=t.total or 1)
        self.task = self.progress.add_task(f"{self.label} {name}", total=total)

    def update(self, completed: int, total: int | None = None) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=completed, total=total)

    def close(self) -> None:
        self.phase("done", 1)
        self.progress.update(self.task, completed=1)
        self.progress.stop()


def make_reporter(label: str, *, interactive: bool | None = None) -> Reporter:
    if interactive is None:
        interactive = sys.stderr.isatty()
    return RichReporter(label) if interactive else LogReporter(label)
