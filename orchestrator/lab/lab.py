"""The `Lab` facade: `up`, `status`, `down` for the embedded default on one machine.

`up` is idempotent (running hosts stay, stale pid files are replaced); `down` stops what this
home's lab started — every host under `Home.lab/hosts/`, whatever inventory brought it up — and
any llama-server / ggml-rpc-server whose pid file lives in a lab host's `root/run/`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import progress
from orchestrator.config.inventory import Inventory
from orchestrator.errors import ConfigError, PairctlError
from orchestrator.evidence.safejson import read_index
from orchestrator.filelock import file_lock
from orchestrator.hosts.probes import runtime_path
from orchestrator.lab.keys import KnownHost, ensure_ed25519, write_known_hosts
from orchestrator.lab.models import ROLE_FILES, ensure_lab_models, models_present
from orchestrator.lab.real_model import REAL_FILES, ensure_real_model, real_model_present
from orchestrator.lab.source import ensure_source
from orchestrator.lab.sshd import (
    HostPlan,
    HostState,
    SshdHost,
    ensure_sshd_installed,
    is_lab_address,
    pid_alive,
    read_pid,
    terminate,
)
from orchestrator.log import get_logger
from orchestrator.paths import Home

SERVICE_NAMES = ("llama-server", "ggml-rpc-server")


def host_plans(home: Home, inventory: Inventory) -> list[HostPlan]:
    """The inventory's loopback hosts as lab host plans (pure). Other hosts are not the lab's."""
    plans = []
    for name, h in sorted(inventory.hosts.items()):
        if h.transport != "ssh" or not is_lab_address(h.address):
            continue
        plan = HostPlan(name=name, address=h.address, port=h.port, user=h.user or "root", dir=home.lab / "hosts" / name)
        if Path(h.install_root).resolve() != plan.root.resolve():
            raise ConfigError(
                f"inventory host {name!r}: install_root {h.install_root} is not the lab's {plan.root}",
                hint="lab inventories use install_root: ${PAIRCTL_HOME}/lab/hosts/<name>/root",
            )
        plans.append(plan)
    return plans


@dataclass(frozen=True)
class LabStatus:
    hosts: list[HostState]
    models: dict[str, str]
    models_ok: bool
    source: str | None
    known_hosts: str

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "hosts": [h.as_dict() for h in self.hosts]}


@dataclass(frozen=True)
class DownReport:
    stopped: list[dict[str, Any]] = field(default_factory=list)  # {"host", "what", "pids"}

    def as_dict(self) -> dict[str, Any]:
        return {"stopped": self.stopped}


class Lab:
    """The lab of one pairctl home for one inventory."""

    def __init__(self, home: Home, inventory: Inventory) -> None:
        self.home = home
        self.inventory = inventory
        self.plans = host_plans(home, inventory)
        self.log = get_logger(component="lab")

    @property
    def operator_key(self) -> Path:
        return self.home.lab / "keys" / "operator"

    @property
    def known_hosts(self) -> Path:
        return self.home.lab / "known_hosts"

    @property
    def models_dir(self) -> Path:
        return self.home.lab / "models"

    @property
    def source_dir(self) -> Path:
        return self.home.lab / "source"

    def model_paths(self) -> dict[str, Path]:
        return {role: self.models_dir / f for role, f in {**ROLE_FILES, **REAL_FILES}.items()}

    def up(self, *, source: bool = True) -> LabStatus:
        """Keys, models, (source), then every host's sshd; known_hosts written before any login."""
        self.home.ensure()
        with lab_lock(self.home):
            return self._up(source=source)

    def _up(self, *, source: bool) -> LabStatus:
        # An inventory of local hosts only (a GPU machine) needs no sshd, operator key or known_hosts.
        pub = None
        t0 = time.monotonic()

        def say(what: str) -> None:  # one line per phase on stderr: a CI log sees `lab up` move
            progress.event("lab", f"lab up: {what} ({time.monotonic() - t0:.1f} s)")

        if self.plans:
            ensure_sshd_installed()
            pub = ensure_ed25519(self.operator_key, "pairctl-operator")
        ensure_lab_models(self.models_dir)
        ensure_real_model(self.models_dir)
        say(f"models ready in {self.models_dir}")
        if source:
            ensure_source(self.home)
            say(f"llama.cpp source ready in {self.source_dir}")
        hosts = [SshdHost(p) for p in self.plans]
        if not hosts:
            return self._status([])
        assert pub is not None  # written above whenever there are hosts
        for h in hosts:
            h.prepare(pub)
        write_known_hosts(self.known_hosts, [KnownHost(h.plan.address, h.plan.port, h.host_key_line()) for h in hosts])
        states = []
        for h in hosts:
            st = h.up(pub)
            self.log.info("lab host up", host=st.name, address=st.address, port=st.port, pid=st.pid, started=st.started)
            say(f"host {st.name} {'started' if st.started else 'already up'} on {st.address}:{st.port}")
            states.append(st)
        return self._status(states)

    def status(self) -> LabStatus:
        return self._status([SshdHost(p).state() for p in self.plans])

    def _status(self, states: list[HostState]) -> LabStatus:
        return LabStatus(
            hosts=states,
            models={role: str(p) for role, p in self.model_paths().items()},
            models_ok=models_present(self.models_dir) and real_model_present(self.models_dir),
            source=str(self.source_dir) if (self.source_dir / ".git").exists() else None,
            known_hosts=str(self.known_hosts),
        )

    def down(self) -> DownReport:
        """Stop services under each lab host's root, then each lab sshd (all hosts of this home)."""
        return down_all(self.home)


def lab_lock(home: Home) -> AbstractContextManager[None]:
    """One `lab up`/`lab down` at a time per home (two test sessions may share a home)."""
    return file_lock(home.lab / ".lock")


def down_all(home: Home, only: set[str] | None = None) -> DownReport:
    """Stop everything the lab of `home` started (or only the hosts named), found by pid files."""
    if not home.lab.is_dir():
        return DownReport()
    with lab_lock(home):
        return _down(home, only)


def _down(home: Home, only: set[str] | None) -> DownReport:
    log = get_logger(component="lab")
    stopped: list[dict[str, Any]] = []
    problems: list[str] = []
    hosts_dir = home.lab / "hosts"
    for hdir in sorted(p for p in hosts_dir.iterdir() if p.is_dir()) if hosts_dir.is_dir() else []:
        if only is not None and hdir.name not in only:
            continue
        plan = _plan_from_dir(hdir)
        try:
            svc = stop_services(plan.root)
            if svc:
                stopped.append({"host": plan.name, "what": "services", "pids": svc})
            pids = SshdHost(plan).down()
            if pids:
                stopped.append({"host": plan.name, "what": "sshd", "pids": pids})
                log.info("lab host down", host=plan.name, pids=pids)
            if _drop_boot_entry(plan) == "removed":
                stopped.append({"host": plan.name, "what": "@reboot crontab line", "pids": []})
        except PairctlError as exc:
            problems.append(str(exc))
    if problems:
        raise PairctlError("lab down left processes running: " + "; ".join(problems))
    return DownReport(stopped)


def _drop_boot_entry(plan: HostPlan) -> str:
    """The crontab lines deploys wrote for this lab host's root go with it: left in this user's
    crontab, they would run whatever sits at that path later (as root, at boot). Best effort:
    a warning, never a failed `lab down`."""
    import getpass

    from orchestrator.hosts.boot import remove_entry
    from orchestrator.hosts.layout import HostLayout
    from orchestrator.remote.local import LocalTransport

    if plan.user != getpass.getuser():
        return "another user's crontab"
    try:
        return remove_entry(LocalTransport(plan.name), HostLayout(str(plan.root)))
    except (PairctlError, OSError) as exc:
        get_logger(component="lab").warning("@reboot line not removed", host=plan.name, error=str(exc)[:200])
        return "not removed"


def _plan_from_dir(hdir: Path) -> HostPlan:
    try:
        meta = read_index(hdir / "host.json")
    except (OSError, ValueError):
        meta = {}
    return HostPlan(
        name=hdir.name,
        address=meta.get("address", "127.0.0.1"),
        port=int(meta.get("port", 22)),
        user=meta.get("user", "root"),
        dir=hdir,
    )


def _live_pid(pid_file: Path, is_ours: Callable[[bytes], bool]) -> int | None:
    """The pid in `pid_file` if it is alive and its /proc cmdline is what `is_ours` wants."""
    pid = read_pid(pid_file)
    if pid is None or not pid_alive(pid):
        return None
    try:
        return pid if is_ours(Path(f"/proc/{pid}/cmdline").read_bytes()) else None
    except OSError:
        return None


def service_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` if it is alive and its argv[0] names llama-server or ggml-rpc-server."""
    return _live_pid(
        pid_file, lambda c: os.path.basename(c.split(b"\0", 1)[0].decode(errors="replace")) in SERVICE_NAMES
    )


def supervisor_pid(pid_file: Path) -> int | None:
    """The pid in `run/NAME.sup.pid` if it is alive and is a `pairctl-svc supervise` loop."""
    return _live_pid(pid_file, lambda c: b"\0supervise\0" in c)


def service_dirs(root: Path) -> list[Path]:
    """`root/run`, and the runtime dir where `pairctl-svc` keeps a service started while run/ was
    read-only (its rt_where: /run/pairctl-0/ROOTTAG as root, else /dev/shm/pairctl-UID/ROOTTAG):
    a lab service left there is stopped at teardown too."""
    rt = Path(runtime_path(os.geteuid(), str(root)))
    return [d for d in (root / "run", rt) if d.is_dir() and not (d == rt and d.is_symlink())]  # (run/: a link)


def stop_supervisors(root: Path) -> list[int]:
    """SIGKILL the supervisors recorded in `root/run/*.sup.pid` (and the runtime dir's) first, so that
    stopping their services is not answered by a restart (what `pairctl-svc stop` does on a host)."""
    pids = [p for d in service_dirs(root) for f in sorted(d.glob("*.sup.pid")) if (p := supervisor_pid(f)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def stop_services(root: Path) -> list[int]:
    """Stop the services recorded in `root/run/*.pid` and the runtime dir's (supervisors first),
    deliberately: their run/NAME.boot go too, so boot starts nothing of them."""
    stop_supervisors(root)
    run = root / "run"
    for name in SERVICE_NAMES:
        (run / f"{name}.boot").unlink(missing_ok=True)
    pids = [pid for d in service_dirs(root) for f in sorted(d.glob("*.pid")) if (pid := service_pid(f)) is not None]
    if not pids:
        return []
    left = terminate(pids)
    if left:
        raise PairctlError(f"{root}: service pids {left} survived SIGKILL")
    return pids
