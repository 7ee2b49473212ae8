"""Issue 49 item 7 on a REAL full disk: the operator's home on a tmpfs with no room left.

The outcome of a command never depended on its log, but every log line a full disk refused was
a `--- Logging error ---` traceback ending in `OSError: [Errno 28]`; now one warning line says
which file could not be written, once, and the exit code is the command's own."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


@pytest.fixture
def full_home(tmp_path: Path):
    mnt = tmp_path / "home"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "pairctl-full-home", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path) -> None:
    with open(mnt / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _pairctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_a_full_operator_disk_is_one_warning_line_never_a_logging_traceback(full_home: Path) -> None:
    (full_home / "logs").mkdir()
    _fill(full_home)
    r = _pairctl("--home", str(full_home), "-v", "bisect", "--pair", "lab", "--reset")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Logging error" not in r.stderr and "Errno 28" not in r.stderr
    warnings = [line for line in r.stderr.splitlines() if "cannot write the log" in line]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], r.stderr
    assert str(full_home / "logs" / "pairctl.jsonl") in warnings[0]
    assert "bisect state of lab was absent" in r.stdout  # the command did what it was asked
