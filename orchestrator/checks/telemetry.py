"""Peak memory per host while the suite runs: GPU memory from nvidia-smi where present, else
the service's resident memory (VmHWM / VmRSS from /proc/<pid>/status).

Each sample is one fixed remote command with a bounded timeout. A sample that times out or breaks
is a *sampler fault*, recorded apart from check verdicts: a slow SSH probe never fails a pair.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.checks.base import CheckResult, result
from orchestrator.hosts.probes import service_dir
from orchestrator.remote.command import Cmd
from orchestrator.roles import SERVICE_OF_ROLE

NAME = "telemetry"

# Fixed text; the pid file arrives as $1, so nothing is ever formatted into the shell line.
SAMPLE_SCRIPT = (
    r"""
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "source=nvidia-smi"
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader,nounits """
    r"""|| echo "nvidia_smi_failed=$?"
fi
pid=$(cat "$1" 2>/dev/null)
if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
  echo "source=proc pid=$pid"
  grep -E '^(VmHWM|VmRSS):' "/proc/$pid/status"
else
  echo "no_process=$1"
fi
"""
)


def sample_cmd(root: str, role: str, folder: str | None = None) -> Cmd:
    """FOLDER: where the service keeps its pid file now (probes.service_dir), `<root>/run` when not given."""
    pidfile = f"{folder or root.rstrip('/') + '/run'}/{SERVICE_OF_ROLE[role]}.pid"
    return Cmd(("sh", "-c", SAMPLE_SCRIPT, "pairctl-mem", pidfile))


def parse_sample(text: str) -> dict[str, Any]:
    """The sample script's output -> {"gpus": [{index, name, used_mib, total_mib}], "pid", "vm_hwm_kib",
    "vm_rss_kib"}."""
    out: dict[str, Any] = {"gpus": []}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line == "source=nvidia-smi":
            section = "gpu"
            continue
        if line.startswith("source=proc"):
            section = "proc"
            pid = line.split("pid=", 1)[1]
            out["pid"] = int(pid) if pid.isdigit() else None
            continue
        if line.startswith("no_process="):
            out["no_process"] = True
            section = None
            continue
        if line.startswith("nvidia_smi_failed="):
            out["nvidia_smi_failed"] = True
            continue
        if section == "gpu":
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 4:
                raise ValueError(f"nvidia-smi line {line!r}: expected 4 fields")
            idx, name, used, total = parts
            out["gpus"].append(
                {"index": int(idx), "name": name, "used_mib": int(float(used)), "total_mib": int(float(total))}
            )
        elif section == "proc":
            key, _, rest = line.partition(":")
            value = rest.strip().split()
            if key == "VmHWM" and value:
                out["vm_hwm_kib"] = int(value[0])
            elif key == "VmRSS" and value:
                out["vm_rss_kib"] = int(value[0])
        else:
            raise ValueError(f"unexpected sample line {line!r}")
    return out


@dataclass
class HostPeak:
    samples: int = 0
    faults: int = 0
    gpu_used_mib_peak: int | None = None
    gpu_source: bool = False
    vm_hwm_kib: int | None = None
    vm_rss_kib_peak: int | None = None


def fold(peaks: dict[str, HostPeak], host: str, s: dict[str, Any]) -> None:
    p = peaks.setdefault(host, HostPeak())
    p.samples += 1
    if s.get("gpus"):
        p.gpu_source = True
        used = sum(g["used_mib"] for g in s["gpus"])
        p.gpu_used_mib_peak = max(p.gpu_used_mib_peak or 0, used)
    if s.get("vm_hwm_kib") is not None:
        p.vm_hwm_kib = max(p.vm_hwm_kib or 0, s["vm_hwm_kib"])
    if s.get("vm_rss_kib") is not None:
        p.vm_rss_kib_peak = max(p.vm_rss_kib_peak or 0, s["vm_rss_kib"])


@dataclass
class Sampler:
    """Samples every host every `interval_s` in a thread, from `start()` to `stop()`."""

    transports: Mapping[str, Any]  # role -> Transport
    roots: Mapping[str, str]  # role -> install_root
    hosts: Mapping[str, str]  # role -> host name
    interval_s: float = 1.0
    timeout_s: float = 10.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    peaks: dict[str, HostPeak] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0
    # role -> its service's folder, resolved once per check run: only a start moves it, and a
    # sampler's run starts nothing
    _dirs: dict[str, str] = field(default_factory=dict)

    def sample_once(self) -> None:
        for role, tr in self.transports.items():
            host = self.hosts.get(role, role)
            root = self.roots.get(role)
            if root is None:
                continue
            t = round(time.monotonic() - self._t0, 3)
            try:
                d = self._dirs.get(role) or self._dirs.setdefault(role, service_dir(tr, root, SERVICE_OF_ROLE[role]))
                r = tr.run(sample_cmd(root, role, d), check=False, timeout=self.timeout_s)
                text = r.stdout.decode() if isinstance(r.stdout, bytes) else r.stdout
                s = parse_sample(text)
            except Exception as exc:  # timeout, lost connection, odd output: a sampler fault
                self.faults.append(
                    {
                        "t_s": t,
                        "host": host,
                        "role": role,
                        "fault": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                    }
                )
                self.peaks.setdefault(host, HostPeak()).faults += 1
                continue
            self.rows.append({"t_s": t, "host": host, "role": role, **s})
            fold(self.peaks, host, s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="pairctl-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * max(1, len(self.transports)) + 5)
        self.sample_once()  # one last sample: the peak (VmHWM) after everything ran

    def result(self) -> CheckResult:
        figures: dict[str, Any] = {"sampler_faults": len(self.faults)}
        problems = []
        for role in self.transports:
            host = self.hosts.get(role, role)
            p = self.peaks.get(host, HostPeak())
            if p.gpu_source:
                figures[f"{host}.gpu_peak_mib"] = p.gpu_used_mib_peak
            if p.vm_hwm_kib is not None:
                figures[f"{host}.rss_peak_mib"] = round(p.vm_hwm_kib / 1024, 1)
            if p.samples == 0:
                problems.append(f"{host}: no sample succeeded ({p.faults} sampler faults)")
        raw = {
            "peaks": {h: p.__dict__ for h, p in self.peaks.items()},
            "faults": self.faults,
            "samples": len(self.rows),
        }
        if not self.transports:
            return result(NAME, "skipped", "no host transports: nothing sampled")
        # not required: telemetry reports; a sampler fault is not a failure of the pair
        msg = "; ".join(problems) or f"{len(self.rows)} samples, {len(self.faults)} sampler faults"
        return result(NAME, "error" if problems else "passed", msg, figures=figures, raw=raw, required=False)
