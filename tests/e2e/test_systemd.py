"""`service_manager: systemd` on the lab, under a real systemd: root's user manager.

The lab has no systemd as PID 1, but systemd's user manager (`systemd --user`, the same binary
and unit semantics as on a host) runs here once it has what a login would give it: a delegated
cgroup, /run/user/0, and `/run/systemd/system` (its "booted with systemd" test) in a private
mount namespace, so nothing else on this machine sees a systemd. The lab's sshd logs in as
root, so pairctl's `systemctl --user` calls over SSH reach that manager through
/run/user/0/systemd/private, as they would reach a lingering user's manager on a real host.

Proven here: deploy verifies, installs, enables, starts and reads back both units; systemd
restarts a killed supervisor and the pair comes back with the same identity; a stopped and
restarted manager (a reboot of everything systemd runs) brings the pair back by itself; a
deliberate stop disables and removes the unit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.config.inventory import Supervision, load_inventory
from orchestrator.engine.plan import pair_view
from orchestrator.hosts import boot
from orchestrator.hosts.layout import GUARD, LLAMA_SERVER, RPC_SERVER, HostLayout, svc_script
from orchestrator.hosts.rpc_guard import guard_bytes
from orchestrator.hosts.units import render_unit, supervise_argv
from orchestrator.remote.pool import open_transport
from tests.plugins.cli import run_cli
from tests.plugins.pairs import PROFILE, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

PAIR = "sd"
SERVER_PORT, RPC_PORT = 8097, 50067  # the lab hosts' addresses, ports no other suite uses
SERVICE = {"native": LLAMA_SERVER, "rpc": RPC_SERVER}
RUNTIME = Path("/run/user/0")
UNIT_DIR = Path("/root/.config/systemd/user")
LINGER = Path("/var/lib/systemd/linger/root")
CGROUPS = ("unified", "systemd")  # cgroup2 and the name=systemd v1 hierarchy of this machine's hybrid layout
CGROUP = "pairctl-test-user0"
BACK_WITHIN_S = 90.0

MANAGER = r"""
set -e
mount -t tmpfs tmpfs /run/systemd
mkdir -p /run/systemd/system
for h in "$@"; do d=/sys/fs/cgroup/$h/pairctl-test-user0; mkdir -p "$d"; echo $$ >"$d/cgroup.procs"; done
exec env -i HOME=/root USER=root LOGNAME=root XDG_RUNTIME_DIR=/run/user/0 PATH=/usr/local/bin:/usr/bin:/bin \
    /lib/systemd/systemd --user
"""


def _systemctl(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(RUNTIME)}
    return subprocess.run(
        ["systemctl", "--user", *args], env=env, capture_output=True, text=True, timeout=60, check=check
    )


def _cgroup_pids() -> list[int]:
    pids: list[int] = []
    for h in CGROUPS:
        f = Path("/sys/fs/cgroup", h, CGROUP, "cgroup.procs")
        if f.exists():
            pids += [int(x) for x in f.read_text().split()]
        for sub in Path("/sys/fs/cgroup", h, CGROUP).rglob("cgroup.procs") if f.exists() else ():
            pids += [int(x) for x in sub.read_text().split()]
    return sorted(set(pids))


class Manager:
    """Root's systemd user manager, started in its own mount namespace and cgroup."""

    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        RUNTIME.mkdir(parents=True, exist_ok=True)
        RUNTIME.chmod(0o700)
        cg = [h for h in CGROUPS if Path("/sys/fs/cgroup", h).is_dir()]
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", MANAGER, "_", *cg],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until("the user manager answers", lambda: _systemctl("show", "-p", "Version").returncode == 0, 20)

    def power_off(self) -> None:
        """Everything the manager runs and the manager itself SIGKILLed at once, as a power loss."""
        for pid in _cgroup_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait(timeout=20)
        wait_until("the manager's cgroup is empty", lambda: not _cgroup_pids(), 20)
        for sock in ("systemd/private", "systemd/notify"):
            (RUNTIME / sock).unlink(missing_ok=True)


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (the lab's sshd logs in as root)"
    for tool in (
        "/lib/systemd/systemd",
        shutil.which("systemctl"),
        shutil.which("systemd-analyze"),
        shutil.which("unshare"),
    ):
        if not tool or not Path(tool).exists():
            return f"{tool or 'systemctl/systemd-analyze/unshare'} is not installed"
    if Path("/run/systemd/system").is_dir():
        return "this machine runs systemd itself; the test would start a second root user manager"
    return None


@pytest.fixture(scope="module")
def manager() -> Iterator[Manager]:
    why = _usable()
    if why:
        pytest.skip(why)
    m = Manager()
    if _systemctl("show", "-p", "Version").returncode != 0:
        m.power_off()  # a manager of an aborted session would still hold the socket
        m.start()
    yield m
    for f in UNIT_DIR.glob(f"pairctl-{PAIR}-*.service"):
        _systemctl("disable", "--now", f.name)
        f.unlink(missing_ok=True)
    m.power_off()
    LINGER.unlink(missing_ok=True)


# the lab hosts' addresses (the lab inventory's; the pair fixture reads them)
ADDRESS = {"native": "127.0.0.2", "rpc": "127.0.0.3"}
SERVICE_USER = "nobody"  # the servers drop to it (service_user); uid 65534 on Debian


def _inventory(src: Path, dest: Path, home: str) -> str:
    inv = yaml.safe_load(src.read_text())
    lab = inv["pairs"]["lab"]
    for name in ("lab-native", "lab-rpc"):
        h = inv["hosts"][name]
        h["install_root"] = h["install_root"].rsplit("/", 1)[0] + "/sd-root"
        h["service_manager"] = "systemd"
        h["systemd_scope"] = "user"
        h["service_user"] = SERVICE_USER
    # the lab's tiny models are root's 0600 files: the service user reads copies of them
    models = Path(home, "lab", "hosts", "sd-models")
    models.mkdir(parents=True, exist_ok=True)
    models.chmod(0o755)
    lab = {**lab, "models": dict(lab["models"])}
    for role, ref in lab["models"].items():
        src_model = Path(ref["path"].replace("${PAIRCTL_HOME}", home))
        if src_model.stat().st_mode & 0o004:
            continue  # readable by others already (the real model)
        copy = models / src_model.name
        if not copy.exists() or copy.stat().st_size != src_model.stat().st_size:
            shutil.copyfile(src_model, copy)
        copy.chmod(0o644)
        lab["models"][role] = {"path": str(copy)}
    inv["pairs"] = {PAIR: {**lab, "server_port": SERVER_PORT, "rpc_port": RPC_PORT}}
    dest.write_text(yaml.safe_dump(inv, sort_keys=False))
    return str(dest)


@pytest.fixture(scope="module")
def pair(manager, lab, lab_packages, tmp_path_factory) -> Iterator[dict[str, Any]]:
    home = str(lab.home.root)
    inv = _inventory(lab.inventory_path, tmp_path_factory.mktemp("sd") / "inventory.yaml", home)

    def cli(*args: str) -> Any:
        return run_cli(["--home", home, "--inventory", inv, *args])

    spec = yaml.safe_load(Path(inv).read_text())
    ADDRESS.update({role: spec["hosts"][f"lab-{role}"]["address"] for role in SERVICE})
    roots = {role: spec["hosts"][f"lab-{role}"]["install_root"].replace("${PAIRCTL_HOME}", home) for role in SERVICE}
    _clean(lab, roots)  # the roots are this module's own: each run starts from nothing
    pid = lab_packages.id
    deploy = ("--json", "deploy", "--pair", PAIR, "--packages", pid, pid, "--profile", PROFILE, "--skip-accept")
    # a user manager that does not linger ends with the user's last session (pairctl's own SSH
    # session included): the deploy is refused before any change, naming the fix
    LINGER.unlink(missing_ok=True)
    r = cli(*deploy)
    assert r.exit_code == 6 and "does not linger" in r.stderr and "loginctl enable-linger root" in r.stderr, r.stderr
    assert not any(
        Path(root, "run", "current").exists() or Path(root, "run", "route.json").exists() for root in roots.values()
    )
    LINGER.parent.mkdir(parents=True, exist_ok=True)
    LINGER.touch()
    # a service user the host lacks, or one that cannot read a model, is refused before any change
    bad = Path(inv).with_name("no-user.yaml")
    bad.write_text(Path(inv).read_text().replace(f"service_user: {SERVICE_USER}", "service_user: pairctl-no-such-user"))
    r = run_cli(["--home", home, "--inventory", str(bad), *deploy])
    assert r.exit_code == 6 and "service_user pairctl-no-such-user does not exist" in r.stderr, r.stderr[-2000:]
    unreadable = Path(inv).with_name("unreadable.yaml")
    unreadable.write_text(
        Path(inv).read_text().replace(str(Path(home, "lab", "hosts", "sd-models")), f"{home}/lab/models")
    )
    r = run_cli(["--home", home, "--inventory", str(unreadable), *deploy])
    assert r.exit_code == 6 and f"service_user {SERVICE_USER} cannot read {home}/lab/models/" in r.stderr, r.stderr[
        -2000:
    ]
    assert not any(
        Path(root, "run", "current").exists() or Path(root, "run", "route.json").exists() for root in roots.values()
    )
    r = cli(*deploy)
    assert r.exit_code == 0, r.stderr[-3000:] + r.stdout[-2000:]
    view = pair_view(load_inventory(inv, {"PAIRCTL_HOME": home}), PAIR)
    units = {role: view.layouts[role].manager.unit(SERVICE[role]) for role in SERVICE}  # type: ignore[attr-defined]
    yield {
        "cli": cli,
        "roots": roots,
        "lab": lab,
        "package": pid,
        "layouts": view.layouts,
        "inventory": inv,
        "units": units,
    }
    _clean(lab, roots)


def _clean(lab: Any, roots: dict[str, str]) -> None:
    """Both services stopped through pairctl-svc (their units disabled and removed), the roots and
    their default state dirs (`ROOT.state`, where run/ points) gone: a state dir left behind would name
    a release the next run's fresh root lacks, and its first deploy would rightly refuse."""
    for role, root in roots.items():
        if Path(root, "bin", "pairctl-svc").exists():
            t = open_transport(lab.inventory, "lab-native" if role == "native" else "lab-rpc")
            try:
                t.run(HostLayout(root).stop_cmd(SERVICE[role]), check=False, timeout=120)
            finally:
                t.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root + ".state", ignore_errors=True)


def _identity(root: str, name: str) -> tuple[int, str, bytes] | None:
    try:
        pid = int(Path(root, "run", f"{name}.pid").read_text().split()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        exe = hashlib.sha256(Path(f"/proc/{pid}/exe").read_bytes()).hexdigest()
    except (OSError, ValueError, IndexError):
        return None
    return (pid, exe, argv) if argv.split(b"\0", 1)[0].endswith(b"/" + name.encode()) else None


def _crontab() -> str:
    """root's crontab: the lab's sshd logs in as root, so the hosts' crontab is this one."""
    return subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30, check=False).stdout


def _main_pid(unit: str) -> int:
    return int(_systemctl("show", "-p", "MainPID", "--value", unit, check=True).stdout.strip() or 0)


def _healthy() -> bool:
    try:
        url = f"http://{ADDRESS['native']}:{SERVER_PORT}/health"
        return httpx.get(url, timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _status(pair: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = pair["cli"]("--json", "status", "--pair", PAIR)
    return r.exit_code, json.loads(r.stdout)


def _accept_identity(pair: dict[str, Any]) -> None:
    r = pair["cli"]("--json", "accept", "--pair", PAIR, "--only", "identity")
    assert r.exit_code == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_deploy_installs_verifies_enables_and_reads_back_both_units(pair):
    for role, root in pair["roots"].items():
        unit = pair["units"][role]
        text = (UNIT_DIR / unit).read_text()
        assert _systemctl("is-enabled", unit).stdout.strip() == "enabled"
        assert _systemctl("is-active", unit).stdout.strip() == "active"
        ident = _identity(root, SERVICE[role])
        assert ident is not None
        # the unit runs the supervisor, whose words end with the exact argv the service runs with
        sup = Path(f"/proc/{_main_pid(unit)}/cmdline").read_bytes().split(b"\0")[:-1]
        argv = ident[2].split(b"\0")[:-1]
        assert sup[2:5] == [b"supervise", root.encode(), SERVICE[role].encode()] and sup[-len(argv) :] == argv
        assert "Restart=on-failure" in text and "StartLimitBurst=" in text
        assert not Path(root, "run", f"{SERVICE[role]}.boot").exists()  # systemd, not the @reboot line, starts it
    # deployed once (fresh roots): a rollback has nothing to go back to, says so (host state,
    # exit 6) and changes nothing
    before = {role: _identity(root, SERVICE[role]) for role, root in pair["roots"].items()}
    r = pair["cli"]("--json", "rollback", "--pair", PAIR)
    assert r.exit_code == 6 and "names no previous pair" in r.stderr, r.stderr[-2000:]
    assert {role: _identity(root, SERVICE[role]) for role, root in pair["roots"].items()} == before
    code, st = _status(pair)
    assert code == 0 and st["warnings"] == [], (st["problems"], st["warnings"])
    for h in st["hosts"].values():
        assert h["boot"]["persistence"] == "systemd" and h["boot"]["starts_at_boot"] is True, h["boot"]
    _accept_identity(pair)


def _proc_status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def test_the_servers_run_hardened_and_as_the_service_user(pair):
    """Issue 32 #14: the units carry the hardening a user manager applies (no_new_privs, seccomp
    filters: address families, namespaces, syscall groups) and the supervisors drop both servers
    to the inventory's service_user; the pair still serves and passes identity with all of it."""
    uid = int(subprocess.run(["id", "-u", SERVICE_USER], capture_output=True, text=True, check=True).stdout)
    for role, root in pair["roots"].items():
        unit = pair["units"][role]
        text = (UNIT_DIR / unit).read_text()
        for line in ("NoNewPrivileges=yes", "RestrictNamespaces=yes", "SystemCallFilter=~@clock", "UMask=0077"):
            assert line in text, (line, text)
        assert "ProtectSystem=" not in text  # the system manager's set; a user manager without namespaces lacks it
        ident = _identity(root, SERVICE[role])
        assert ident is not None
        st = _proc_status(ident[0])
        assert st["Uid"].split()[:2] == [str(uid), str(uid)], st["Uid"]  # real and effective: the service user
        assert st["NoNewPrivs"].strip() == "1" and st["Seccomp"].strip() == "2", (st["NoNewPrivs"], st["Seccomp"])
        assert st["CapEff"].strip() == "0" * 16, st["CapEff"]
        sup = _proc_status(_main_pid(unit))
        assert sup["Uid"].split()[0] == "0" and sup["NoNewPrivs"].strip() == "1"  # the supervisor drops it
        home = Path(root, "run", "home", SERVICE[role])
        assert home.stat().st_uid == uid and Path(root, "run").stat().st_uid == 0
    log = Path(pair["roots"]["native"], "run", f"{LLAMA_SERVER}.log")
    assert log.stat().st_uid == uid and log.stat().st_size > 0  # llama-server opened its own --log-file
    assert _healthy()
    _accept_identity(pair)


def test_systemd_restarts_a_killed_supervisor_and_the_pair_comes_back(pair):
    root = pair["roots"]["native"]
    unit = pair["units"]["native"]
    before = _identity(root, LLAMA_SERVER)
    sup = _main_pid(unit)
    assert before is not None and sup > 0
    os.kill(sup, signal.SIGKILL)  # the supervisor: systemd stops its cgroup and starts the unit again
    took = wait_until(
        "llama-server healthy again under a new supervisor",
        lambda: _healthy() and _main_pid(unit) not in (0, sup),
        BACK_WITHIN_S,
    )
    print(f"supervisor SIGKILLed -> healthy again in {took:.2f} s")
    after = _identity(root, LLAMA_SERVER)
    assert after is not None and after[0] != before[0] and after[1:] == before[1:]
    assert int(_systemctl("show", "-p", "NRestarts", "--value", unit).stdout.strip()) >= 1
    _accept_identity(pair)


def test_a_unit_the_host_rejects_stops_nothing(pair):
    """The host's systemd-analyze verify runs before the stop: a staged unit it rejects (here
    one edited on the host after pairctl put it there) fails the step, and the pair keeps running."""
    root = pair["roots"]["rpc"]
    layout = HostLayout(root, pair["layouts"]["rpc"].manager)
    before = _identity(root, RPC_SERVER)
    assert before is not None
    staged = Path(layout.manager.staged_unit(layout, RPC_SERVER))
    staged.write_text(staged.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    argv = before[2].decode().split("\0")[:-1]
    cmd = layout.restart_cmd(RPC_SERVER, None, None, ADDRESS["rpc"], RPC_PORT, 10, argv)
    t = open_transport(pair["lab"].inventory, "lab-rpc")
    try:
        res = t.run(cmd, check=False, timeout=120)
    finally:
        t.close()
    assert res.exit_status == 3 and "unit=invalid" in str(res.stderr), (res.stdout, res.stderr)
    assert "unit_verify=" in str(res.stdout) and "restart specifier" in str(res.stdout)
    assert _identity(root, RPC_SERVER) == before  # nothing was stopped
    assert _systemctl("is-active", pair["units"]["rpc"]).stdout.strip() == "active"
    _accept_identity(pair)


def test_a_failed_deploy_rolls_back_to_the_previous_units(pair):
    """A candidate whose llama-server cannot load fails after activation began: the rollback
    installs, starts and reads back the previous pair's units, and the pair is accepted."""
    before = {role: _identity(root, SERVICE[role]) for role, root in pair["roots"].items()}
    pid = pair["package"]
    r = pair["cli"]("--json", "deploy", "--pair", PAIR, "--packages", pid, pid, "--profile", "lab-unloadable")
    assert r.exit_code == 7, r.stderr[-3000:]
    for role, root in pair["roots"].items():
        unit = pair["units"][role]
        assert _systemctl("is-enabled", unit).stdout.strip() == "enabled"
        assert _systemctl("is-active", unit).stdout.strip() == "active"
        after = _identity(root, SERVICE[role])
        assert after is not None and before[role] is not None and after[1:] == before[role][1:], role
        sup = Path(f"/proc/{_main_pid(unit)}/cmdline").read_bytes().split(b"\0")[:-1]
        assert sup[-len(after[2].split(b"\0")[:-1]) :] == after[2].split(b"\0")[:-1]
    assert _status(pair)[0] == 0
    _accept_identity(pair)


def test_switching_a_host_between_managers_leaves_one_supervisor(pair, tmp_path):
    """The inventory is the truth: a deploy after `service_manager: pairctl` removes the units
    and starts setsid supervisors with @reboot lines; back to systemd, the units return."""
    plain = Path(pair["inventory"]).read_text().replace("service_manager: systemd", "service_manager: pairctl")
    (tmp_path / "plain.yaml").write_text(plain)
    pid = pair["package"]
    deploy = ("--json", "deploy", "--pair", PAIR, "--packages", pid, pid, "--profile", PROFILE, "--skip-accept")
    r = run_cli(["--home", str(pair["lab"].home.root), "--inventory", str(tmp_path / "plain.yaml"), *deploy])
    assert r.exit_code == 0, r.stderr[-3000:]
    for role, root in pair["roots"].items():
        unit = pair["units"][role]
        assert not (UNIT_DIR / unit).exists() and _systemctl("is-active", unit).stdout.strip() != "active"
        assert (
            Path(root, "run", f"{SERVICE[role]}.boot").exists()
            and not Path(root, "run", f"{SERVICE[role]}.unit").exists()
        )
        sup = int(Path(root, "run", f"{SERVICE[role]}.sup.pid").read_text())
        assert CGROUP not in Path(f"/proc/{sup}/cgroup").read_text()  # not under the manager
        assert boot.marker(root) in _crontab()
    assert _healthy()
    r = pair["cli"](*deploy)
    assert r.exit_code == 0, r.stderr[-3000:]
    for role, root in pair["roots"].items():
        unit = pair["units"][role]
        assert _systemctl("is-active", unit).stdout.strip() == "active"
        assert not Path(root, "run", f"{SERVICE[role]}.boot").exists()
        sup = int(Path(root, "run", f"{SERVICE[role]}.sup.pid").read_text())
        assert sup == _main_pid(unit)
        assert boot.marker(root) not in _crontab()  # the @reboot line went with the setsid supervisor
    _accept_identity(pair)


def test_systemd_gives_the_service_the_exact_argv_of_any_argument(manager, tmp_path):
    """The quoting, proven by systemd itself: a unit pairctl renders runs a command that writes
    one argument's bytes to a file; line breaks, tabs, an escape, `$`, `%`, quotes, a backslash
    and non-ASCII come back exactly."""
    arg = 'line one\nline two\t$HOME %h "q" \\x \x1b[0m é'
    (tmp_path / "run").mkdir()
    out = tmp_path / "argv.bin"
    unit = "pairctl-quote-probe-00000000.service"
    text = render_unit(
        pair="quote",
        service="probe",
        exec_argv=["/bin/sh", "-c", 'printf "%s" "$1" > "$2"', "_", arg, str(out)],
        root=str(tmp_path),
        supervision=Supervision(),
        user=True,
    )
    UNIT_DIR.mkdir(parents=True, exist_ok=True)
    (UNIT_DIR / unit).write_text(text)
    try:
        _systemctl("daemon-reload", check=True)
        _systemctl("start", unit, check=True)
        wait_until("the probe unit wrote its argument", out.exists, 20)
        time.sleep(0.2)
        assert out.read_bytes() == arg.encode()
    finally:
        _systemctl("stop", unit)
        (UNIT_DIR / unit).unlink(missing_ok=True)
        _systemctl("daemon-reload")


def test_the_system_managers_sandbox_runs_a_real_server(pair, manager, lab_packages):
    """The system scope's unit (ProtectSystem=strict, ReadWritePaths=ROOT/run, PrivateTmp,
    PrivateMounts, the kernel protections, a capability bound) is only rendered and verified by
    deploy here; root's user manager can apply all of it, so one real ggml-rpc-server runs under
    exactly that unit text: its supervisor drops it to the service user, the OS and the install
    root outside run/ are read-only to it, and it serves the guard's peer."""
    root = Path(pair["lab"].home.root, "lab", "hosts", "sd-system-root")
    shutil.rmtree(root, ignore_errors=True)
    rel = root / "releases" / "pkg" / "bin"
    rel.mkdir(parents=True)
    (root / "run").mkdir()
    shutil.copy2(lab_packages.path / "bin" / RPC_SERVER, rel / RPC_SERVER)
    (root / "bin").mkdir()
    (root / "bin" / "pairctl-svc").write_bytes(svc_script())
    (root / "bin" / GUARD).write_bytes(guard_bytes())
    for d in [root, *root.rglob("*")]:
        d.chmod(0o755 if d.is_dir() or d.suffix == ".so" or d.name == RPC_SERVER else 0o644)
    addr, port = ADDRESS["rpc"], RPC_PORT + 2
    argv = [str(rel / RPC_SERVER), "-H", addr, "-p", str(port)]
    sup = ["sup.allow=127.0.0.1", f"sup.user={SERVICE_USER}"]
    text = render_unit(
        pair="sdsys", service=RPC_SERVER, root=str(root), supervision=Supervision(), user=False,
        exec_argv=supervise_argv(str(root / "bin" / "pairctl-svc"), str(root), RPC_SERVER, sup, argv),
    )  # fmt: skip
    assert "ProtectSystem=strict" in text and f"ReadWritePaths={root}/run" in text
    # this lab's container refuses to remount /proc/sys and /proc/kmsg (226/NAMESPACE for a bare
    # /bin/true too); a host's system manager applies them. Everything else runs as rendered.
    lab_lacks = ("ProtectKernelTunables=yes", "ProtectKernelLogs=yes")
    text = "\n".join(line for line in text.splitlines() if line not in lab_lacks) + "\n"
    unit = "pairctl-sdsys-ggml-rpc-server-00000000.service"
    (UNIT_DIR / unit).write_text(text)
    try:
        _systemctl("daemon-reload", check=True)
        _systemctl("start", unit, check=True)
        try:
            took = wait_until("the sandboxed ggml-rpc-server serves", lambda: _identity(str(root), RPC_SERVER)
                              is not None and _hello(addr, port), 30)  # fmt: skip
        except AssertionError:
            logs = {f.name: f.read_text(errors="replace")[-1500:] for f in (root / "run").glob("*.*") if f.is_file()}
            raise AssertionError(f"{_systemctl('status', unit).stdout[-2000:]}\n{logs}") from None
        print(f"system-scope sandbox: ggml-rpc-server serving in {took:.2f} s")
        ident = _identity(str(root), RPC_SERVER)
        assert ident is not None
        st = _proc_status(ident[0])
        uid = subprocess.run(["id", "-u", SERVICE_USER], capture_output=True, text=True, check=True).stdout.strip()
        assert st["Uid"].split()[0] == uid and st["NoNewPrivs"].strip() == "1" and st["CapEff"].strip() == "0" * 16
        sup_status = _proc_status(_main_pid(unit))
        bound = int(sup_status["CapBnd"].strip(), 16)
        assert not bound >> 21 & 1 and bound >> 7 & 1  # the supervisor: no CAP_SYS_ADMIN, still CAP_SETUID
        mounts = Path(f"/proc/{ident[0]}/mountinfo").read_text().splitlines()
        ro = {m.split()[4]: "ro" in m.split()[5].split(",") for m in mounts}
        assert ro.get("/usr", ro.get("/")) and ro.get(str(root / "run")) is False, [m for m in mounts if "root" in m]
    finally:
        _systemctl("stop", unit)
        (UNIT_DIR / unit).unlink(missing_ok=True)
        _systemctl("daemon-reload")
        shutil.rmtree(root, ignore_errors=True)


def _hello(addr: str, port: int) -> bool:
    """ggml-rpc-server's HELLO (command 14, size 24, zeros) from 127.0.0.1, answered with size 28."""
    import socket

    try:
        with socket.socket() as c:
            c.bind(("127.0.0.1", 0))
            c.settimeout(3)
            c.connect((addr, port))
            c.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
            return c.recv(8)[:1] == bytes([28])
    except OSError:
        return False


def test_a_drop_in_that_changes_the_unit_is_a_status_problem(pair):
    """The readback is of the unit systemd runs, not only the file pairctl wrote: a drop-in
    (UNIT.d/*.conf) that changes it makes status say so, and its removal clears it."""
    unit = pair["units"]["native"]
    d = UNIT_DIR / f"{unit}.d"
    d.mkdir(parents=True, exist_ok=True)
    (d / "override.conf").write_text("[Service]\nEnvironment=LLAMA_ARG_THREADS=64\n")
    try:
        _systemctl("daemon-reload", check=True)
        code, st = _status(pair)
        assert code != 0 and any("not the file pairctl installed" in p for p in st["problems"]), st["problems"]
    finally:
        shutil.rmtree(d)
        _systemctl("daemon-reload", check=True)
    code, st = _status(pair)
    assert code == 0, st["problems"]


def test_a_unit_record_naming_another_unit_stops_nothing(pair):
    """run/NAME.unit is host state, so untrusted: a record naming another pair's (or root's) unit
    is refused by stop, and neither that unit nor this service is touched."""
    root = pair["roots"]["native"]
    rec = Path(root, "run", f"{LLAMA_SERVER}.unit")
    kept = rec.read_text()
    before = _identity(root, LLAMA_SERVER)
    rec.write_text("user pairctl-otherpair-llama-server-deadbeef.service\n")
    t = open_transport(pair["lab"].inventory, "lab-native")
    try:
        res = t.run(HostLayout(root).stop_cmd(LLAMA_SERVER), check=False, timeout=120)
    finally:
        t.close()
        rec.write_text(kept)
    assert res.exit_status == 3 and "does not name this root's unit" in str(res.stderr), (res.stdout, res.stderr)
    assert _identity(root, LLAMA_SERVER) == before and _healthy()


def test_a_restarted_manager_brings_the_pair_back_by_itself(pair, manager):
    before = {role: _identity(root, SERVICE[role]) for role, root in pair["roots"].items()}
    assert all(before.values())
    manager.power_off()
    assert not _healthy()
    # with no manager to start units, a deploy or rollback changes nothing: refused before the stop
    kept = {
        role: (Path(root, "run", "route.json").read_bytes(), os.readlink(Path(root, "run", "current")))
        for role, root in pair["roots"].items()
    }
    pid = pair["package"]
    for argv in (("deploy", "--packages", pid, pid, "--profile", PROFILE, "--skip-accept"), ("rollback",)):
        r = pair["cli"]("--json", argv[0], "--pair", PAIR, *argv[1:])
        assert r.exit_code == 6 and "no systemd user manager answers" in r.stderr, r.stderr[-2000:]
        assert "enable-linger" in r.stderr and "Traceback" not in r.stderr
    assert kept == {
        role: (Path(root, "run", "route.json").read_bytes(), os.readlink(Path(root, "run", "current")))
        for role, root in pair["roots"].items()
    }
    t0 = time.monotonic()
    manager.start()  # what a boot does: the manager starts every enabled unit
    took = wait_until("status exit 0 and health ok", lambda: _status(pair)[0] == 0 and _healthy(), BACK_WITHIN_S)
    print(f"manager restarted -> pair healthy {time.monotonic() - t0:.2f} s ({took:.2f} s)")
    for role, root in pair["roots"].items():
        after = _identity(root, SERVICE[role])
        assert after is not None and after[1:] == before[role][1:], role  # same binary, same argv
    _accept_identity(pair)


def test_a_deliberate_stop_disables_and_removes_the_unit(pair):
    root = pair["roots"]["native"]
    unit = pair["units"]["native"]
    t = open_transport(pair["lab"].inventory, "lab-native")
    try:
        out = str(t.run(HostLayout(root).stop_cmd(LLAMA_SERVER), check=True, timeout=120).stdout)
    finally:
        t.close()
    assert f"unit_removed={unit}" in out and "stopped=llama-server:" in out and "stopped=llama-server:-" not in out
    assert not (UNIT_DIR / unit).exists() and not Path(root, "run", f"{LLAMA_SERVER}.unit").exists()
    assert _systemctl("is-enabled", unit).returncode != 0
    assert _identity(root, LLAMA_SERVER) is None
    code, st = _status(pair)
    assert code != 0 and any(unit in p and "not installed" in p for p in st["problems"]), st["problems"]
    # a deploy puts it back
    pid = pair["package"]
    r = pair["cli"]("--json", "deploy", "--pair", PAIR, "--packages", pid, pid, "--profile", PROFILE, "--skip-accept")
    assert r.exit_code == 0, r.stderr[-3000:]
    assert _systemctl("is-enabled", unit).stdout.strip() == "enabled" and _healthy()
