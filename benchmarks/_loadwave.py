"""A bounded CPU load that switches on and off on a schedule: the lab's reproducible noise source.

Issue 31: qualifications must hold on a machine whose neighbours come and go. `LoadWave` starts
`workers` processes that each busy-spin while the schedule is "on" and sleep while it is "off",
all on one clock (wall time since the start, passed to every worker), so the load is a square
wave of `on_s` seconds on, `off_s` seconds off, repeated. It is bounded three ways:

- every worker exits by itself once `duration_s` has passed since the start, whatever happens;
- a worker whose parent is gone (the benchmark or test was killed) exits at its next tick;
- `stop()` (and leaving the `with` block) ends the workers it started, by their pids, and waits
  for each (bounded), collecting the CPU time each really used (`os.wait4`).

    with LoadWave(Schedule(workers=2, on_s=20, off_s=20, duration_s=900)) as wave:
        ...  # qualify
    wave.record()  # the schedule, the start time and each worker's CPU seconds, for the results

Run as `python -m benchmarks._loadwave WORKER_JSON` only by `LoadWave` itself (one worker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

TICK_S = 0.05  # how often a worker checks its schedule, its deadline and its parent


@dataclass(frozen=True)
class Schedule:
    workers: int = 1
    on_s: float = 20.0
    off_s: float = 20.0
    duration_s: float = 600.0  # every worker exits by then
    start_on: bool = True  # the first phase: on (load first) or off

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 64:
            raise ValueError(f"workers must be 1..64, got {self.workers}")
        if self.on_s <= 0 or self.off_s < 0 or not 0 < self.duration_s <= 7200:
            raise ValueError(f"on_s > 0, off_s >= 0 and 0 < duration_s <= 7200 needed, got {self}")

    def is_on(self, elapsed: float) -> bool:
        period = self.on_s + self.off_s
        phase = elapsed % period if period > 0 else 0.0
        first, first_len = (True, self.on_s) if self.start_on else (False, self.off_s)
        return first if phase < first_len else not first


@dataclass
class LoadWave:
    schedule: Schedule
    started_at: float | None = None  # wall clock (time.time) of the schedule's zero
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cpu_s: dict[int, float] = field(default_factory=dict)  # pid -> user + system CPU seconds
    stopped_by: dict[int, str] = field(default_factory=dict)  # pid -> "itself" | "stop()"

    def start(self) -> LoadWave:
        if self.procs:
            raise RuntimeError("this load wave is already running")
        self.started_at = time.time()
        spec = json.dumps({**asdict(self.schedule), "t0": self.started_at, "parent": os.getpid()})
        for _ in range(self.schedule.workers):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "benchmarks._loadwave", spec],
                    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return self

    def running(self) -> int:
        return sum(1 for p in self.procs if p.poll() is None and p.pid not in self.cpu_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the workers this wave started (SIGTERM, then SIGKILL after `timeout_s`) and reap them."""
        for p in self.procs:
            if p.pid in self.cpu_s:
                continue
            if p.poll() is None:
                self.stopped_by[p.pid] = "stop()"
                p.send_signal(signal.SIGTERM)
            else:
                self.stopped_by.setdefault(p.pid, "itself")
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            if p.pid in self.cpu_s:
                continue
            while time.monotonic() < deadline:
                if self._reap(p, os.WNOHANG):
                    break
                time.sleep(0.02)
            else:
                p.kill()
                self._reap(p, 0)

    def wait(self, timeout_s: float) -> bool:
        """Wait (bounded) for the workers to end by themselves; True when all did."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.pid not in self.cpu_s and self._reap(p, os.WNOHANG):
                    self.stopped_by.setdefault(p.pid, "itself")
            if all(p.pid in self.cpu_s for p in self.procs):
                return True
            time.sleep(0.05)
        return False

    def _reap(self, p: subprocess.Popen[bytes], flags: int) -> bool:
        try:
            pid, status, usage = os.wait4(p.pid, flags)
        except ChildProcessError:  # reaped already (by Popen.poll)
            self.cpu_s.setdefault(p.pid, float("nan"))
            return True
        if pid == 0:
            return False
        p.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s[p.pid] = usage.ru_utime + usage.ru_stime
        return True

    def record(self) -> dict[str, Any]:
        return {
            "schedule": asdict(self.schedule),
            "started_at": self.started_at,
            "workers": [
                {"pid": p.pid, "cpu_s": self.cpu_s.get(p.pid), "ended_by": self.stopped_by.get(p.pid)}
                for p in self.procs
            ],
        }

    def __enter__(self) -> LoadWave:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker(spec: dict[str, Any]) -> int:
    """One worker: spin while the schedule is on, sleep while off, until the deadline or orphaned."""
    sched = Schedule(**{k: spec[k] for k in ("workers", "on_s", "off_s", "duration_s", "start_on")})
    t0, parent = float(spec["t0"]), int(spec["parent"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    x = 0
    while True:
        elapsed = time.time() - t0
        if elapsed >= sched.duration_s or os.getppid() != parent:
            return 0
        tick_end = time.monotonic() + TICK_S
        if sched.is_on(elapsed):
            while time.monotonic() < tick_end:
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF  # busy: pure CPU, no memory traffic to speak of
        else:
            time.sleep(TICK_S)


if __name__ == "__main__":
    sys.exit(worker(json.loads(sys.argv[1])))
