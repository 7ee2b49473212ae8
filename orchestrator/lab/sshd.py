"""One lab SSH host: a real Debian `sshd` with its own config, host key and install root.

Planning (config text, argv, process identity) is pure; `SshdHost` runs it. A lab sshd is
recognised only by its pid file *and* `/proc/<pid>` showing `/usr/sbin/sshd` with this host's
config path, so `down` can never signal a process the lab did not start.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import HostError, PairctlError
from orchestrator.evidence.procid import stat_fields
from orchestrator.lab.keys import ensure_ed25519, public_key_line, write_if_changed

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")


@dataclass(frozen=True)
class HostPlan:
    """Where one lab host lives on disk and what it listens on (pure data)."""

    name: str
    address: str
    port: int
    user: str
    dir: Path  # Home.lab/hosts/<name>

    @property
    def config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def pid_file(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def authorized_keys(self) -> Path:
        return self.dir / "authorized_keys"

    @property
    def root(self) -> Path:
        """The host's install_root."""
        return self.dir / "root"

    @property
    def meta_file(self) -> Path:
        return self.dir / "host.json"

    def start_argv(self) -> tuple[str, ...]:
        return (SSHD, "-f", str(self.config), "-E", str(self.log_file))

    def test_argv(self) -> tuple[str, ...]:
        return (SSHD, "-t", "-f", str(self.config))


INSTALL_ARGV = ("apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server", "openssh-client")


def ensure_sshd_installed() -> None:
    """Install Debian's openssh-server when /usr/sbin/sshd is missing (root only; no systemd used)."""
    if Path(SSHD).is_file() and Path("/usr/bin/ssh-keygen").is_file():
        return
    if os.geteuid() != 0:
        raise PairctlError(f"{SSHD} is missing", hint="install Debian's openssh-server (or run `make system`)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (("apt-get", "update", "-qq"), INSTALL_ARGV):
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PairctlError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-500:]}")
    if not Path(SSHD).is_file():
        raise PairctlError(f"{SSHD} is still missing after installing openssh-server")


def is_lab_address(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return False


def check_loopback(address: str) -> None:
    """The lab only ever listens on 127.0.0.0/8."""
    if not is_lab_address(address):
        raise PairctlError(f"lab hosts must use a 127.0.0.0/8 address, not {address!r}")


def render_sshd_config(plan: HostPlan) -> str:
    """sshd_config for a lab host: key-only login for one user, no DNS, no env, SFTP in-process."""
    lines = [
        f"# Written by `pairctl lab up` for lab host {plan.name}. Regenerated on every `lab up`.",
        f"ListenAddress {plan.address}:{plan.port}",
        f"HostKey {plan.host_key}",
        f"PidFile {plan.pid_file}",
        f"AuthorizedKeysFile {plan.authorized_keys}",
        "PubkeyAuthentication yes",
        "AuthenticationMethods publickey",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitRootLogin prohibit-password",
        f"AllowUsers {plan.user}",
        "StrictModes no",
        "UsePAM no",
        "UseDNS no",
        "PermitUserEnvironment no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "MaxSessions 32",
        "MaxStartups 64:30:128",
        "LoginGraceTime 30",
        "LogLevel INFO",
        "Subsystem sftp internal-sftp",
        # Debian's bash sources ~/.bashrc for every ssh command (an operator's costs ~0.5 s); with
        # SHLVL=1 it skips it, as a real host with a plain rc behaves
        "SetEnv SHLVL=1",
    ]
    return "\n".join(lines) + "\n"


def is_lab_sshd(pid: int, config: Path, *, proc: Path = Path("/proc")) -> bool:
    """Whether `pid` is /usr/sbin/sshd running with `config` (its listener rewrites its title,
    which keeps the original arguments, so the config path is still in cmdline)."""
    try:
        exe = os.readlink(proc / str(pid) / "exe")
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    exe = exe.removesuffix(" (deleted)")
    return os.path.basename(exe) == "sshd" and str(config).encode() in cmdline


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def port_answers(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def children_of(pid: int, *, proc: Path = Path("/proc")) -> list[int]:
    """Direct children of `pid` (sshd's per-connection processes)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)  # a zombie is dead for our purposes
    return bool(fields) and fields[0] != "Z"


def terminate(pids: list[int], *, timeout: float = 5.0) -> list[int]:
    """SIGTERM, wait, then SIGKILL what is left; return the pids still alive at the end."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if pid_alive(p)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.05 if left else 0)
    return [p for p in left if pid_alive(p)]


@dataclass(frozen=True)
class HostState:
    name: str
    address: str
    port: int
    pid: int | None
    running: bool
    answering: bool
    root: str
    started: bool = False  # started by this call (not already running)

    @property
    def state(self) -> str:
        if self.running and self.answering:
            return "up"
        if self.running:
            return "not answering"
        return "down"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["host"], d["install_root"] = d.pop("name"), d.pop("root")
        return {**d, "state": self.state}


class SshdHost:
    """Starts, inspects and stops one lab sshd."""

    def __init__(self, plan: HostPlan) -> None:
        check_loopback(plan.address)
        self.plan = plan

    def running_pid(self) -> int | None:
        pid = read_pid(self.plan.pid_file)
        if pid is not None and pid_alive(pid) and is_lab_sshd(pid, self.plan.config):
            return pid
        return None

    def state(self, *, started: bool = False) -> HostState:
        pid = self.running_pid()
        p = self.plan
        return HostState(
            name=p.name,
            address=p.address,
            port=p.port,
            pid=pid,
            running=pid is not None,
            answering=port_answers(p.address, p.port) if pid else False,
            root=str(p.root),
            started=started,
        )

    def prepare(self, operator_pub: Path) -> bool:
        """Write host key, authorized_keys, config and install root; True if the config changed."""
        p = self.plan
        p.dir.mkdir(parents=True, exist_ok=True)
        p.root.mkdir(parents=True, exist_ok=True)
        os.chmod(p.root, 0o755)
        ensure_ed25519(p.host_key, f"pairctl-lab-{p.name}")
        write_if_changed(p.authorized_keys, public_key_line(operator_pub) + " pairctl-operator\n", 0o600)
        meta = json.dumps({"name": p.name, "address": p.address, "port": p.port, "user": p.user}, indent=2) + "\n"
        write_if_changed(p.meta_file, meta, 0o644)
        return write_if_changed(p.config, render_sshd_config(p), 0o644)

    def host_key_line(self) -> str:
        return public_key_line(self.plan.host_key.with_name(self.plan.host_key.name + ".pub"))

    def up(self, operator_pub: Path, *, wait_s: float = 10.0) -> HostState:
        """Idempotent: keep a running sshd with the same config, (re)start otherwise."""
        changed = self.prepare(operator_pub)
        pid = self.running_pid()
        if pid is not None and not changed:
            return self.state()
        if pid is not None:
            self.down()
        self.plan.pid_file.unlink(missing_ok=True)  # stale: the pid is gone or not ours
        p = self.plan
        orphan = orphaned_lab_sshd(p.address, p.port, p.config)
        if orphan is not None:
            if terminate([orphan] + [c for c in children_of(orphan) if _is_sshd_exe(c)]):
                raise HostError(
                    f"lab host {p.name}: orphaned lab sshd pid {orphan} on {p.address}:{p.port} survived SIGKILL"
                )
        if port_answers(p.address, p.port) or _connects(p.address, p.port):
            raise HostError(
                f"lab host {p.name}: {p.address}:{p.port} is already in use by a process this lab did not start",
                hint="another pairctl home's lab may be up on the same address; run `pairctl --home OTHER lab down`",
            )
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        test = subprocess.run(p.test_argv(), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if test.returncode != 0:
            raise HostError(f"lab host {p.name}: sshd rejects its config {p.config}: {test.stderr.strip()}")
        proc = subprocess.run(p.start_argv(), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostError(f"lab host {p.name}: sshd failed to start: {proc.stderr.strip()}{_log_tail(p.log_file)}")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.running_pid() is not None and port_answers(p.address, p.port):
                return self.state(started=True)
            time.sleep(0.05)
        raise HostError(
            f"lab host {p.name}: sshd did not answer on {p.address}:{p.port} within {wait_s:.0f}s"
            f"{_log_tail(p.log_file)}"
        )

    def down(self) -> list[int]:
        """Stop this host's sshd and its session processes; return the pids stopped."""
        pid = self.running_pid()
        if pid is None:
            self.plan.pid_file.unlink(missing_ok=True)
            return []
        pids = [pid] + [c for c in children_of(pid) if _is_sshd_exe(c)]
        left = terminate(pids)
        if left:
            raise PairctlError(f"lab host {self.plan.name}: pids {left} survived SIGKILL")
        self.plan.pid_file.unlink(missing_ok=True)
        return pids


def listening_inodes(address: str, port: int, tcp_table: str) -> set[str]:
    """Socket inodes listening on IPv4 address:port in /proc/net/tcp text (pure)."""
    want = f"{int.from_bytes(ipaddress.IPv4Address(address).packed, 'little'):08X}:{port:04X}"
    out = set()
    for line in tcp_table.splitlines()[1:]:
        f = line.split()
        if len(f) > 9 and f[1].upper() == want and f[3] == "0A":  # 0A = LISTEN
            out.add(f[9])
    return out


def config_arg(cmdline: bytes) -> str | None:
    """The `-f CONFIG` path in an sshd cmdline (also in its rewritten listener title)."""
    words = cmdline.replace(b"\0", b" ").decode(errors="replace").split()
    for i, w in enumerate(words[:-1]):
        if w == "-f":
            return words[i + 1]
    return None


def orphaned_lab_sshd(address: str, port: int, own_config: Path) -> int | None:
    """The pid of a lab sshd on address:port that no pid file leads to any more: one running this
    host's own config (its pid file lost) or a lab config that no longer exists. Any other live
    config is another home's lab: never ours."""
    try:
        inodes = listening_inodes(address, port, Path("/proc/net/tcp").read_text())
    except OSError:
        return None
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not _is_sshd_exe(int(entry.name)):
            continue
        try:
            cfg = config_arg((entry / "cmdline").read_bytes())
            fds = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
        except OSError:
            continue
        lost = cfg is not None and "/lab/hosts/" in cfg and cfg.endswith("/sshd_config") and not Path(cfg).exists()
        if cfg == str(own_config) or lost:
            if any(f"socket:[{i}]" in fds for i in inodes):
                return int(entry.name)
    return None


def _is_sshd_exe(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")).startswith("sshd")
    except OSError:
        return False


def _connects(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _log_tail(log: Path, n: int = 5) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return ("\n  sshd log: " + "\n  sshd log: ".join(lines)) if lines else ""
