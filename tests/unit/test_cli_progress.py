"""Progress events (orchestrator/progress.py): a live display on a real pseudo-terminal that
redraws cleanly, one plain line per finished step through a pipe, silent with no sink."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
import threading

import pytest

from orchestrator import progress
from orchestrator.terminal import size
from tests.plugins.tty import SPINNER_GLYPHS, run_in_pty, screen

# What a qualification's arm running a deploy with acceptance reports, then the command's table.
_SCRIPT = textwrap.dedent(
    """
    import time
    from orchestrator import progress
    from orchestrator.cli.context import make_console

    out = make_console()
    with progress.to_stderr():
        progress.event("arm.start", "qualify arm 1/2 p0-baseline (ETA -) ...")
        for name in ("lease", "upload", "accept"):
            progress.event("step.start", f"step {name} on n,r ...")
            time.sleep(0.15)
            if name == "accept":
                for i, check in enumerate(("identity", "slots"), 1):
                    progress.event("check.start", f"check {check} ({i}/2) ...")
                    time.sleep(0.15)
                    progress.event("check.end", f"check {check}: pass")
            progress.event("step.end", f"step {name} ok")
        progress.event("upload", "upload x to r: 1.0 MB in 0.10 s (10.0 MB/s)")
        progress.event("step.start", "step release on n,r ...")
        out.print("TABLE deploy lab: passed")  # the command's own output while a spinner runs
        progress.event("step.end", "step release ok")
        progress.event("arm.end", "qualify arm p0-baseline: 3 samples")
        out.print("TABLE receipt abc")
    """
)


def test_live_display_on_a_pty_shows_each_line_once_and_no_stale_spinner():
    code, raw = run_in_pty([sys.executable, "-c", _SCRIPT], timeout_s=60)
    assert code == 0, raw[-2000:]
    shown = screen(raw)
    text = "\n".join(shown)
    assert not SPINNER_GLYPHS & set(text), text  # every spinner line was cleared
    for line in ("step lease ok", "step upload ok", "step accept ok", "check identity: pass", "check slots: pass",
                 "step release ok", "qualify arm p0-baseline: 3 samples", "TABLE deploy lab: passed",
                 "TABLE receipt abc"):  # fmt: skip
        assert sum(1 for s in shown if s.strip() == line) == 1, (line, text)
    assert not any("..." in s for s in shown), text  # no start line stays behind
    # the order a person reads: checks inside accept, the table after the step it interrupted
    assert shown.index("check slots: pass") < shown.index("step accept ok") < shown.index("TABLE receipt abc")


def test_live_display_keeps_the_arm_line_while_steps_run():
    """A qualification's arm/ETA line stays on screen above the step it runs (not overwritten)."""
    script = textwrap.dedent(
        """
        import time, sys
        from orchestrator import progress
        with progress.to_stderr():
            progress.event("arm.start", "qualify arm 2/4 p0-candidate (ETA 1m00s) ...")
            progress.event("step.start", "step upload on n,r ...")
            time.sleep(0.3)
            sys.stderr.flush()
            import os; os.write(2, b"\\x1b[s")  # a marker: the screen as it is mid-step
            time.sleep(0.3)
        """
    )
    code, raw = run_in_pty([sys.executable, "-c", script], timeout_s=60)
    assert code == 0, raw[-2000:]
    mid = screen(raw.split(b"\x1b[s")[0])
    assert any("qualify arm 2/4 p0-candidate (ETA 1m00s)" in s for s in mid), mid
    assert any("step upload on n,r" in s for s in mid), mid
    assert not SPINNER_GLYPHS & set("".join(screen(raw))), screen(raw)


def test_through_a_pipe_one_plain_line_per_finished_event():
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    err = r.stderr.splitlines()
    assert all(line.startswith("pairctl: [") for line in err), err
    # starts are not repeated as lines (the end line carries outcome and time); an arm's start (ETA) is
    assert [line.split("] ", 1)[1] for line in err] == [
        "qualify arm 1/2 p0-baseline (ETA -) ...",
        "step lease ok",
        "step upload ok",
        "check identity: pass",
        "check slots: pass",
        "step accept ok",
        "upload x to r: 1.0 MB in 0.10 s (10.0 MB/s)",
        "step release ok",
        "qualify arm p0-baseline: 3 samples",
    ]
    assert r.stdout.splitlines() == ["TABLE deploy lab: passed", "TABLE receipt abc"]
    assert "\x1b" not in r.stderr + r.stdout


def test_no_sink_no_output_and_no_error():
    progress.event("step.start", "nobody listens")  # library use: costs nothing, raises nothing


def test_plain_sink_from_any_thread_and_labelled_by_scope():
    buf = io.StringIO()
    with progress.reporting(progress.PlainSink(buf)):
        progress.event("step.start", "step upload on lab-native ...")  # quiet: the end line says it
        with progress.scope("lab3-a"):
            progress.event("step.end", "step upload ok")
        t = threading.Thread(target=progress.event, args=("upload", "upload x to lab-rpc: 1.0 MB in 0.10 s"))
        t.start()
        t.join()
    progress.event("step.end", "after the run: not reported")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("pairctl: [") and lines[0].endswith("lab3-a: step upload ok")
    assert "lab-rpc" in lines[1]


def test_a_broken_sink_never_fails_the_work():
    def broken(ev: progress.Event) -> None:
        raise OSError("terminal gone")

    with progress.reporting(broken):
        progress.event("check.start", "check identity")


def test_rate_eta_and_size():
    assert progress.rate(30_000_000, 1.0) == "30.0 MB in 1.00 s (30.0 MB/s)"
    assert progress.eta(0, 10, 5.0) == "ETA -"
    assert progress.eta(2, 10, 60.0) == "ETA 4m00s"
    assert progress.eta(9, 10, 9.0) == "ETA 1s"
    assert (size(512), size(47_100_000), size(1_234_567_890), size(None)) == ("512 B", "47.1 MB", "1.2 GB", "-")


@pytest.mark.unit_slow  # a `pairctl lab up` process writing the lab's models: ~9 s of CPU
def test_lab_up_through_a_pipe_says_what_it_did(tmp_path):
    """Item 4: `lab up` prints its phases to a CI log as they happen (the local inventory: no sshd)."""
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--home", str(tmp_path), "-i", "local", "lab", "up", "--no-source"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert re.search(r"^pairctl: \[\d\d:\d\d:\d\d\] lab up: models ready in .* \(\d+\.\d s\)$", r.stderr, re.M), (
        r.stderr
    )


def test_a_build_without_a_tty_prints_phases_and_compile_progress():
    """Item 4: the builder's reporter without a TTY (what `pairctl build` uses in CI): a line per
    phase and per 10% of the compile, with an ETA, through the same plain sink."""
    script = textwrap.dedent(
        """
        from orchestrator import log, progress
        from orchestrator.build.progress import make_reporter, parse_ninja_status
        log.configure(log_file=None)  # as the CLI does: info events go to the log file, not the terminal
        with progress.to_stderr():
            rep = make_reporter("cpu-lab", interactive=False)
            for phase in ("export", "configure"):
                rep.phase(phase)
            rep.phase("compile")
            for i in range(1, 201):
                rep.update(*parse_ninja_status(f"[{i}/200] Building CXX object x.o"))
            rep.phase("hash", 3)
            rep.close()
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    lines = [line.split("] ", 1)[1] for line in r.stderr.splitlines()]
    assert lines[:3] == ["build cpu-lab: export", "build cpu-lab: configure", "build cpu-lab: compile"], lines
    compile_lines = [ln for ln in lines if ln.startswith("build cpu-lab: compile [")]
    assert len(compile_lines) == 11 and compile_lines[-1].startswith("build cpu-lab: compile [200/200]"), lines
    assert all("ETA" in ln for ln in compile_lines)
    assert lines[-1] == "build cpu-lab: hash (3 items)"
    assert r.stdout == ""
