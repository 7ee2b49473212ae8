"""SIGTERM, SIGINT and SIGHUP during a command that holds leases: stop like a failure.

Python's default SIGTERM skips all cleanup, and a KeyboardInterrupt at an arbitrary bytecode could
cut a write of route.json or a link switch. Under `guard` a signal only records itself; the run stops
at its next bounded point (`check`) with `Interrupted`, an ordinary PairctlError, so rollback and
lease release run as for any failure. Cleanup is `shielded`; a second signal is only said on stderr
(SIGKILL remains, then `lease release PAIR --dead-run RUN`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from orchestrator.errors import Interrupted

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_received: list[str] = []  # signal names, in order of arrival
_local = threading.local()  # .shield: depth of `shielded()` in this thread


def received() -> str | None:
    """The first signal this process received while guarded (its name), if any."""
    return _received[0] if _received else None


def count() -> int:
    return len(_received)


def guard() -> None:
    """Install the recording handlers (main thread only; for the commands that take leases)."""
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def reset() -> None:
    """Forget received signals and restore the default handlers (in-process callers, tests)."""
    _received.clear()
    for sig in SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def _handler(signum: int, _frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    _received.append(name)
    if signum == signal.SIGHUP:
        _detach_terminal()  # the operator's session dropped: writes to it would fail the cleanup
    if len(_received) == 1:
        _say(
            f"pairctl: {name} received: stopping at the next safe point (the current step finishes or "
            "stops cleanly), then rolling back if activation began and releasing the leases"
        )
    else:
        _say(
            f"pairctl: {name} received again ({len(_received)} signals): still cleaning up (rollback and "
            "lease release, each step bounded by its own timeouts); not aborting it. SIGKILL would leave "
            "the leases held (`pairctl lease release PAIR --dead-run RUN` frees them)"
        )


def _say(text: str) -> None:
    try:
        os.write(2, (text + "\n").encode())  # not sys.stderr: a handler may interrupt a write to it
    except OSError:
        pass


def _detach_terminal() -> None:
    """Point stdout/stderr at /dev/null where they are a terminal that hung up."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def check(where: str) -> None:
    """Raise Interrupted at a bounded point if a signal arrived (never inside `shielded`)."""
    if _received and not getattr(_local, "shield", 0):
        raise Interrupted(
            f"interrupted by {_received[0]} {where}",
            signal_name=_received[0],
        )


@contextmanager
def shielded() -> Iterator[None]:
    """Cleanup that must run to its end (bounded by its own timeouts) even after a signal."""
    _local.shield = getattr(_local, "shield", 0) + 1
    try:
        yield
    finally:
        _local.shield -= 1
