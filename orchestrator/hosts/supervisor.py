"""The per-service supervisor on a host: its options (pure) and its state file (read over SFTP).

`pairctl-svc supervise` restarts a crashed service with exponential backoff, gives up after a
crash loop, restarts a hung llama-server or one whose RPC peer went away, starts it only once the
peer answers, and acts on nothing while a lease is held. A `stop` kills the supervisor first.
Its state is `run/NAME.state` (or in the host's runtime dir: probes.RuntimeDir), KEY=VALUE lines
written by rename; this module parses it.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from orchestrator.config.inventory import Supervision
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.probes import service_dir
from orchestrator.remote.transport import HOST_FILE_MAX, Transport

CLOCK_TICKS_PER_S = 100  # Linux USER_HZ: /proc/PID/stat start times are in these


def _num(x: float) -> str:
    return f"{x:g}"


def ipv4_endpoint(host: str, port: int) -> str | None:
    """ADDRESS:PORT for the supervisor's bash /dev/tcp probes: dotted IPv4 only (else None: no probe)."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return None
    return f"{host}:{port}"


def release_files_digest(expected: Mapping[str, str]) -> str:
    """What `pairctl-svc supervise` checks a release against before a start (sup.files): sha256
    of its sorted `sha256sum` lines ("HASH  ./PATH", manifest.json aside); any file added, changed
    or removed changes it."""
    lines = sorted(f"{sha}  ./{rel}\n" for rel, sha in expected.items() if rel != "manifest.json")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def sup_args(
    s: Supervision,
    *,
    health: str | None = None,
    peer: str | None = None,
    rpc: str | None = None,
    allow: list[str] | None = None,
    user: str | None = None,
) -> list[str]:
    """The `sup.KEY=VALUE` words for the supervisor. `health` (llama-server's ADDRESS:PORT): hang
    detection; `peer` (the RPC server's): start llama-server once it answers, restart it when it
    is lost; `rpc` (ggml-rpc-server's own): its hang detection (RPC HELLO); `allow`: its peers,
    through the guard; `user`: the service_user a root supervisor runs it as."""
    out = [
        f"sup.backoff={_num(s.backoff_s)}",
        f"sup.backoff_max={_num(s.backoff_max_s)}",
        f"sup.loop_n={s.loop_starts}",
        f"sup.loop_s={s.loop_window_s}",
        f"sup.probe_s={_num(s.probe_every_s)}",
        f"sup.log_max={s.log_max_bytes}",
        f"sup.log_keep={s.log_keep}",
    ]
    if health:
        out += [f"sup.health={health}", f"sup.hang_s={s.hang_after_s}"]
    if rpc:  # ggml-rpc-server's ADDRESS:PORT: stopped, or no HELLO answer while idle, is hung
        out += [f"sup.rpc={rpc}", f"sup.hang_s={s.hang_after_s}"]
    if peer:
        out.append(f"sup.peer={peer}")
    if allow:  # ggml-rpc-server with its guard preloaded: only these peers are served (rpc_guard.py)
        out.append(f"sup.allow={','.join(allow)}")
    if user:  # the service drops to this user (its home, log and API key file become its own)
        out.append(f"sup.user={user}")
    return out


@dataclass(frozen=True)
class SupervisorState:
    """What `run/NAME.state` says, plus whether the supervisor process lives."""

    state: str  # starting | running | exited | backoff | waiting-peer | passive-lease | given-up | refused | stopped
    restarts: int
    last_exit: str | None  # "exit N", "signal N", "hung (...)", "peer-lost (...)"
    started_at: int | None  # host epoch seconds of the current process's start
    given_up: bool
    supervisor_alive: bool
    uptime_s: float | None = None  # of the current process, by the host's /proc clock
    refused: str | None = None  # why it started nothing (its release's files differ from the manifest)
    runtime_dir: str | None = None  # where its files are when not in run/ (that took no new file)

    def as_dict(self) -> dict[str, object]:
        d = {**asdict(self), "uptime_s": None if self.uptime_s is None else round(self.uptime_s, 1)}
        if self.runtime_dir is None:  # shown only where it is one
            del d["runtime_dir"]
        return d


def parse_state(text: str, *, supervisor_alive: bool = False) -> SupervisorState:
    """KEY=VALUE lines (unknown keys ignored: the host is untrusted, a bad value reads as absent)."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            kv[k.strip()] = v.strip()

    def as_int(key: str) -> int | None:
        v = kv.get(key, "")
        return int(v) if v.isdigit() else None

    last = kv.get("last_exit")
    return SupervisorState(
        state=kv.get("state", "unknown")[:40],
        restarts=as_int("restarts") or 0,
        last_exit=None if last in (None, "", "-") else last[:200],
        started_at=as_int("started_at"),
        given_up=kv.get("given_up") == "1",
        supervisor_alive=supervisor_alive,
        refused=kv.get("refused", "")[:200] or None,
    )


def parse_uptime(proc_uptime: str, proc_stat: str) -> float | None:
    """Seconds a process has run: /proc/uptime minus its start (field 22 of /proc/PID/stat, after
    the parenthesised name, which may itself hold spaces)."""
    try:
        boot_s = float(proc_uptime.split()[0])
        fields = proc_stat.rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 overall; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None
    return max(0.0, boot_s - start_ticks / CLOCK_TICKS_PER_S)


def _read(t: Transport, path: str) -> str | None:
    try:
        return t.read_bytes(path, max_bytes=HOST_FILE_MAX).decode("utf-8", "replace")
    except (FileNotFoundError, OSError):
        return None


def read_state(t: Transport, layout: HostLayout, name: str, folder: str | None = None) -> SupervisorState | None:
    """The supervisor's state for NAME over SFTP (no exec), or None when it never ran here; read
    where the helper's readers read it (the runtime dir while it holds NAME.state, else run/).
    FOLDER: that folder, where the caller has just resolved it (probes.service_dir)."""
    d = folder or service_dir(t, layout.root, name)
    in_rt = d != layout.run
    text = _read(t, f"{d}/{name}.state")
    if text is None:
        return None
    spid = (_read(t, f"{d}/{name}.sup.pid") or "").strip()
    alive = False
    if spid.isdigit():  # `sh .../pairctl-svc supervise ROOT NAME ...` (guards against a reused pid)
        cmd = _read(t, f"/proc/{spid}/cmdline") or ""
        alive = "\0supervise\0" in cmd and f"\0{name}\0" in cmd
    st = parse_state(text, supervisor_alive=alive)
    if in_rt:
        st = SupervisorState(**{**st.__dict__, "runtime_dir": d})
    pid = (_read(t, f"{d}/{name}.pid") or "").strip()
    if st.state == "running" and pid.isdigit():
        up, stat = _read(t, "/proc/uptime"), _read(t, f"/proc/{pid}/stat")
        if up and stat:
            return SupervisorState(**{**st.__dict__, "uptime_s": parse_uptime(up, stat)})
    return st
