"""A test-only hook that stops the engine at a step boundary, for the fault matrix (tests/faults/).

Inert unless PAIRCTL_ENABLE_FAULT_HOOKS=1 and PAIRCTL_FAULT_HOOK=<step>:<action> are set. It fires
once per process, just before the first step named <step> starts: `pause` writes
$PAIRCTL_FAULT_DIR/paused (JSON: pid, step) and waits for <dir>/resume; `kill` SIGKILLs this process.
An environment variable, not an option: the real `pairctl deploy` runs unchanged in a child process.
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
