"""Progress of long work, as events: deploy steps, uploads, acceptance checks, qualification arms.

The engine, the checks and qualification call one function, `event(kind, message, **fields)`,
and know nothing about terminals. The CLI installs a sink for the run (`reporting(...)`): on a
TTY a rich display on stderr, otherwise one plain line per event on stderr (no -v needed), so a
log or CI shows the same story. With no sink installed (library use, unit tests) an event costs
nothing. stdout is never touched: `--json` keeps its one document.

The sink is process-wide, like logging's handlers, because the work reports from worker threads
(fan-out over a pair's two hosts) that a context variable would not reach.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from orchestrator import terminal
from orchestrator.terminal import visible


@dataclass(frozen=True)
class Event:
    kind: str  # step.start, step.end, upload, check.start, check.end, arm.start, arm.end, sample
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


Sink = Callable[[Event], None]

_lock = threading.Lock()
_sinks: list[Sink] = []


def event(kind: str, message: str, **fields: Any) -> None:
    """Report one event to the run's sink (if any). Never raises into the work."""
    with _lock:
        sinks = list(_sinks)
    for sink in sinks:
        try:
            sink(Event(kind, message, fields))
        except Exception:  # a broken terminal must not fail a deploy
            pass


@contextmanager
def reporting(sink: Sink) -> Iterator[Sink]:
    with _lock:
        _sinks.append(sink)
    try:
        yield sink
    finally:
        with _lock:
            _sinks.remove(sink)


def rate(n_bytes: int, seconds: float) -> str:
    """`12.3 MB in 0.41 s (30.0 MB/s)`."""
    mb = n_bytes / 1e6
    return f"{mb:.1f} MB in {seconds:.2f} s ({mb / seconds if seconds > 0 else 0:.1f} MB/s)"


def eta(done: int, total: int, elapsed_s: float) -> str:
    """Time left at the pace so far: `ETA 3m20s` (unknown before the first item)."""
    if done <= 0 or total <= done:
        return "ETA -" if done <= 0 else "ETA 0s"
    left = int(elapsed_s / done * (total - done))
    return "ETA " + (f"{left // 60}m{left % 60:02d}s" if left >= 60 else f"{left}s")


class PlainSink:
    """One line per event: `pairctl: [12:03:04] deploy: upload ...` (logs, CI, pipes)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream

    def __call__(self, ev: Event) -> None:
        out = self.stream or sys.stderr
        out.write(f"pairctl: [{time.strftime('%H:%M:%S')}] {visible(ev.message)}\n")
        out.flush()


class RichSink:
    """On a TTY: finished events as dim lines, the running one as a spinner line."""

    def __init__(self) -> None:
        self.console = terminal.console(stderr=True, highlight=False)  # imports rich: only a TTY run draws
        self.status: Any = None

    def __call__(self, ev: Event) -> None:
        if ev.kind.endswith(".start"):
            if self.status is None:
                self.status = self.console.status(ev.message)
                self.status.start()
            else:
                self.status.update(ev.message)
            return
        self.console.print(f"[dim]{ev.message}[/dim]", highlight=False)

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


@contextmanager
def to_stderr() -> Iterator[Sink]:
    """The CLI's sink for one run: rich on a TTY, plain lines otherwise."""
    if sys.stderr.isatty():
        sink = RichSink()
        try:
            with reporting(sink):
                yield sink
        finally:
            sink.close()
    else:
        with reporting(PlainSink()) as s:
            yield s
