"""A test-only hook that stops the engine at a step boundary, for the fault-injection matrix
(tests/faults/). Inert unless BOTH environment variables are set:

    PAIRCTL_ENABLE_FAULT_HOOKS=1
    PAIRCTL_FAULT_HOOK=<step>:<action>     e.g. "upload:pause"
    PAIRCTL_FAULT_DIR=<dir>                where the markers go (pause only)

It fires once per process, just before the first step named <step> starts (the boundary
between that step and the one before it). Actions:

    pause  write <dir>/paused (JSON: pid, step), then wait until <dir>/resume exists; the test
           injects its fault meanwhile and then resumes pairctl or SIGKILLs it
    kill   SIGKILL this process (a crash exactly at the boundary, no cleanup runs)

Why an environment variable and not an option: an operator never sees it, and the real
`pairctl deploy` runs unchanged in a child process, as it would in production.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

ENABLE = "PAIRCTL_ENABLE_FAULT_HOOKS"
HOOK = "PAIRCTL_FAULT_HOOK"
DIR = "PAIRCTL_FAULT_DIR"
PAUSE_LIMIT_S = 600.0

_fired: set[str] = set()  # a hook fires once per process (a rollback reuses step names)


def at_step(name: str) -> None:
    """Called by the runner before each step; returns at once unless the hook is enabled."""
    if os.environ.get(ENABLE) != "1":
        return
    spec = os.environ.get(HOOK, "")
    step, _, action = spec.rpartition(":")  # a step name may hold a colon (check:NAME)
    if step != name or spec in _fired:
        return
    _fired.add(spec)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "pause":
        d = Path(os.environ[DIR])
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / ".paused.tmp"
        tmp.write_text(json.dumps({"pid": os.getpid(), "step": name}))
        tmp.rename(d / "paused")
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while not (d / "resume").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        raise ValueError(f"{HOOK}={spec!r}: unknown action (pause, kill)")
