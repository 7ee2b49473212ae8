"""Progress of long work, as events: deploy steps, uploads, acceptance checks, qualification arms.

Callers use `event(kind, message, **fields)` and know nothing about terminals; the CLI installs a
sink (`reporting`): rich on a TTY, plain lines otherwise, always on stderr (stdout keeps `--json`).
With no sink an event costs nothing. The sink is process-wide because work reports from worker
threads that a context variable would not reach.
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
    kind: str  # step.start, step.end, upload, check.start, check.end, arm.start, arm.end, sample, qualify.stop
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


Sink = Callable[[Event], None]

# Activities that stay open until their `.end`, outer to inner: a fleet pair's arm holds steps,
# a step (accept) holds checks. A start closes what was open at its level and below.
LEVELS = ("arm", "step", "check")
# Without a TTY these starts print nothing: their end line says the same with the outcome and time.
_QUIET_STARTS = ("step.start", "check.start")

_lock = threading.Lock()
_sinks: list[Sink] = []
_scope = threading.local()


def event(kind: str, message: str, **fields: Any) -> None:
    """Report one event to the run's sink (if any). Never raises into the work."""
    with _lock:
        sinks = list(_sinks)
    if not sinks:
        return
    label = getattr(_scope, "label", None)
    if label and "label" not in fields:
        fields["label"] = label
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


@contextmanager
def scope(label: str) -> Iterator[None]:
    """Events of this thread carry `label` (a fleet's pair), so parallel pairs' lines are told apart."""
    before = getattr(_scope, "label", None)
    _scope.label = label
    try:
        yield
    finally:
        _scope.label = before


def _labelled(ev: Event) -> str:
    label = ev.fields.get("label")
    return f"{label}: {ev.message}" if label else ev.message


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
    """Without a TTY: one line per finished step, check, arm, upload and build phase, with the
    time; an arm's start (with its ETA) and a build phase also get lines, as long waits."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream

    def __call__(self, ev: Event) -> None:
        if ev.kind in _QUIET_STARTS:
            return
        out = self.stream or sys.stderr
        out.write(f"pairctl: [{time.strftime('%H:%M:%S')}] {visible(_labelled(ev))}\n")
        out.flush()


class LiveSink:
    """On a TTY: a live area with one spinner line per open activity, every finished event printed
    once above it; cleared whenever nothing is open, so a command's own table never lands on it."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        # rich: only a TTY run draws
        self.console = terminal.console(live_display=True, file=stream, stderr=stream is None, highlight=False)
        self.live: Any = None
        self.open: dict[tuple[str, str], str] = {}  # (label, level) -> text, in opening order
        self._lock = threading.RLock()
        terminal.on_output(self.clear)

    def __call__(self, ev: Event) -> None:
        label = str(ev.fields.get("label") or "")
        level, _, edge = ev.kind.partition(".")
        with self._lock:
            if level in LEVELS and edge in ("start", "end"):
                for key in [k for k in self.open if k[0] == label and LEVELS.index(k[1]) >= LEVELS.index(level)]:
                    del self.open[key]
                if edge == "start":
                    self.open[(label, level)] = _labelled(ev)
            self._redraw()  # first: a line printed now must not bring back a finished spinner
            if not (level in LEVELS and edge == "start"):
                self._print(_labelled(ev), dim=level not in LEVELS)

    def _print(self, text: str, *, dim: bool) -> None:
        from rich.text import Text

        line = Text(visible(text), style="dim" if dim else "")
        if self.live is not None:
            self.live.console.print(line)
        else:
            self.console.print(line)

    def _redraw(self) -> None:
        if not self.open:
            self._stop()
            return
        from rich.console import Group
        from rich.spinner import Spinner

        view = Group(*(Spinner("dots", text=visible(t), style="green") for t in self.open.values()))
        if self.live is None:
            from rich.live import Live

            self.live = Live(view, console=self.console, transient=True, refresh_per_second=8,
                             redirect_stdout=False, redirect_stderr=False)  # fmt: skip
            self.live.start()
        else:
            self.live.update(view, refresh=True)

    def _stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def clear(self) -> None:
        """Someone else writes to the terminal: take the spinners away (the next event redraws)."""
        with self._lock:
            self._stop()

    def close(self) -> None:
        terminal.on_output(None)
        with self._lock:
            self.open.clear()
            self._stop()


@contextmanager
def to_stderr() -> Iterator[Sink]:
    """The CLI's sink for one run: rich on a TTY, plain lines otherwise."""
    if sys.stderr.isatty():
        sink = LiveSink()
        try:
            with reporting(sink):
                yield sink
        finally:
            sink.close()
    else:
        with reporting(PlainSink()) as s:
            yield s
