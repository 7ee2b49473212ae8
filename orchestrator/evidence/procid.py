"""Who is running this journal, and is that process still alive? A pid alone may name another
process later: the owner is alive only if pid, boot id and start time (/proc stat field 22) match."""

from __future__ import annotations

import getpass
import os
import platform
import socket
import sys
from pathlib import Path

from orchestrator import __version__
from orchestrator.evidence.receipt import HostInfo

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat from field 3 (the state) on; none if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if there is no such process."""
    try:
        return int(stat_fields(pid)[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def login_user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:
        return None


def this_process() -> HostInfo:
    pid = os.getpid()
    return HostInfo(
        hostname=socket.gethostname(),
        pid=pid,
        boot_id=boot_id(),
        start_ticks=start_ticks(pid),
        user=login_user(),
        python=platform.python_version(),
        pairctl=__version__,
    )


def liveness(owner: HostInfo) -> tuple[bool | None, str]:
    """(alive, why). alive is None when this machine cannot tell (the run was on another host)."""
    if owner.hostname != socket.gethostname():
        return None, f"the run belongs to host {owner.hostname!r}, not this one"
    current_boot = boot_id()
    if owner.boot_id and current_boot and owner.boot_id != current_boot:
        return False, f"the machine rebooted since (boot id {owner.boot_id[:8]} -> {current_boot[:8]})"
    if sys.platform.startswith("linux"):
        ticks = start_ticks(owner.pid)
        if ticks is None:
            return False, f"process {owner.pid} no longer exists"
        if owner.start_ticks is not None and ticks != owner.start_ticks:
            return False, f"process {owner.pid} no longer exists (the pid now names a different process)"
        if stat_fields(owner.pid)[:1] == ["Z"]:
            return False, f"process {owner.pid} has exited (zombie)"
        return True, f"process {owner.pid} is running"
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False, f"process {owner.pid} no longer exists"
    except PermissionError:
        pass
    return True, f"process {owner.pid} is running"
