"""Progress events (orchestrator/progress.py): plain lines without a TTY, silent with no sink."""

from __future__ import annotations

import io
import threading

from orchestrator import progress


def test_no_sink_no_output_and_no_error():
    progress.event("step.start", "nobody listens")  # library use: costs nothing, raises nothing


def test_plain_sink_writes_one_line_per_event_from_any_thread():
    buf = io.StringIO()
    with progress.reporting(progress.PlainSink(buf)):
        progress.event("step.start", "step upload on lab-native ...")
        t = threading.Thread(target=progress.event, args=("upload", "upload x to lab-rpc: 1.0 MB in 0.10 s"))
        t.start()
        t.join()
    progress.event("step.end", "after the run: not reported")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("pairctl: [") and lines[0].endswith("step upload on lab-native ...")
    assert "lab-rpc" in lines[1]


def test_a_broken_sink_never_fails_the_work():
    def broken(ev: progress.Event) -> None:
        raise OSError("terminal gone")

    with progress.reporting(broken):
        progress.event("check.start", "check identity")


def test_rate_and_eta():
    assert progress.rate(30_000_000, 1.0) == "30.0 MB in 1.00 s (30.0 MB/s)"
    assert progress.eta(0, 10, 5.0) == "ETA -"
    assert progress.eta(2, 10, 60.0) == "ETA 4m00s"
    assert progress.eta(9, 10, 9.0) == "ETA 1s"
