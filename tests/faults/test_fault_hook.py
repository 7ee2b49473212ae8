"""The engine's test-only fault hook (orchestrator/faults.py): inert unless enabled,
pauses at exactly the named step boundary, kills at it, fires once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import sys
from orchestrator import faults
for name in sys.argv[1:]:
    faults.at_step(name)
    print(name, flush=True)
"""


def _child(tmp_path: Path, hook: str | None, enable: str | None, steps: list[str]) -> subprocess.Popen:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PAIRCTL_FAULT") and k != "PAIRCTL_ENABLE_FAULT_HOOKS"
    }
    if hook is not None:
        env["PAIRCTL_FAULT_HOOK"] = hook
        env["PAIRCTL_FAULT_DIR"] = str(tmp_path)
    if enable is not None:
        env["PAIRCTL_ENABLE_FAULT_HOOKS"] = enable
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *steps],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_inert_unless_enabled(tmp_path):
    for enable in (None, "0", "yes"):
        p = _child(tmp_path, "b:kill", enable, ["a", "b", "c"])
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0 and out.split() == ["a", "b", "c"], enable


def test_kill_at_the_boundary(tmp_path):
    p = _child(tmp_path, "b:kill", "1", ["a", "b", "c"])
    out, _ = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and out.split() == ["a"]


def test_pause_waits_for_resume_and_fires_once(tmp_path):
    p = _child(tmp_path, "b:pause", "1", ["a", "b", "c", "b"])
    deadline = time.monotonic() + 60
    while not (tmp_path / "paused").exists():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    marker = json.loads((tmp_path / "paused").read_text())
    assert marker == {"pid": p.pid, "step": "b"}
    time.sleep(0.3)
    assert p.poll() is None  # still waiting
    (tmp_path / "resume").touch()
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and out.split() == ["a", "b", "c", "b"]


def test_a_check_boundary_is_a_step_name_with_a_colon(tmp_path):
    """The matrix stops acceptance at `check:NAME`: the hook splits the action at the LAST colon."""
    (tmp_path / "resume").touch()
    p = _child(tmp_path, "check:cached_continuation:pause", "1", ["check", "check:cached_continuation", "after"])
    out, _ = p.communicate(timeout=30)
    assert out.split() == ["check", "check:cached_continuation", "after"]
    assert json.loads((tmp_path / "paused").read_text())["step"] == "check:cached_continuation"
