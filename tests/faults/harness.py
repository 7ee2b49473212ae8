"""The fault-injection harness: a dedicated lab pair on small tmpfs install roots, a real
`pairctl deploy` child process stopped at a step boundary by the engine's test-only hook
(orchestrator/faults.py), faults injected from outside at that moment, and the
operator's next commands run and judged against pairctl's promise.

The pair (`faults`) uses the lab's sshd hosts (same addresses, keys, known_hosts) under other
host names whose install roots are tmpfs mounts the harness owns, with its own server/RPC ports
and an API key file; so the matrix never disturbs the `lab` pair other tests use, and filling a
root fills a small filesystem of its own, never the shared disk.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from orchestrator.config.loader import read_yaml
from orchestrator.lab.lab import host_plans, service_dirs, service_pid, stop_supervisors
from orchestrator.lab.sshd import SshdHost, pid_alive
from orchestrator.paths import Home
from tests.plugins.cli import run_cli

PAIR = "faults"
# Steps before the first change to what runs (stop-native probes the RPC host before it stops
# anything, and a stop that cannot reach the native host never started): losing either host
# there must end in a refusal, the previous pair still serving.
HOST_LOSS_REFUSED = {
    "preflight",
    "connect",
    "facts",
    "lease",
    "prepare",
    "upload",
    "kernel-check",
    "secret",
    "stop-native",
}
ROLES = ("native", "rpc")
SERVICE = {"native": "llama-server", "rpc": "ggml-rpc-server"}
LOCK = Path("leases") / "host.lock"
RUN_TIMEOUT_S = 300
# The matrix deploys WITH acceptance (issue 21: a fault while acceptance runs must roll back, and a
# cell is "new" only when the new pair was accepted after the fault). A short set keeps the matrix
# inside CI's time: identity around one model check, whose boundary is a cell of its own.
ACCEPT_CHECKS = tuple(
    c for c in os.environ.get("PAIRCTL_FAULTS_CHECKS", "identity,cached_continuation").split(",") if c
)
CHECK_STEPS = [f"check:{c}" for c in ACCEPT_CHECKS if c != "identity"]  # identity wraps the suite: no boundary


def accept_args() -> list[str]:
    return [a for c in ACCEPT_CHECKS for a in ("--checks", c)]


# what a deploy may end with: passed, host/host key, leased, package, rolled back, rollback failed
DEPLOY_EXITS = {0, 4, 5, 6, 7, 8}
# a deploy whose pair was accepted but whose leases could not be released is a failed run (exit 1,
# issue 21: a failed release-lease is never a warning)
RELEASE_FAILED_EXIT = 1


# -- the pair ----------------------------------------------------------------------------------


@dataclass
class FaultPair:
    """The matrix's pair: inventory file, roots, the lab sshd hosts behind it, two packages."""

    home: Home
    base_inventory_path: Path
    base_inventory: Any  # resolved Inventory of the lab hosts
    inventory_path: Path
    roots: dict[str, Path]
    base_hosts: dict[str, str]  # role -> lab host name (its sshd)
    packages: tuple[str, str]  # (A, B)
    api_key: str
    name: str = PAIR
    in_flight: Any = None  # the deploy child a cell is running (killed at teardown if left)
    # (status, receipts) a cell that held ended on: the next cell's starting point, read once. No one
    # acts on this pair between two cells of its shard, so reading them again gave the same answer
    # (one status and one store scan per cell, about a quarter of a quick cell); after a cell that
    # failed, the next one reads both afresh
    last_seen: tuple[dict[str, Any], dict[str, dict[str, Any]]] | None = None
    mounted: list[Path] = field(default_factory=list)

    # pairctl as a child process, exactly as an operator runs it
    def argv(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "orchestrator",
            "--home",
            str(self.home.root),
            "--inventory",
            str(self.inventory_path),
            *args,
        ]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAIRCTL_FAULT")}
        env.pop("PAIRCTL_ENABLE_FAULT_HOOKS", None)
        env["PAIRCTL_HOME"] = str(self.home.root)
        # a cut host is given up after 30 s, not the default 60 s: 34 cut-ssh cells would otherwise
        # wait a minute each; still longer than a blip (BLIP_S), so the blip cells keep their meaning
        env.setdefault("PAIRCTL_SSH_RECONNECT_S", str(RECONNECT_S))
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """The real console script in a child process."""
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env())

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The real CLI in this process (`orchestrator.cli.main`, as the `cli` fixture runs it):
        the operator's follow-up commands, without paying interpreter start-up for each."""
        argv = ["--home", str(self.home.root), "--inventory", str(self.inventory_path), *args]
        r = run_cli(argv)
        return subprocess.CompletedProcess(argv, r.exit_code, r.stdout, r.stderr)

    def status(self) -> tuple[int, dict[str, Any]]:
        p = self.cli("--json", "status", "--pair", self.name)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            raise AssertionError(f"status printed no JSON (exit {p.returncode}): {p.stderr[-2000:]}") from None

    def deploy(self, pkg: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.cli("--json", "deploy", "--pair", self.name, "--packages", pkg, pkg, *accept_args(), *extra)

    def planned_steps(self, pkg: str) -> list[str]:
        """The steps the matrix's deploy of `pkg` runs (`--dry-run`, nothing changes), with the
        acceptance checks' boundaries after `accept`."""
        p = self.cli("--json", "deploy", "--pair", self.name, "--packages", pkg, pkg, *accept_args(), "--dry-run")
        assert p.returncode == 0, p.stderr[-2000:]
        names = [s["name"] for s in json.loads(p.stdout)["plan"]]
        return names + CHECK_STEPS if "accept" in names else names

    def sshd(self, role: str) -> SshdHost:
        plans = {p.name: p for p in host_plans(self.home, self.base_inventory)}
        return SshdHost(plans[self.base_hosts[role]])

    def operator_pub(self) -> Path:
        return self.home.lab / "keys" / "operator.pub"


def make_pair(
    home: Home,
    base_inventory_path: Path,
    base_inventory: Any,
    packages: tuple[str, str],
    *,
    root_mb: int | None,
    name: str = PAIR,
    ports: tuple[int, int] = (8190, 50190),
    base_pair: str | None = None,
) -> FaultPair:
    """Write an inventory with pair NAME on the sshd hosts of the lab's pair `base_pair` (its
    first pair by default): hosts `<name>-native|rpc`, own install roots, ports and API key file;
    with `root_mb`, each root is a tmpfs of that size."""
    base = read_yaml(base_inventory_path)
    bpair = base["pairs"][base_pair or next(iter(base["pairs"]))]
    fdir = home.root / name
    fdir.mkdir(parents=True, exist_ok=True)
    key_file = fdir / "api-key"
    api_key = "fk-" + secrets.token_hex(16)
    key_file.write_text(api_key + "\n")
    os.chmod(key_file, 0o600)
    hosts, roots, base_hosts = {}, {}, {}
    for role in ROLES:
        bname = bpair[role]
        h = dict(base["hosts"][bname])
        root = fdir / f"{role}-root"
        root.mkdir(exist_ok=True)
        h["install_root"] = str(root)
        # issue 49: no state_dir, as an operator's own inventory has it: run/ (pidfiles, supervisor
        # state, logs) links to the default ROOT.state beside the root, which the read-only bind
        # mount over the root leaves writable, as a root remounted read-only would
        hosts[f"{name}-{role}"] = h
        roots[role] = root
        base_hosts[role] = bname
    pair = dict(
        bpair,
        native=f"{name}-native",
        rpc=f"{name}-rpc",
        server_port=ports[0],
        rpc_port=ports[1],
        api_key_file=str(key_file),
    )
    pair.pop("rpc_bind", None)
    pair.pop("server_bind", None)
    inv = {"known_hosts": base["known_hosts"], "hosts": hosts, "pairs": {name: pair}}
    path = fdir / f"{name}.yaml"
    path.write_text("# written by tests/faults/harness.py\n" + yaml.safe_dump(inv, sort_keys=False))
    fp = FaultPair(home, base_inventory_path, base_inventory, path, roots, base_hosts, packages, api_key, name=name)
    if root_mb:
        for role in ROLES:
            # a fresh, empty root: its state_dir (run/: links, route record, leases) starts empty too
            shutil.rmtree(roots[role].with_name(roots[role].name + ".state"), ignore_errors=True)
            mount_tmpfs(roots[role], root_mb)
            fp.mounted.append(roots[role])
    return fp


def mount_tmpfs(path: Path, size_mb: int) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", str(path)], check=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "pairctl-faults", str(path)], check=True
    )


@contextmanager
def fresh_pair(request: Any, pairctl_home: Path, name: str, ports: tuple[int, int]) -> Iterator[FaultPair]:
    """A module's own pair (`name`, `ports`) on the session's lab hosts, never deployed before: what an
    earlier session left under its roots is removed first, and its services are stopped after."""
    home, inv_path, inv = lab_for(request, pairctl_home)
    packages = packages_for(request, pairctl_home)
    shutil.rmtree(home.root / name, ignore_errors=True)
    fp = make_pair(home, inv_path, inv, packages, root_mb=None, name=name, ports=ports)
    try:
        yield fp
    finally:
        teardown_pair(fp)


def teardown_pair(fp: FaultPair) -> None:
    if fp.in_flight is not None and fp.in_flight.proc.poll() is None:
        fp.in_flight.kill()
        fp.in_flight.proc.wait(timeout=30)
    for role in ROLES:
        fp.sshd(role).up(fp.operator_pub())  # a failed cell may have left one down
    for root in fp.roots.values():
        stop_supervisors(root)  # before their services, so that nothing restarts them
        for f in sorted((root / "run").glob("*.pid")) if (root / "run").is_dir() else []:
            pid = service_pid(f)
            if pid is not None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
        for pid in processes_under(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
        if root in fp.mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)


def lab_for(request: Any, pairctl_home: Path) -> tuple[Home, Path, Any]:
    """(home, base inventory path, resolved inventory) of running lab sshd hosts: the session's
    `lab` fixture, or PAIRCTL_FAULTS_LAB_INVENTORY (a lab of your own, for development)."""
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lab.lab import Lab

    custom = os.environ.get("PAIRCTL_FAULTS_LAB_INVENTORY")
    if not custom:
        env = request.getfixturevalue("lab")
        return env.home, env.inventory_path, env.inventory
    home = Home.resolve(pairctl_home)
    inv = load_inventory(custom, {"PAIRCTL_HOME": str(home.root)})
    Lab(home, inv).up(source=False)
    return home, Path(custom), inv


def packages_for(request: Any, pairctl_home: Path) -> tuple[str, str]:
    """Two package ids: `lab_packages` / `lab_packages_b`, or PAIRCTL_FAULTS_PACKAGES="A B"."""
    from orchestrator.build.store import PackageStore

    ids = os.environ.get("PAIRCTL_FAULTS_PACKAGES", "").split()
    if ids:
        store = PackageStore(Home.resolve(pairctl_home).store)
        for i in ids:
            store.get(i)
        return ids[0], ids[1]
    a, b = request.getfixturevalue("lab_packages"), request.getfixturevalue("lab_packages_b")
    return a.id, b.id


# -- ground truth read straight from the hosts' filesystems (the lab hosts are local) ---------


def processes_under(root: Path) -> set[int]:
    """Pids of live processes whose executable or argv[0] lies under `root`."""
    out = set()
    r = str(root).rstrip("/") + "/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            exe = os.readlink(entry / "exe")
        except OSError:
            exe = ""
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            argv0 = ""
        if (exe.startswith(r) or argv0.startswith(r)) and pid_alive(pid):
            out.add(pid)
    return out


def pidfile_pids(root: Path) -> set[int]:
    """The live services run/*.pid names, and the runtime dir's (a start while run/ was read-only)."""
    return {pid for d in service_dirs(root) for f in sorted(d.glob("*.pid")) if (pid := service_pid(f)) is not None}


def service_pid_of(fp: FaultPair, role: str) -> int | None:
    return service_pid(fp.roots[role] / "run" / f"{SERVICE[role]}.pid")


def release_dead_run_leases(fp: Any, cell: Any, st: dict[str, Any], why: str) -> None:
    """The operator's way out of leases a finished run left (its nonce died with it): status names
    the run, `lease release PAIR --dead-run RUN_ID` frees them; each must work and leave none held."""
    runs = sorted({s["run_id"] for s in st.get("stale_leases") or []})
    if not runs:
        cell.problems.append(
            f"leases held after the {why} but status names no finished run holding them: "
            f"{[h.get('leases') for h in st['hosts'].values()]}"
        )
        for r in ROLES:
            if lease_held(fp.roots[r]):
                shutil.rmtree(fp.roots[r] / LOCK)
        cell.operator.append("broke the lease by hand (status named no run)")
        return
    for run_id in runs:
        p = fp.cli("--json", "lease", "release", fp.name, "--dead-run", run_id)
        if p.returncode != 0:
            cell.problems.append(f"lease release --dead-run {run_id} exited {p.returncode}: {p.stderr[-400:]}")
    left = [r for r in ROLES if lease_held(fp.roots[r])]
    if left:
        cell.problems.append(f"a lease is still held on {left} after lease release --dead-run")
        for r in left:
            shutil.rmtree(fp.roots[r] / LOCK)
    cell.operator.append(f"lease release --dead-run (left by the {why})")


def lease_held(root: Path) -> bool:
    return (root / LOCK).exists()


# -- the deploy child, stopped at a step -------------------------------------------------------


@dataclass
class PausedRun:
    proc: subprocess.Popen
    marker_dir: Path
    paused: bool
    step: str

    def resume(self) -> None:
        (self.marker_dir / "resume").touch()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


def start_deploy_paused(
    fp: FaultPair, pkg: str, step: str, marker_dir: Path, wait_s: float = 120, extra_env: dict[str, str] | None = None
) -> PausedRun:
    """`pairctl deploy` that stops just before STEP (or runs to its end if STEP never comes)."""
    if marker_dir.exists():
        shutil.rmtree(marker_dir)
    marker_dir.mkdir(parents=True)
    env = fp.env(
        PAIRCTL_ENABLE_FAULT_HOOKS="1",
        PAIRCTL_FAULT_HOOK=f"{step}:pause",
        PAIRCTL_FAULT_DIR=str(marker_dir),
        **(extra_env or {}),
    )
    proc = subprocess.Popen(
        fp.argv("--json", "deploy", "--pair", fp.name, "--packages", pkg, pkg, *accept_args()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if (marker_dir / "paused").exists():
            return PausedRun(proc, marker_dir, True, step)
        if proc.poll() is not None:
            return PausedRun(proc, marker_dir, False, step)
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"deploy did not reach step {step} within {wait_s}s")


# -- faults ------------------------------------------------------------------------------------


@dataclass
class Fault:
    """Injected while pairctl waits at the boundary; `repair` undoes the outside world's part
    after the faulted command has finished (the host comes back, the disk is freed). An inject
    may add to `st["problems"]` what it saw go wrong while it acted (another operator's command
    that should have been refused)."""

    name: str
    inject: Callable[[FaultPair, PausedRun, dict[str, Any]], str]  # returns what it did
    repair: Callable[[FaultPair, dict[str, Any]], None] = lambda fp, st: None
    kills_pairctl: bool = False
    # the boundaries this fault is injected at (None: every step); the others are n/a for it
    steps: frozenset[str] | None = None
    # extra environment of the faulted deploy (a clock of its own)
    deploy_env: Callable[[], dict[str, str]] = dict


def _signal(pid: int | None, sig: int) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def inject_kill_pairctl(fp, run, st):
    run.kill()
    return f"SIGKILL pairctl pid {run.proc.pid}"


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (sshd's [priv] monitor and its user@notty child hold a session)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat[stat.rfind(")") + 2 :].split()[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def _cut_ssh(role):
    def inject(fp, run, st):
        """The host's sshd goes away with every live session under it: pairctl's connection
        drops and no new one can be made until `repair` starts sshd again."""
        sshd = fp.sshd(role)
        listener = sshd.running_pid()
        tree = descendants(listener) if listener else []
        for pid in tree:
            _signal(pid, signal.SIGKILL)
        pids = sshd.down()
        st["sshd_down"] = role
        return f"stopped {role} sshd {pids} and its sessions {tree}"

    return inject


def repair_cut_ssh(fp, st):
    if st.get("blip") is not None:
        st["blip"].cancel()
    if st.get("sshd_down"):
        fp.sshd(st["sshd_down"]).up(fp.operator_pub())


# issue 33 item 3: sshd refused for this long on one host (sessions cut), then back; shorter than
# the reconnect budget (orchestrator/remote/transport.py RECONNECT_BUDGET_S), so the run goes on
BLIP_S = 20.0
RECONNECT_S = 30.0  # the fault pairs' PAIRCTL_SSH_RECONNECT_S (FaultPair.env): above BLIP_S
# A cut host stays down until the faulted deploy has ended (repair_cut_ssh runs after it), so the
# budget sets only how long that deploy waits for it, never how it ends. It waits up to three
# times (the step's lease re-check, the rollback's stop, the stop of everything after a failed
# rollback): at 30 s that was most of a cut cell (py-spy: 198 s of 309 s in the reconnect sleep),
# so the cut cells run with the shortest budget pairctl accepts (5 s; 5 to 3600).
CUT_RECONNECT_S = 5.0


def _blip_ssh(role):
    cut = _cut_ssh(role)

    def inject(fp, run, st):
        """The host's sshd restarts (slowly): every session cut, new connections refused for
        BLIP_S, then it answers again. The model traffic between the hosts is untouched."""
        said = cut(fp, run, st)
        timer = threading.Timer(BLIP_S, lambda: fp.sshd(role).up(fp.operator_pub()))
        timer.daemon = True
        timer.start()
        st["blip"] = timer
        return f"{said}; back after {BLIP_S:g} s"

    return inject


def _kill_service(role):
    def inject(fp, run, st):
        pid = service_pid_of(fp, role)
        return f"SIGKILL {SERVICE[role]} {pid}" if _signal(pid, signal.SIGKILL) else f"no {SERVICE[role]} running"

    return inject


def inject_hang_server(fp, run, st, role="native"):
    pid = service_pid_of(fp, role)
    if _signal(pid, signal.SIGSTOP):
        st["stopped_pid"] = pid
        st["stopped_role"] = role
        what = "/props, /slots, /health hang" if role == "native" else "llama-server's graph computes hang on it"
        return f"SIGSTOP {SERVICE[role]} {pid} ({what})"
    return f"no {SERVICE[role]} running"


def inject_hang_rpc_server(fp, run, st):
    return inject_hang_server(fp, run, st, role="rpc")


def repair_hang_server(fp, st):
    _signal(st.get("stopped_pid"), signal.SIGCONT)
    # a server started by the faulted run after the SIGSTOP is not ours to continue; any we stopped is
    for f in (fp.roots[st.get("stopped_role", "native")] / "run").glob("*.pid"):
        _signal(service_pid(f), signal.SIGCONT)


def _fill_root(role):
    def inject(fp, run, st):
        return inject_fill_root(fp, run, st, role=role)

    return inject


def inject_fill_root(fp, run, st, role="native"):
    root = fp.roots[role]
    filler = root / ".faults-filler"
    free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
    st["filler"] = str(filler)
    left = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
    return f"filled {role} root ({free >> 20} MiB free -> {left >> 10} KiB)"


def repair_fill_root(fp, st):
    if st.get("filler"):
        Path(st["filler"]).unlink(missing_ok=True)


def _read_only_root(role, *, with_state=False):
    def inject(fp, run, st):
        """The host's install root becomes read-only (a remount after a disk error): every step
        that writes there fails; the message must name host and path, never "OSError: Failure".
        `with_state`: its state dir too (ROOT.state, one filesystem with the root)."""
        root = str(fp.roots[role])
        st["ro_paths"] = [root, root + ".state"][: 1 + with_state]
        # a read-only bind mount over the root: new writes there fail with EROFS (a plain remount
        # is refused while the services' logs are open for writing); the files already open keep
        # the mount beneath, as they would keep an inode on a disk remounted after an error
        for path in st["ro_paths"]:
            subprocess.run(["mount", "--bind", path, path], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True)
        return f"made {' and '.join(st['ro_paths'])} read-only (read-only bind mounts over them)"

    return inject


def repair_read_only_root(fp, st):
    for path in st.get("ro_paths", ()):  # lazily: a service started meanwhile may have its cwd under it
        subprocess.run(["umount", "-l", path], check=True)


def inject_corrupt_release(fp, run, st):
    """Flip one byte of bin/llama-server in the release being deployed (else the active one),
    by rename so a running process keeps its own copy, as a disk error or a hand edit would."""
    rel = fp.roots["native"] / "releases"
    new, cur = st["new"], st["old"]
    target = rel / new if (rel / new).is_dir() else rel / cur
    f = target / "bin" / "llama-server"
    if not f.is_file():
        return "no release to corrupt"
    data = bytearray(f.read_bytes())
    pos = len(data) // 2
    data[pos] ^= 0xFF
    tmp = f.with_name(".corrupt.tmp")
    tmp.write_bytes(bytes(data))
    os.chmod(tmp, f.stat().st_mode & 0o777)
    st["corrupted"] = (str(f), pos)
    os.replace(tmp, f)
    return f"flipped byte {pos} of {target.name}/bin/llama-server"


def repair_corrupt_release(fp, st):
    """After the operator's commands (which must have met the corrupted file): the harness puts
    the byte back so later cells start from intact releases."""
    if not st.get("corrupted"):
        return
    path, pos = st["corrupted"]
    f = Path(path)
    data = bytearray(f.read_bytes())
    data[pos] ^= 0xFF
    tmp = f.with_name(".repair.tmp")
    tmp.write_bytes(bytes(data))
    os.chmod(tmp, f.stat().st_mode & 0o777)
    os.replace(tmp, f)


def inject_break_lease(fp, run, st):
    """Another operator breaks the paused holder's lease (as a stale or expired one is broken)
    and holds the pair while the holder resumes: the holder must stop before its next change."""
    from orchestrator.hosts import leases as L
    from orchestrator.remote.local import LocalTransport

    taken = []
    for role in ROLES:
        lock = fp.roots[role] / LOCK
        if not lock.exists():
            continue
        shutil.rmtree(lock)
        t = LocalTransport(f"{fp.name}-{role}")  # the lab hosts are local: their files are the hosts'
        lease = L.take_lease(t, str(fp.roots[role]), "other@operator", "maintenance by another operator", 600)
        st.setdefault("thief", []).append((role, lease.nonce))
        taken.append(role)
    return f"broke the holder's lease and took it as another operator on {taken}" if taken else "no lease held yet"


def repair_break_lease(fp, st):
    """The other operator finishes and releases its lease (after the faulted run ended)."""
    from orchestrator.hosts import leases as L
    from orchestrator.remote.local import LocalTransport

    for role, nonce in st.get("thief", []):
        try:
            L.release_lease(LocalTransport(f"{fp.name}-{role}"), str(fp.roots[role]), nonce)
        except Exception:
            pass


# -- another operator, clocks, damaged host state (issue 21) ----------------------------------

FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
)
SKEW = "1h"


def skewed(offset: str) -> dict[str, str]:
    """The environment that gives a child process a clock `offset` off (libfaketime, Debian's
    `faketime`; `make setup` installs it). Its monotonic clock is shifted too, consistently, so
    intervals and timeouts stay real: with the monotonic clock left alone, libfaketime's
    clock_nanosleep fails every Python sleep with EINVAL."""
    lib = next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)
    if lib is None:
        raise AssertionError("libfaketime is not installed (apt-get install faketime; `make setup` does it)")
    return {"LD_PRELOAD": lib, "FAKETIME": offset, "FAKETIME_NO_CACHE": "1"}


def other_operator(fp: FaultPair, *args: str, clock: str | None = None, same_home: bool = False):
    """pairctl run by another operator in a child process: with a home of its own (its own
    evidence, the same hosts, keys and known_hosts) unless `same_home`, and a clock `clock` off."""
    if same_home:
        argv = fp.argv(*args)
        env = fp.env()
    else:
        other = fp.home.root / fp.name / "other-operator"
        inv = other / "inventory.yaml"
        if not inv.exists():
            other.mkdir(parents=True, exist_ok=True)
            data = read_yaml(fp.inventory_path)
            data["known_hosts"] = str(fp.base_inventory.known_hosts)
            for spec in data["hosts"].values():
                spec["key"] = str(fp.base_inventory.hosts[fp.base_hosts[spec["role"]]].key)
            inv.write_text(yaml.safe_dump(data, sort_keys=False))
        argv = [sys.executable, "-m", "orchestrator", "--home", str(other / "home"), "--inventory", str(inv), *args]
        env = fp.env(PAIRCTL_HOME=str(other / "home"))
    if clock:
        env.update(skewed(clock))
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)


def holder_run_id(fp: FaultPair) -> str | None:
    """The run named by the lease on the native host (ground truth: the lock directory)."""
    from orchestrator.hosts.leases import parse_lease

    f = fp.roots["native"] / LOCK / "lease.json"
    try:
        return parse_lease(f.read_text()).run_id
    except Exception:
        return None


def _try_to_break(fp, st, clock: str | None, who: str) -> str:
    """Another operator (home of its own, clock `clock` off) tries both ways of freeing a lease:
    breaking it as expired, and releasing it as a dead run's. While the holder holds a live,
    heartbeating lease both must be refused, whatever either clock says."""
    held = all(lease_held(fp.roots[r]) for r in ROLES)
    run_id = holder_run_id(fp) if held else None
    said = []
    take = other_operator(
        fp,
        "--json",
        "lease",
        "take",
        fp.name,
        "--purpose",
        f"{who} maintenance",
        "--ttl",
        "10m",
        "--break-expired",
        clock=clock,
    )
    said.append(f"lease take --break-expired: exit {take.returncode}")
    if take.returncode == 0:
        try:
            st["other_nonce"] = json.loads(take.stdout).get("nonce")
        except ValueError:
            st["other_nonce"] = None
        if held:
            st.setdefault("problems", []).append(f"{who} broke the holder's live lease (lease take --break-expired)")
    elif take.returncode != 5:
        st.setdefault("problems", []).append(
            f"{who}'s lease take exited {take.returncode}, not 0 or 5: {take.stderr.strip()[-300:]}"
        )
    if run_id and take.returncode != 0:
        rel = other_operator(fp, "--json", "lease", "release", fp.name, "--dead-run", run_id, clock=clock)
        said.append(f"lease release --dead-run {run_id}: exit {rel.returncode}")
        if rel.returncode == 0:
            st.setdefault("problems", []).append(f"{who} freed the live run's lease as a dead run's")
    return f"{who}: " + "; ".join(said) + ("" if held else " (no lease held yet)")


def inject_skew_other_ahead(fp, run, st):
    return _try_to_break(fp, st, f"+{SKEW}", f"an operator {SKEW} ahead")


def inject_skew_holder_behind(fp, run, st):
    return _try_to_break(fp, st, None, f"an operator on time (the holder is {SKEW} behind)")


def repair_other_lease(fp, st):
    """The other operator releases the lease it took (when it legitimately could)."""
    if st.get("other_nonce"):
        other_operator(fp, "--json", "lease", "release", fp.name, "--nonce", st["other_nonce"])


def inject_other_rolls_back(fp, run, st):
    """Another process of the same home rolls the pair back while the holder waits at a step:
    refused (exit 5) while the holder holds the pair; before it does, it may run, and the holder
    then decides from what it reads under its own lease."""
    held = all(lease_held(fp.roots[r]) for r in ROLES)
    p = other_operator(fp, "--json", "rollback", "--pair", fp.name, same_home=True)
    if p.returncode not in (0, 5, 6):
        st.setdefault("problems", []).append(
            f"the other operator's rollback exited {p.returncode}: {p.stderr.strip()[-300:]}"
        )
    if held and p.returncode == 0:
        st.setdefault("problems", []).append("another operator rolled the pair back while the holder held it")
    if "Traceback" in p.stderr:
        st.setdefault("problems", []).append("a traceback reached the other operator: " + p.stderr[-600:])
    return f"another operator's rollback: exit {p.returncode}" + ("" if held else " (holder had no lease yet)")


def _route_file(fp: FaultPair, role: str) -> Path:
    return fp.roots[role] / "run" / "route.json"


def inject_corrupt_route(fp, run, st):
    f = _route_file(fp, "native")
    if not f.exists():
        return "no route.json on the native host"
    f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 2)])
    return "cut the native host's route.json in half (invalid JSON)"


def inject_drop_route(fp, run, st):
    gone = [r for r in ROLES if _route_file(fp, r).exists()]
    for r in gone:
        _route_file(fp, r).unlink()
    return f"removed route.json on {gone}"


def inject_tamper_route(fp, run, st):
    """Swap the active and previous entries of the RPC host's record (its signature left as it
    was), as a hand edit or another tool would."""
    f = _route_file(fp, "rpc")
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError):
        return "no readable route.json on the rpc host"
    if not d.get("previous"):
        d["revision"] = int(d.get("revision", 0)) + 1000
        what = "revision +1000"
    else:
        d["active"], d["previous"] = d["previous"], d["active"]
        what = "active and previous swapped"
    f.write_text(json.dumps(d))
    return f"edited the rpc host's route.json ({what}, signature unchanged)"


LEASED_STEPS = frozenset({"lease", "upload", "restart-rpc", "accept"})
SWITCH_STEPS = frozenset({"upload", "restart-rpc", "switch-native", "route"})
RPC_SERVED_STEPS = frozenset({"restart-rpc", "start-server", "verify", "accept", "check:cached_continuation"})
OTHER_STEPS = frozenset({"connect", "lease", "upload", "restart-rpc", "accept"})
DAMAGE_STEPS = frozenset({"lease", "route"})
READ_ONLY_STEPS = frozenset({"upload", "stop-native", "restart-rpc", "accept"})
BLIP_STEPS = frozenset(
    {"facts", "stop-native", "restart-rpc", "switch-native", "verify", "accept", "check:cached_continuation"}
)

# A cut host at the steps before the first change ends one way (exit 4, nothing changed); since a
# reached host is waited for (the reconnect budget) each such cell costs a minute or more, so the
# matrix keeps the first connect (preflight, connect), the first reached step (lease) and the last
# one before the change (secret), and every step from the first change on.
CUT_SSH_SKIPPED = frozenset({"facts", "prepare", "upload"})


def _cut_budget() -> dict[str, str]:
    return {"PAIRCTL_SSH_RECONNECT_S": str(CUT_RECONNECT_S)}


def _cut_steps() -> frozenset[str] | None:
    from orchestrator.engine.actions import load_playbook

    return frozenset(s.name for s in load_playbook("deploy").steps) - CUT_SSH_SKIPPED | frozenset(CHECK_STEPS)


FAULTS = [
    Fault("kill-pairctl", inject_kill_pairctl, kills_pairctl=True),
    Fault("cut-ssh-rpc", _cut_ssh("rpc"), repair_cut_ssh, steps=_cut_steps(), deploy_env=_cut_budget),
    Fault("cut-ssh-native", _cut_ssh("native"), repair_cut_ssh, steps=_cut_steps(), deploy_env=_cut_budget),
    Fault("blip-ssh-rpc", _blip_ssh("rpc"), repair_cut_ssh, steps=BLIP_STEPS),
    Fault("blip-ssh-native", _blip_ssh("native"), repair_cut_ssh, steps=BLIP_STEPS),
    Fault("kill-llama-server", _kill_service("native")),
    Fault("kill-rpc-server", _kill_service("rpc")),
    Fault("hang-server", inject_hang_server, repair_hang_server),
    Fault("hang-rpc-server", inject_hang_rpc_server, repair_hang_server, steps=RPC_SERVED_STEPS),
    Fault("fill-native-root", _fill_root("native"), repair_fill_root),
    Fault("fill-rpc-root", _fill_root("rpc"), repair_fill_root, steps=SWITCH_STEPS),
    Fault("read-only-rpc-root", _read_only_root("rpc"), repair_read_only_root, steps=READ_ONLY_STEPS),
    Fault("read-only-native-root", _read_only_root("native"), repair_read_only_root, steps=READ_ONLY_STEPS),
    # issue 49: the root and its state dir on one filesystem that turns read-only (nothing on the host
    # takes a write): a pair still serving, a message naming the read-only path, never an internal error
    Fault(
        "ro-disk-native",
        _read_only_root("native", with_state=True),
        repair_read_only_root,
        steps=READ_ONLY_STEPS,
    ),
    Fault("corrupt-release", inject_corrupt_release, repair_corrupt_release),
    Fault("break-lease", inject_break_lease, repair_break_lease),
    Fault("skew-other-ahead", inject_skew_other_ahead, repair_other_lease, steps=LEASED_STEPS),
    Fault(
        "skew-holder-behind",
        inject_skew_holder_behind,
        repair_other_lease,
        steps=LEASED_STEPS,
        deploy_env=lambda: skewed(f"-{SKEW}"),
    ),
    Fault("other-rolls-back", inject_other_rolls_back, steps=OTHER_STEPS),
    Fault("corrupt-route", inject_corrupt_route, steps=DAMAGE_STEPS),
    Fault("drop-route", inject_drop_route, steps=DAMAGE_STEPS),
    Fault("tamper-route", inject_tamper_route, steps=DAMAGE_STEPS),
]
BY_NAME = {f.name: f for f in FAULTS}


# -- one cell: fault x step, then the operator's next commands, then the promise ---------------


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Cell:
    fault: str
    step: str
    injected: str = ""
    first: str = ""  # the faulted deploy: "exit N", "killed", or "exit N (step not reached)"
    first_said: str = ""  # the end of what it printed on stderr
    operator: list[str] = field(default_factory=list)  # what the operator had to do
    between: str = ""  # status after the faulted deploy (and the repair): new | prev | unverified
    recovery: str = ""  # the operator's command and its exit code
    final: str = ""  # new | previous | NEITHER
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # where the seconds went, phase by phase (status before, faulted deploy, repair, status after,
    # operator's command, final status, receipts read back), as [wall s, CPU s of pairctl's side:
    # this shard and the commands it waited for]: what to cut is measured, not guessed
    phases: dict[str, list[float]] = field(default_factory=dict)

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or the cell's start) to `phase`."""
        now = (time.monotonic(), _cpu_s())
        was = self.phases.get(phase, [0.0, 0.0])
        self.phases[phase] = [round(was[i] + now[i] - self._last[i], 2) for i in (0, 1)]
        self._last = now

    def __post_init__(self) -> None:
        self._last = (time.monotonic(), _cpu_s())

    @property
    def holds(self) -> bool:
        return not self.problems

    def text(self) -> str:
        if self.first == "n/a":
            return f"n/a ({self.recovery or 'not in the plan'})"
        mark = "ok" if self.holds else "FAIL"
        extra = (
            "+lease by hand"
            if any("by hand" in o for o in self.operator)
            else "+lease --dead-run"
            if any("--dead-run" in o for o in self.operator)
            else ""
        )
        if any(o.startswith("repair") for o in self.operator):
            extra = (extra + " +repair").strip()
        return f"{mark} {self.first}[{self.between}] -> {self.recovery}: {self.final}{(' ' + extra) if extra else ''}"


def active_package(st: dict[str, Any]) -> str | None:
    """The package the pair runs, if status says it is recorded, running, matching and healthy."""
    route = st.get("route") or {}
    pk = route.get("active_packages")
    # a finished run's lease still held is a problem of its own (status names the release; each
    # cell frees it and checks it is gone): what runs is judged without it
    problems = [p for p in st.get("problems") or [] if "--dead-run" not in p]
    if problems or not pk or pk[0] != pk[1] or st.get("health") != "ok":
        return None
    if not all(h["running"] and h["matches_manifest"] and h["current"] == pk[0] for h in st["hosts"].values()):
        return None
    return pk[0]


def status_brief(st: dict[str, Any]) -> str:
    """What status saw, in one line (for a cell's problems: why no pair counts as verified)."""
    route = st.get("route") or {}
    hosts = {
        h: {k: v.get(k) for k in ("current", "previous", "running", "matches_manifest")}
        for h, v in (st.get("hosts") or {}).items()
    }
    return f"route {route.get('state')} {route.get('active_packages')}, health {st.get('health')}, hosts {hosts}"


def establish(fp: FaultPair, pkg: str) -> None:
    """Make `pkg` the verified active pair (cell set-up; not part of what is judged)."""
    _, st = fp.status()
    if active_package(st) == pkg:
        return
    for role in ROLES:
        if lease_held(fp.roots[role]):
            shutil.rmtree(fp.roots[role] / LOCK)
    p = fp.deploy(pkg)
    if p.returncode == 6 and "pairctl repair" in p.stderr:  # a failed cell left damaged host state
        fp.cli("--json", "repair", "--pair", fp.name, "--yes")
        p = fp.deploy(pkg)
    _, st = fp.status()
    assert active_package(st) == pkg, f"could not establish {pkg}: exit {p.returncode} {p.stderr[-2000:]} {st}"


def _receipts(fp: FaultPair) -> dict[str, dict[str, Any]]:
    from orchestrator.evidence.store import EvidenceStore

    return {r["hash"]: r for r in EvidenceStore(fp.home.evidence).summaries(pair=fp.name)}


def _accepted_since(fp: FaultPair, before: dict[str, Any], after: dict[str, dict[str, Any]], pkg: str) -> bool:
    """A deploy receipt written since the cell began (the faulted deploy or the operator's) that
    passed with its acceptance suite passed: "new" means accepted after the fault."""
    from orchestrator.evidence.store import EvidenceStore

    store = EvidenceStore(fp.home.evidence)
    for h, r in after.items():
        if h in before or r["command"] != "deploy" or r["outcome"] != "passed":
            continue
        rec = store.load(h)
        if rec.inputs.get("package:native") != pkg:
            continue
        if any(s.name == "accept" and s.outcome == "passed" and s.data.get("passed") is True for s in rec.steps):
            return True
    return False


def _serving(fp: FaultPair) -> bool:
    inv = read_yaml(fp.inventory_path)
    pair = inv["pairs"][fp.name]
    url = f"http://{inv['hosts'][pair['native']]['address']}:{pair['server_port']}/health"
    try:
        return httpx.get(url, timeout=5.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def run_cell(fp: FaultPair, fault: Fault, step: str, work: Path, *, operator: str = "deploy") -> Cell:
    """One cell. `operator`: what the operator runs after `status` — the same `deploy` again, or
    `rollback` (falling back to the deploy when the rollback leaves no verified pair, e.g. when
    the route record names no previous pair yet)."""
    t0 = time.monotonic()
    cell = Cell(fault.name, step)
    seen, fp.last_seen = fp.last_seen, None
    st0 = seen[0] if seen else fp.status()[1]
    old = active_package(st0)
    if old not in fp.packages:  # a failed cell must not fail the next one
        establish(fp, fp.packages[0])
        old, seen = fp.packages[0], None
    new = fp.packages[1] if old == fp.packages[0] else fp.packages[0]
    before = seen[1] if seen else _receipts(fp)
    state: dict[str, Any] = {"old": old, "new": new}
    cell.lap("status before")

    # 1. the faulted deploy
    run = start_deploy_paused(fp, new, step, work / "marker", extra_env=fault.deploy_env())
    fp.in_flight = run
    if not run.paused:
        rc, _, err = run.wait()
        cell.first = f"exit {rc} (step not reached)"
        cell.problems.append(f"step {step} was never reached (exit {rc}): {err[-500:]}")
    else:
        cell.lap("deploy to the step")
        cell.injected = fault.inject(fp, run, state)
        cell.lap("inject")
        cell.problems += state.pop("problems", [])
        if not fault.kills_pairctl:
            run.resume()
        try:
            rc, _, err = run.wait()
        except subprocess.TimeoutExpired:
            run.kill()
            rc, _, err = run.wait()
            cell.problems.append(f"the faulted deploy hung past {RUN_TIMEOUT_S}s")
        cell.first = "killed" if rc == -signal.SIGKILL else f"exit {rc}"
        cell.first_said = err.strip()[-600:]
        state["first_err"] = err
        documented = DEPLOY_EXITS | ({RELEASE_FAILED_EXIT} if step == "release-lease" else set())
        if rc not in documented and rc != -signal.SIGKILL:
            cell.problems.append(
                f"the faulted deploy exited {rc}, not one of deploy's documented outcomes "
                f"{sorted(documented)}: {err.strip()[-300:]}"
            )
        if "Traceback" in err:
            cell.problems.append("a traceback reached the user: " + err[-800:])
    cell.lap("deploy after the fault")
    # issue 49 item 1: a read-only root ends with a pair serving (the previous one, or what ran when
    # the rollback was refused before any change), seen while the root is still read-only
    if fault.name.startswith(("read-only-", "ro-disk-")) and cell.first != "exit 0" and not _serving(fp):
        cell.problems.append(f"a read-only root left the pair down (/health not 200 after {cell.first})")
    ro_said = state.get("first_err", "")
    if fault.name.startswith("ro-disk-") and cell.first != "exit 0":
        if not any(p in ro_said for p in state.get("ro_paths", ())) or "internal error" in ro_said:
            cell.problems.append(
                f"a read-only disk must be named by its path, never an internal error: {ro_said[-300:]}"
            )
    fault.repair(fp, state) if fault.name != "corrupt-release" else None
    cell.lap("repair")

    # 2. the operator: status first
    rc_s, st1 = fp.status()
    cell.lap("status after")
    mid = active_package(st1)
    cell.between = "new" if mid == new else "prev" if mid == old else "unverified"
    if (
        fault.name.startswith("cut-ssh-")
        and step in HOST_LOSS_REFUSED
        and (cell.first, cell.between) != ("exit 4", "prev")
    ):
        cell.problems.append(
            f"a host lost before the first change must be refused with nothing changed "
            f"(exit 4, previous pair serving); got {cell.first}[{cell.between}]"
        )
    if fault.name.startswith("read-only-") and "Failure" in cell.first_said and "OSError" in cell.first_said:
        cell.problems.append("a read-only root was reported as a bare OSError: Failure")
    # issue 49 item 1: after the upload nothing a deploy or rollback writes is in the root (links,
    # route record, leases, pidfiles and logs live in run/, the state_dir beside it: hosts/layout.py),
    # so a root that turns read-only then neither stops nor breaks the deploy: the new pair, accepted,
    # its leases freed. It ended refused (stop-native), rolled back (restart-rpc), or exit 8 with the
    # new pair or none serving and the lease held on the read-only root (accept)
    if fault.name.startswith("read-only-") and step != "upload" and (cell.first, cell.between) != ("exit 0", "new"):
        cell.problems.append(
            f"a root read-only after the upload must not stop the deploy (nothing after it writes there): "
            f"exit 0, the new pair; got {cell.first}[{cell.between}]: {cell.first_said[-300:]}"
        )
    # at the upload: refused with nothing changed, naming the path (exit 6), or, where the release and
    # the secrets are there already (nothing to write), deployed
    if (
        fault.name.startswith("read-only-")
        and step == "upload"
        and (cell.first, cell.between) not in (("exit 6", "prev"), ("exit 0", "new"))
    ):
        cell.problems.append(
            f"a root read-only at the upload must be refused with nothing changed (exit 6, previous pair "
            f"serving, a message naming the path); got {cell.first}[{cell.between}]: {cell.first_said[-300:]}"
        )
    # issue 33 item 9: the RPC root's disk full at the switch. It ended rolled back (exit 7): the switch
    # wrote the links and route record there. They live in run/ now (the state_dir, on the disk beside
    # this root's own filesystem), so the deploy no longer writes the full root after the upload
    if fault.name == "fill-rpc-root" and step != "upload" and (cell.first, cell.between) != ("exit 0", "new"):
        cell.problems.append(
            f"the RPC root full at {step}, after the upload, must not stop the deploy (nothing after it writes "
            f"there): exit 0, the new pair; got {cell.first}[{cell.between}]"
        )
    # a failed rollback says what is down, or (a read-only root it must write, seen before its first
    # change: issue 49) that it changed nothing, so what ran keeps serving
    said_8 = state.get("first_err", "")
    if (
        fault.name.startswith("read-only-")
        and cell.first == "exit 8"
        and not ("Now down" in said_8 or "changed nothing" in said_8)
    ):
        cell.problems.append(
            "a failed rollback must say, host by host, what is down and why: " + cell.first_said[-300:]
        )
    if fault.name.startswith("blip-ssh-") and (cell.first, cell.between) != ("exit 0", "new"):
        cell.problems.append(
            f"an SSH outage of {BLIP_S:g} s must not fail the deploy (it reconnects); got {cell.first}[{cell.between}]"
        )
    for role in ROLES:
        host = f"{fp.name}-{role}"
        if lease_held(fp.roots[role]) and not st1["hosts"][host]["leases"]:
            cell.problems.append(f"{host}: a lease is held on the host but status does not report it")
    if cell.first == "killed" and not (
        st1.get("aborted_runs_sealed")
        or any(r["outcome"] == "aborted" for h, r in _receipts(fp).items() if h not in before)
    ):
        cell.problems.append("the killed run was not sealed as an aborted receipt by status")
    held = [r for r in ROLES if lease_held(fp.roots[r])]
    if held and fault.name.startswith("ro-disk-") and not ("lease release" in ro_said or "frees it then" in ro_said):
        cell.problems.append(f"a lease left on a read-only disk names no command that frees it: {ro_said[-300:]}")
    if held and fault.name.startswith("read-only-") and step != "upload":
        cell.problems.append(f"a root read-only after the upload left the lease held on {held}")
    # issue 49: a lease a read-only root refused to give back is freed by the home's next deploy
    # or rollback (checked at the end: none held), never by hand; a failed rollback (exit 8) keeps
    # its leases on purpose, as everywhere
    if held and fault.name.startswith("read-only-") and cell.first != "exit 8":
        if "frees it then" not in state.get("first_err", ""):
            cell.problems.append(
                f"a lease left on a read-only root is not said to be freed later: {cell.first_said[-300:]}"
            )
    elif held:
        why = "killed run" if cell.first == "killed" else f"run that ended with {cell.first}"
        release_dead_run_leases(fp, cell, st1, why)

    fp.in_flight = None
    # damaged host state (links and record disagree after a kill between switch and route) is
    # refused by deploy and rollback (exit 6) naming `pairctl repair`: the operator does as told
    if any("pairctl repair" in p_ for p_ in st1.get("problems") or []):
        if fault.name in ("kill-pairctl", "fill-rpc-root"):  # issue 33 items 5, 9: no repair in the recovery
            cell.problems.append(
                "the documented recovery is freeing the leases and then rollback or deploy (README), "
                f"but status asks for repair: {st1.get('problems')}"
            )
        rp = fp.cli("--json", "repair", "--pair", fp.name, "--yes")
        cell.operator.append(f"repair --yes (exit {rp.returncode})")
        if rp.returncode != 0:
            cell.problems.append(f"repair --yes exited {rp.returncode}: {rp.stderr[-400:]}")
    cell.lap("leases, repair")
    # 3. the operator's next command
    if operator == "rollback":
        p = fp.cli("--json", "rollback", "--pair", fp.name)
        cell.recovery = f"rollback {p.returncode}"
        # a pair deployed once has nothing to roll back to: refused (6, host state), nothing changed,
        # and the operator deploys instead (below)
        if p.returncode not in DEPLOY_EXITS:
            cell.problems.append(f"the operator's rollback exited {p.returncode}: {p.stderr.strip()[-500:]}")
        if p.returncode != 0 and active_package(fp.status()[1]) is None:
            cell.operator.append(f"rollback exited {p.returncode} and left no verified pair; deployed again")
            if any(lease_held(fp.roots[r]) for r in ROLES):  # a failed rollback keeps the leases by design
                release_dead_run_leases(fp, cell, fp.status()[1], "failed rollback")
            p2 = fp.deploy(new)
            cell.recovery += f", deploy {p2.returncode}"
            p = subprocess.CompletedProcess(p.args, p2.returncode, p2.stdout, p.stderr + p2.stderr)
    else:
        p = fp.deploy(new)
        cell.recovery = f"deploy {p.returncode}"
        if p.returncode not in DEPLOY_EXITS:
            cell.problems.append(f"the operator's deploy exited {p.returncode}: {p.stderr.strip()[-500:]}")
    if "Traceback" in p.stderr:
        cell.problems.append("a traceback reached the user: " + p.stderr[-800:])
    if fault.name == "corrupt-release":
        fault.repair(fp, state)

    cell.lap("operator's command")
    # 4. the promise
    _, st2 = fp.status()
    cell.lap("status final")
    act = active_package(st2)
    cell.final = "new" if act == new else "previous" if act == old else "NEITHER"
    if act not in (new, old):
        cell.problems.append(
            f"pair is neither new-and-verified nor previous-and-verified: {st2.get('problems')} {status_brief(st2)}"
        )
    if operator == "deploy" and p.returncode == 0 and act != new:
        cell.problems.append("deploy exited 0 but the new pair is not the verified active one")
    # "new" counts only when a deploy accepted it after the fault; a passed rollback that restored
    # it put back the record's previous pair (accepted when it was deployed, and verified now)
    restored = operator == "rollback" and cell.recovery == "rollback 0"
    after = _receipts(fp)
    if act == new and not restored and not _accepted_since(fp, before, after, new):
        cell.problems.append("the new pair is active but no deploy accepted it after the fault")
        cell.final = "new UNACCEPTED"
    for role in ROLES:
        host = f"{fp.name}-{role}"
        if st2["hosts"][host]["leases"] or lease_held(fp.roots[role]):
            cell.problems.append(f"{host}: lease still held after the operator's deploy")
        ours, known = processes_under(fp.roots[role]), pidfile_pids(fp.roots[role])
        if ours != known:
            cell.problems.append(f"{host}: processes under the root {sorted(ours)} != pidfiles {sorted(known)}")
    new_receipts = [r for h, r in after.items() if h not in before]
    for r in new_receipts:  # each new receipt read back and checked against its hash (the whole
        shown = fp.cli("receipts", "show", r["hash"])  # store's chains are verified after the matrix)
        if shown.returncode != 0:
            cell.problems.append(f"receipt {r['hash'][:12]} does not verify: {shown.stderr[-400:]}")
    runs = [r for r in new_receipts if r["command"] in ("deploy", "rollback")]
    if not any(r["command"] == "deploy" for r in runs) or len(runs) < 2:
        cell.problems.append(
            f"expected receipts for both runs, found {[(r['command'], r['outcome']) for r in new_receipts]}"
        )
    cell.lap("checks, receipts")
    cell.seconds = time.monotonic() - t0
    if cell.holds:
        fp.last_seen = (st2, after)
    return cell


def render_matrix(cells: list[Cell], faults: list[str], steps: list[str]) -> str:
    """One block per fault: the steps it was injected at, each cell's outcome on its own line,
    then the steps it is not meant for (a table of every fault over every step was mostly n/a)."""
    by = {(c.fault, c.step): c for c in cells}
    w0 = max(len(s) for s in steps)
    lines: list[str] = []
    for f in faults:
        ran = [s for s in steps if (f, s) in by and by[(f, s)].first != "n/a"]
        lines.append(f"{f} ({len(ran)} of {len(steps)} steps)")
        lines += [f"  {s.ljust(w0)}  {by[(f, s)].text()}" for s in ran]
        skipped: dict[str, list[str]] = {}
        for s in steps:
            if s not in ran:
                why = by[(f, s)].text() if (f, s) in by else "n/a (no cell)"
                skipped.setdefault(why, []).append(s)
        lines += [f"  {why}: {', '.join(names)}" for why, names in skipped.items()]
        lines.append("")
    return "\n".join(lines).rstrip("\n")
