"""The host helper (orchestrator/hosts/pairctl-svc.sh) and the SFTP-side operations, run for
real on this machine through the real LocalTransport, with real processes; outputs parsed by
the same parsers deploy uses. No network, no SSH."""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import tarfile
import time

import pytest

from orchestrator.errors import HostStateError
from orchestrator.hashing import sha256_bytes, sha256_file
from orchestrator.hosts import services
from orchestrator.hosts.layout import (
    SVC_SOURCE,
    HostLayout,
    install_helper,
    move_layout,
    put_secret,
    svc_script,
    switch_links,
)
from orchestrator.hosts.probes import (
    ProbeError,
    argv_from,
    parse_identity,
    parse_model_hashes,
    parse_sha256sum,
    read_facts,
    service_dirs,
)
from orchestrator.hosts.release import ReleaseMismatch
from orchestrator.hosts.route import RouteConflict, cas_write
from orchestrator.remote.local import LocalTransport

SERVICES = ("llama-server", "ggml-rpc-server")


@pytest.fixture
def host(tmp_path):
    t = LocalTransport("local-test")
    layout = HostLayout(str(tmp_path / "root dir"))  # a space in the root: arguments, not shell text
    install_helper(t, layout)
    yield t, layout
    for name in SERVICES:
        t.run(layout.stop_cmd(name), check=False)


def _release(layout: HostLayout, pid: str, name: str = "llama-server", program: str = "/bin/sleep") -> str:
    b = os.path.join(layout.release(pid), "bin")
    os.makedirs(b, exist_ok=True)
    shutil.copy2(program, os.path.join(b, name))  # a regular file, as in a package
    return os.path.join(b, name)


def test_install_helper_and_facts_of_an_empty_host(host):
    t, layout = host
    f = read_facts(t, layout, SERVICES)
    assert f.root_exists and f.current is None and f.releases == () and f.route_bytes is None
    assert f.folders == service_dirs(t, layout.root, SERVICES) == dict.fromkeys(SERVICES, layout.run)
    assert f.svc_sha256 == sha256_bytes(svc_script())
    assert oct(os.stat(layout.secrets).st_mode & 0o777) == "0o700"
    assert os.access(layout.svc, os.X_OK)


def test_start_identity_stop_with_pidfile(host):
    t, layout = host
    exe = _release(layout, "pkg-a")
    pid, ident = services.start(t, layout, "llama-server", [exe, "30", "1s"])
    assert ident.pid == pid and ident.argv == (exe, "30", "1s")
    assert ident.exe_sha256 == sha256_file("/bin/sleep")
    again = t.run(layout.start_cmd("llama-server", [exe, "30"]), check=False)
    assert again.exit_status == 3 and "already runs" in again.stderr
    assert read_facts(t, layout, SERVICES).running == {"llama-server": pid}
    assert services.process_alive(t, pid, "llama-server")
    ids = parse_identity(t.run(layout.identity_cmd(*SERVICES)).stdout)
    assert ids["llama-server"].pid == pid and not ids["ggml-rpc-server"].running
    assert services.stop(t, layout, "llama-server") == (f"stopped=llama-server:{pid}", 0)
    assert not services.process_alive(t, pid, "llama-server")
    assert services.stop(t, layout, "llama-server") == ("stopped=llama-server:-", 0)


def _wait_read(path: str, within_s: float = 5.0) -> str:
    """PATH's text once it has some (a service writes its log a moment after its start)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with open(path) as f:
                if (text := f.read()) or time.monotonic() > deadline:
                    return text
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only bind over run/: needs root")
def test_a_start_on_a_read_only_run_dir_keeps_its_files_in_the_runtime_dir(host):
    """Issue 49 item 1: the state dir read-only after stop-native, and the rollback's llama-server
    could not start (its supervisor writes pidfiles, state and logs in run/). A real read-only bind
    over run/: the start keeps them in /run/pairctl-0/ROOTTAG, and identity, alive, the supervisor's
    state, the log tail and stop find them there; once run/ takes files again, the next start is
    back in run/ and leaves nothing in the runtime dir. A link or a folder of another mode at that
    path is never followed: the start is refused, naming both. pairctl's own readers over SFTP
    (read_facts, status' supervisor state) find it where the helper put it (RuntimeDir: the same
    path), and read run/ again where that dir is not this user's."""
    from types import SimpleNamespace

    from orchestrator.config.inventory import Supervision
    from orchestrator.engine import status as status_of
    from orchestrator.hosts import supervisor
    from orchestrator.hosts.managers.systemd import SystemdManager
    from orchestrator.hosts.probes import RuntimeDir
    from orchestrator.hosts.space import NotWritable
    from orchestrator.hosts.units import root_tag

    t, layout = host
    # a shell as llama-server: it writes its --log-file ($1, "--log-file" its $0) as llama-server
    # does, and lives while its 1 s children come and go (no sleep outlives a stop)
    exe = _release(layout, "pkg-a", program="/bin/sh")
    script = 'echo "started $$" >"$1"; while :; do /bin/sleep 1; done'
    argv = [exe, "-c", script, "--log-file", layout.log("llama-server.log")]
    rt = f"/run/pairctl-0/{root_tag(layout.root)}"
    assert RuntimeDir.of(t, layout.root) == RuntimeDir(0, rt)
    shutil.rmtree(rt, ignore_errors=True)
    services.start(t, layout, "llama-server", argv)  # it ran before (run/home/llama-server is there)
    services.stop(t, layout, "llama-server")
    run = os.path.realpath(layout.run)
    run_log = _wait_read(os.path.join(run, "llama-server.log"))

    subprocess.run(["mount", "--bind", run, run], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", run], check=True)
        pid, ident = services.start(t, layout, "llama-server", argv)
        assert ident.pid == pid and "llama-server.pid" not in os.listdir(run)
        # its --log-file moved with it, word for word as pairctl's identity expects (probes.argv_from)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert tuple(f.read().decode().split("\0")[:-1]) == argv_from(argv, layout.root, "llama-server", rt)
        assert _wait_read(os.path.join(rt, "llama-server.log")) == f"started {pid}\n"
        assert _wait_read(os.path.join(run, "llama-server.log")) == run_log  # run/'s untouched
        assert oct(os.stat(rt).st_mode & 0o777) == "0o700" and oct(os.stat(os.path.dirname(rt)).st_mode) == "0o40700"
        assert sorted(f for f in os.listdir(rt) if not f.startswith(".") and ".tmp." not in f) == [
            "llama-server.log",
            "llama-server.out",
            "llama-server.pid",
            "llama-server.state",
            "llama-server.sup.log",
            "llama-server.sup.pid",
        ]
        assert parse_identity(t.run(layout.identity_cmd(*SERVICES)).stdout)["llama-server"].pid == pid
        assert t.run(layout.alive_cmd("llama-server")).stdout.strip() == f"alive=llama-server:{pid}"
        sup = t.run(layout.svc_cmd("supervisor", "llama-server")).stdout.strip().split(":", 1)[1]
        assert (
            "state=running" in base64.b64decode(sup).decode() and "supervisor_alive=1" in base64.b64decode(sup).decode()
        )
        with open(os.path.join(rt, "llama-server.out"), "a") as f:
            f.write("written by the service\n")
        assert "written by the service" in t.run(layout.log_tail_cmd("llama-server.out")).stdout
        assert read_facts(t, layout, SERVICES).running == {"llama-server": pid}
        st = supervisor.read_state(t, layout, "llama-server")
        assert st is not None and (st.state, st.supervisor_alive, st.runtime_dir) == ("running", True, rt)
        assert st.as_dict()["runtime_dir"] == rt
        out: dict[str, list[str]] = {"problems": [], "warnings": []}  # what `pairctl status` says of it
        f = read_facts(t, layout, ("llama-server",))
        assert f.folders == service_dirs(t, layout.root, ("llama-server",)) == {"llama-server": rt}  # diff reads it
        assert status_of._supervisor(t, layout, SimpleNamespace(name="p"), "h", "llama-server", f, out)
        assert out["problems"] == [] and len(out["warnings"]) == 1
        assert (
            f"llama-server runs with its pidfiles, supervisor state and logs in {rt}, because {layout.run}"
            in (out["warnings"][0])
        )
        assert "a reboot does not bring it back until" in out["warnings"][0]
        assert out["warnings"][0].endswith(  # its --log-file there: in memory, growing with the run
            f"; its log {rt}/llama-server.log is 0.0 MiB and grows with every request, held in memory "
            f"until {layout.run} is writable and llama-server restarted"
        )
        for f in ("llama-server.out", "llama-server.sup.log"):  # in memory there: 1 MiB each, one kept
            with open(os.path.join(rt, f), "a") as out:
                out.write("x" * (2 << 20) + "\n")
        os.kill(pid, 9)  # its supervisor starts it again, rotating both first
        while (new := open(os.path.join(rt, "llama-server.pid")).read().strip()) in ("", str(pid)):
            time.sleep(0.05)
        pid = int(new)
        assert os.path.getsize(os.path.join(rt, "llama-server.out")) < 4096
        assert os.path.getsize(os.path.join(rt, "llama-server.sup.log")) < 4096
        assert os.path.getsize(os.path.join(rt, "llama-server.sup.log.1")) > 2 << 20
        assert not os.path.exists(os.path.join(rt, "llama-server.out.2"))
        os.chown(rt, 1, -1)  # another user's folder there: never read as ours (run/'s stopped state is)
        assert read_facts(t, layout, SERVICES).running == {}
        st = supervisor.read_state(t, layout, "llama-server")
        assert st is not None and (st.state, st.runtime_dir) == ("stopped", None) and "runtime_dir" not in st.as_dict()
        os.chown(rt, 0, -1)
        assert services.stop(t, layout, "llama-server") == (f"stopped=llama-server:{pid}", 0)
        assert not services.process_alive(t, pid, "llama-server")
        # the next start back in run/ keeps the runtime dir's --log-file as run/llama-server.log.prev
        rt_log = _wait_read(os.path.join(rt, "llama-server.log"))
        subprocess.run(["mount", "-o", "remount,bind,rw", run], check=True)
        pid, _ = services.start(t, layout, "llama-server", argv)
        assert _wait_read(os.path.join(run, "llama-server.log.prev")) == rt_log
        assert _wait_read(os.path.join(run, "llama-server.log")) == f"started {pid}\n"
        assert services.stop(t, layout, "llama-server") == (f"stopped=llama-server:{pid}", 0)
        assert [f for f in os.listdir(rt) if f.startswith("llama-server.")] == []
        for _ in range(50):  # its supervisor may hold a file in run/ open for writing a moment (EBUSY)
            if subprocess.run(["mount", "-o", "remount,bind,ro", run], check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"{run}: the read-only remount kept failing")
        shutil.rmtree(rt)
        for planted in ("link", "mode"):  # a stranger's link, or a folder others may enter: refused
            os.symlink(str(layout.root), rt) if planted == "link" else os.mkdir(rt, 0o755)
            r = t.run(layout.start_cmd("llama-server", argv), check=False)
            assert r.exit_status == 3 and f"{run} takes no new file, and {rt} is not a 0700 folder" in r.stderr
            os.unlink(rt) if planted == "link" else os.rmdir(rt)
        # a systemd host's start writes run/ (its staged unit, record, pidfiles, logs): refused before
        # any change, naming run/, by pairctl's check of the unit and by the helper itself
        mgr = SystemdManager("system", "p", layout.root, Supervision())
        with pytest.raises(NotWritable, match=f"{layout.run} takes no new file .*nothing was changed"):
            mgr.verify_staged(t, layout, "h", "llama-server", argv, [])
        r = t.run(layout.svc_cmd("start", "llama-server", *mgr.words("llama-server"), exe, "30"), check=False)
        assert r.exit_status == 3 and f"writable=no: {layout.run} takes no new file" in r.stderr
        assert "nothing was stopped" in r.stderr and not os.path.exists(rt)
    finally:
        subprocess.run(["umount", "-l", run], check=True)
    pid, _ = services.start(t, layout, "llama-server", argv)
    assert read_facts(t, layout, SERVICES).running == {"llama-server": pid}
    assert not os.path.exists(rt) or os.listdir(rt) == []
    shutil.rmtree(rt, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only bind over run/: needs root")
def test_a_read_only_run_dir_never_leaves_a_boot_file_that_starts_other_arguments(host):
    """review-f49 item 1: run/NAME.boot cannot be removed on a read-only run/, and a reboot or the
    watchdog would start it again: a stop then stops nothing (exit 3, naming it); a start in the
    runtime dir of other arguments than it holds is refused before any change, of the same ones
    goes on; `boot` and `watch` never start NAME from it while the runtime dir holds NAME's state."""
    from orchestrator.hosts.units import root_tag

    t, layout = host
    exe = _release(layout, "pkg-a")
    rt = f"/run/pairctl-0/{root_tag(layout.root)}"
    shutil.rmtree(rt, ignore_errors=True)
    pid, _ = services.start(t, layout, "llama-server", [exe, "30"])  # run/llama-server.boot: these arguments
    run = os.path.realpath(layout.run)
    subprocess.run(["mount", "--bind", run, run], check=True)
    try:
        # its supervisor may hold a file there open for writing a moment (EBUSY): as a disk's remount, again
        for _ in range(50):
            if subprocess.run(["mount", "-o", "remount,bind,ro", run], check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"{run}: the read-only remount kept failing")
        r = t.run(layout.stop_cmd("llama-server"), check=False)
        assert r.exit_status == 3 and r.stdout == ""
        assert "run/llama-server.boot cannot be removed: a reboot or the watchdog would start llama-server" in r.stderr
        assert "nothing was stopped" in r.stderr and services.process_alive(t, pid, "llama-server")
        sup = int(open(os.path.join(run, "llama-server.sup.pid")).read())
        os.kill(sup, 9)  # both gone (a crash): the next start is in the runtime dir
        os.kill(pid, 9)
        while services.process_alive(t, pid, "llama-server"):
            pass
        r = t.run(layout.start_cmd("llama-server", [exe, "31"]), check=False)
        assert r.exit_status == 3 and "run/llama-server.boot holds other arguments than these" in r.stderr
        assert "nothing was stopped" in r.stderr and not os.path.exists(rt)
        pid, _ = services.start(t, layout, "llama-server", [exe, "30"])  # the same ones: started there
        assert sorted(os.listdir(rt)) and "llama-server.state" in os.listdir(rt)
        sup = int(open(os.path.join(rt, "llama-server.sup.pid")).read())
        os.kill(sup, 9)
        os.kill(pid, 9)
        while services.process_alive(t, pid, "llama-server"):
            pass
    finally:
        subprocess.run(["umount", "-l", run], check=True)
    try:  # run/ takes files again, the runtime dir still holds its state: run/llama-server.boot stays unused
        assert t.run(layout.svc_cmd("watch")).stdout == ""
        t.run(layout.svc_cmd("boot"))
        with open(os.path.join(run, "boot.log")) as f:
            assert f.read().splitlines()[-1] == "boot=llama-server:runtime-dir"
        assert subprocess.run(["pgrep", "-f", exe], check=False).returncode == 1  # nothing started
        with open(os.path.join(rt, "llama-server.out"), "a") as f:
            f.write("the runtime dir's last output\n")
        services.start(t, layout, "llama-server", [exe, "30"])  # back in run/: that output kept as its .prev
        with open(os.path.join(run, "llama-server.out.prev")) as f:  # (review-f49 item 6)
            assert f.read() == "the runtime dir's last output\n"
        assert os.listdir(rt) == []
    finally:
        shutil.rmtree(rt, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs over run/: needs root")
def test_a_start_on_a_full_run_dir_fails_there_and_never_moves_to_the_runtime_dir(host):
    """review-f49 item 8: only a read-only filesystem moves a start to the runtime dir; a full one
    (here: no inode left) fails on run/llama-server.boot as it did, and the runtime dir stays unmade."""
    from orchestrator.hosts.units import root_tag

    t, layout = host
    exe = _release(layout, "pkg-a")
    rt = f"/run/pairctl-0/{root_tag(layout.root)}"
    shutil.rmtree(rt, ignore_errors=True)
    run = os.path.realpath(layout.run)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=16,mode=0700", "f49fix", run], check=True)
    try:
        with pytest.raises(OSError):
            for i in range(64):
                open(os.path.join(run, f"fill.{i}"), "w").close()
        r = t.run(layout.start_cmd("llama-server", [exe, "30"]), check=False)
        assert r.exit_status == 1 and "No space left on device" in r.stderr and ".boot" in r.stderr
        assert not os.path.exists(rt) and subprocess.run(["pgrep", "-f", exe], check=False).returncode == 1
    finally:
        subprocess.run(["umount", "-l", run], check=True)
        shutil.rmtree(rt, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only bind and runs the helper as nobody: needs root")
def test_a_user_who_does_not_linger_never_starts_in_the_runtime_dir():
    """review-f49 item 3: logind removes a non-root user's /dev/shm files with its last session (the
    SSH session pairctl ends), pidfiles and all: such a user's start on a read-only run/ is refused,
    naming run/ and the linger that would allow it; pairctl's readers (RuntimeDir) read run/ only then."""
    import tempfile
    from pathlib import Path
    from typing import cast

    from orchestrator.hosts.probes import RuntimeDir
    from orchestrator.hosts.units import root_tag
    from orchestrator.remote.transport import Transport

    top = Path(tempfile.mkdtemp(prefix="pairctl-nobody-"))  # (pytest's own tmp is root's, 0700)
    os.chmod(top, 0o755)
    root, run = top / "root", top / "root" / "run"
    exe = top / "root" / "releases" / "pkg-a" / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    run.mkdir()
    shutil.copy2("/bin/sleep", exe)
    shutil.copy2(SVC_SOURCE, top / "pairctl-svc")
    for d, _, files in os.walk(top):
        for x in (d, *(os.path.join(d, f) for f in files)):
            os.chown(x, 65534, 65534)
    assert not os.path.exists("/var/lib/systemd/linger/nobody")
    subprocess.run(["mount", "--bind", str(run), str(run)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(run)], check=True)
        r = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", str(top / "pairctl-svc")]
            + ["start", str(root), "llama-server", str(exe), "30"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 3 and f"{run} takes no new file (read-only), and nobody does not linger" in r.stderr
        assert not os.path.exists("/dev/shm/pairctl-65534")
    finally:
        subprocess.run(["umount", "-l", str(run)], check=True)
        shutil.rmtree(top)

    class NotLingering:  # what RuntimeDir reads over SFTP
        def login_uid(self) -> int:
            return 65534

        def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
            with open(path, "rb") as f:
                return f.read(max_bytes)

        def stat(self, path: str) -> object:
            return None if path == "/var/lib/systemd/linger/nobody" else object()

    class Lingering(NotLingering):
        def stat(self, path: str) -> object:
            return object()

    assert RuntimeDir.of(cast(Transport, NotLingering()), str(root)) is None
    assert RuntimeDir.of(cast(Transport, Lingering()), str(root)) == RuntimeDir(
        65534, f"/dev/shm/pairctl-65534/{root_tag(str(root))}"
    )


def test_stop_leaves_a_foreign_pid_alone(host):
    t, layout = host
    p = subprocess.Popen(["sleep", "30"])
    try:
        with open(os.path.join(layout.run, "llama-server.pid"), "w") as f:
            f.write(str(p.pid))
        assert read_facts(t, layout, SERVICES).running == {}  # argv[0] is not .../llama-server
        assert services.stop(t, layout, "llama-server") == ("stopped=llama-server:-", 0)
        assert p.poll() is None  # not ours: never signalled
    finally:
        p.kill()
        p.wait()


def test_restart_reports_a_process_that_exits_at_once(host):
    t, layout = host
    exe = _release(layout, "pkg-a", "ggml-rpc-server")
    # `sleep -H ...` exits at once, like ggml-rpc-server on a failed bind: no port, no process
    with pytest.raises(Exception, match="ggml-rpc-server exited"):
        services.restart_listening(t, layout, "ggml-rpc-server", ("pkg-a", None), "127.0.0.1", 9, [exe, "-H", "x"])
    assert read_facts(t, layout, SERVICES).current == "pkg-a"  # the links were switched before the start


def test_restart_waits_for_the_port_and_returns_identity(host):
    import socket
    import sys

    t, layout = host
    bindir = os.path.join(layout.release("pkg-a"), "bin")
    os.makedirs(bindir)
    exe = os.path.join(bindir, "ggml-rpc-server")
    os.symlink(os.path.realpath(sys.executable), exe)  # a real listener whose argv[0] is .../ggml-rpc-server
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    code = (
        f"import socket,time;time.sleep(0.3);s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
        f"s.bind(('127.0.0.1',{port}));s.listen();time.sleep(30)"
    )
    argv = [exe, "-c", code]
    pid, ident, stopped, _ = services.restart_listening(
        t, layout, "ggml-rpc-server", ("pkg-a", None), "127.0.0.1", port, argv
    )
    assert stopped == "ggml-rpc-server:-" and ident.pid == pid and ident.argv == tuple(argv)
    assert ident.exe_sha256 == sha256_file(os.path.realpath(sys.executable))
    f = read_facts(t, layout, SERVICES)
    assert f.current == "pkg-a" and f.running.get("ggml-rpc-server") == pid


def test_switch_links_by_rename(host):
    t, layout = host
    _release(layout, "a")
    _release(layout, "b")
    switch_links(t, layout, "a", None)
    switch_links(t, layout, "b", "a")
    f = read_facts(t, layout, SERVICES)
    assert (f.current, f.previous, f.releases) == ("b", "a", ("a", "b"))
    assert os.readlink(layout.current) == layout.release("b")  # absolute: run/ may be a link elsewhere
    switch_links(t, layout, "a", None)
    f = read_facts(t, layout, SERVICES)
    assert (f.current, f.previous) == ("a", None)
    # the helper's own switch (used inside `restart`) refuses a release that is not installed
    assert t.run(layout.switch_cmd("nope", "a"), check=False).exit_status == 3


def test_cas_write_refuses_a_stale_read_and_reads_back(host):
    t, layout = host
    assert cas_write(t, layout.route, None, b'{"revision":1}\n') == b'{"revision":1}\n'
    with pytest.raises(RouteConflict):
        cas_write(t, layout.route, None, b'{"revision":2}\n')  # this writer read "no record": stale
    assert cas_write(t, layout.route, b'{"revision":1}\n', b'{"revision":2}\n') == b'{"revision":2}\n'
    assert read_facts(t, layout, SERVICES).route_bytes == b'{"revision":2}\n'


def test_unpack_prints_hashes_and_only_takes_temporary_names(host):
    t, layout = host
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"payload"
        info = tarfile.TarInfo("bin/llama-server")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    out = t.run(layout.unpack_cmd(".p1.tmp-abcd"), stdin=buf.getvalue()).stdout
    assert parse_sha256sum(out) == {"bin/llama-server": sha256_bytes(b"payload")}
    assert t.run(layout.unpack_cmd("p1"), stdin=buf.getvalue(), check=False).exit_status == 2
    assert parse_sha256sum(t.run(layout.hash_cmd(".p1.tmp-abcd")).stdout) == {
        "bin/llama-server": sha256_bytes(b"payload")
    }
    t.run(layout.discard_cmd(".p1.tmp-abcd"))
    assert read_facts(t, layout, SERVICES).releases == ()


def test_put_secret_mode_0600(host):
    t, layout = host
    path = put_secret(t, layout, b"k3y\n")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    with open(path, "rb") as f:
        assert f.read() == b"k3y\n"


def test_stop_verifies_a_present_release_first_and_stops_nothing_on_mismatch(host):
    t, layout = host
    exe = _release(layout, "pkg-a")
    with open(os.path.join(layout.release("pkg-a"), "data"), "wb") as f:
        f.write(b"payload")
    good = {"data": sha256_bytes(b"payload"), "bin/llama-server": sha256_file(exe)}
    pid, _ = services.start(t, layout, "llama-server", [exe, "30"])
    bad = {**good, "data": sha256_bytes(b"tampered")}
    with pytest.raises(ReleaseMismatch, match="data: sha256"):
        services.stop(t, layout, "llama-server", verify=("pkg-a", bad))
    assert services.process_alive(t, pid, "llama-server")  # nothing was stopped
    with pytest.raises(ReleaseMismatch, match="missing"):
        services.stop(t, layout, "llama-server", verify=("pkg-a", {**good, "bin/other": sha256_bytes(b"")}))
    assert services.process_alive(t, pid, "llama-server")
    out, verified = services.stop(t, layout, "llama-server", verify=("pkg-a", good))
    assert out == f"stopped=llama-server:{pid}" and verified == 2


@pytest.mark.parametrize("with_ss", [True, False])
def test_wait_listen_with_and_without_ss(tmp_path, with_ss):
    """`wait-listen` judges a port by `ss` where the host has it, else by /proc/net/tcp (minimal
    images such as the GPU machine's have no iproute2): a real listener is seen, a closed port is not."""
    import socket
    import sys

    if with_ss and shutil.which("ss") is None:
        pytest.skip("no ss here")
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    srv = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,time\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(srv.stdout.readline())
        (root / "run" / "svc.pid").write_text(f"{srv.pid}\n")
        env = dict(os.environ)
        if not with_ss:
            bin_dir = tmp_path / "bin"
            bin_dir.mkdir()
            for tool in (
                "sh",
                "awk",
                "grep",
                "date",
                "sleep",
                "tail",
                "cat",
                "head",
                "tr",
                "cut",
                "sed",
                "readlink",
                "printf",
            ):
                found = shutil.which(tool)
                if found:
                    (bin_dir / tool).symlink_to(found)
            env["PATH"] = str(bin_dir)
        script = str(SVC_SOURCE)
        ok = subprocess.run(
            ["/bin/sh", script, "wait-listen", str(root), "svc", "127.0.0.1", str(port), "3"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert ok.returncode == 0 and f"listening=127.0.0.1:{port}" in ok.stdout, ok.stdout + ok.stderr
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        bad = subprocess.run(
            ["/bin/sh", script, "wait-listen", str(root), "svc", "127.0.0.1", str(free), "1"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert bad.returncode == 5 and "timeout=" in bad.stdout
    finally:
        srv.kill()
        srv.wait()


def test_model_hash_is_cached_by_stat_and_redone_when_the_file_changes(host, tmp_path):
    """A model is tens of GB: hashed once, then read from run/model-sha256 while its device,
    inode, size, mtime and ctime are unchanged; a rewrite (same size) is hashed again."""
    t, layout = host
    m = tmp_path / "models dir" / "target.gguf"
    m.parent.mkdir()
    m.write_bytes(b"GGUF" + b"\0" * 1000)
    missing = str(tmp_path / "none.gguf")

    def hashes():
        return parse_model_hashes(t.run(layout.model_hash_cmd([str(m), missing])).stdout)

    first = hashes()
    assert first[str(m)].sha256 == sha256_file(m) and first[str(m)].size == 1004 and first[str(m)].how == "hashed"
    assert first[missing].sha256 is None and first[missing].how == "missing"
    assert hashes()[str(m)].how == "cached"
    os.utime(m, ns=(1, 1))  # even a touch back in time changes ctime: hashed again
    m.write_bytes(b"GGUF" + b"\1" * 1000)
    again = hashes()[str(m)]
    assert again.how == "hashed" and again.sha256 == sha256_file(m) != first[str(m)].sha256
    lines = open(os.path.join(layout.run, "model-sha256")).read().splitlines()
    assert len(lines) == 1 and lines[0].endswith(again.sha256)  # one line per file


@pytest.mark.parametrize(
    "line",
    [
        "model=xyz:1:hashed:/m",
        "model=" + "a" * 64 + ":x:hashed:/m",
        "model=" + "a" * 64 + ":1:guessed:/m",
        "model=-:-:missing:",
        "other=1",
    ],
)
def test_parse_model_hashes_rejects(line):
    with pytest.raises(ProbeError):
        parse_model_hashes(line)


def test_a_file_added_to_a_present_release_fails_its_verify(host, tmp_path):
    """Issue 32 #4 as it was run: a planted lib/libgomp.so.1 (or a link there) in a release whose
    every manifest file matches. The helper's own gate refuses it before stopping anything, and
    the hash listing status --verify-files reads names it."""
    from orchestrator.hosts.release import check_hash_output

    t, layout = host
    exe = _release(layout, "pkg-a")
    with open(os.path.join(layout.release("pkg-a"), "manifest.json"), "w") as f:
        f.write("{}")
    good = {"bin/llama-server": sha256_file(exe)}
    pid, _ = services.start(t, layout, "llama-server", [exe, "30"])
    assert check_hash_output(good, t.run(layout.hash_cmd("pkg-a")).stdout, "h", "releases/pkg-a") == 1
    lib = os.path.join(layout.release("pkg-a"), "lib")
    os.makedirs(lib)
    for plant in ("file", "link"):
        target = os.path.join(lib, "libgomp.so.1")
        if plant == "file":
            with open(target, "wb") as f:
                f.write(b"\x7fELF evil")
        else:
            os.symlink(str(tmp_path / "evil.so"), target)
        with pytest.raises(ReleaseMismatch, match="libgomp.so.1: not in the manifest" if plant == "file" else "link"):
            services.stop(t, layout, "llama-server", verify=("pkg-a", good))
        assert services.process_alive(t, pid, "llama-server")  # refused before stopping anything
        with pytest.raises(ReleaseMismatch):
            check_hash_output(good, t.run(layout.hash_cmd("pkg-a")).stdout, "h", "releases/pkg-a")
        os.remove(target)
    out, verified = services.stop(t, layout, "llama-server", verify=("pkg-a", good))
    assert verified == 1


def test_helper_is_installed_through_an_exclusive_temp_name_never_a_link(host, tmp_path):
    """Issue 32 #3: a link planted at bin/pairctl-svc.tmp made deploy overwrite its target with the
    helper and chmod it 0755. The temp name is now unique per run and created O_EXCL."""
    t, layout = host
    victim = tmp_path / "root-only"
    victim.write_bytes(b"secret\n")
    victim.chmod(0o600)
    os.symlink(victim, layout.svc + ".tmp")
    with open(layout.svc, "wb") as f:
        f.write(b"# an older helper\n")
    install_helper(t, layout)
    assert victim.read_bytes() == b"secret\n" and oct(victim.stat().st_mode & 0o777) == "0o600"
    assert open(layout.svc, "rb").read() == svc_script()
    assert not [n for n in os.listdir(os.path.dirname(layout.svc)) if ".tmp-" in n]


@pytest.mark.parametrize("what", ["svc-owner", "svc-mode", "bin-mode", "root-owner", "parent-mode", "bin-link"])
def test_an_install_root_others_can_write_is_refused_before_the_helper_runs(host, tmp_path, what):
    """Issue 32 #3: as `nobody`, replacing bin/pairctl-svc made a read (status) run it as root.
    Every directory to the root, the root's folders and the helper must be the login user's or
    root's and not group/world-writable (OpenSSH StrictModes): read_facts refuses first (exit 6)."""
    from orchestrator.errors import HostStateError

    if os.geteuid() != 0:
        pytest.skip("needs root to plant another user's files")
    t, layout = host
    bindir = os.path.dirname(layout.svc)
    if what == "svc-owner":
        os.chown(layout.svc, 65534, 65534)
    elif what == "svc-mode":
        os.chmod(layout.svc, 0o777)
    elif what == "bin-mode":
        os.chmod(bindir, 0o777)
    elif what == "root-owner":
        os.chown(layout.root, 65534, 65534)
    elif what == "parent-mode":
        os.chmod(os.path.dirname(layout.root), 0o777)
    elif what == "bin-link":
        real = tmp_path / "elsewhere"
        shutil.move(bindir, real)
        os.symlink(real, bindir)
    with pytest.raises(HostStateError, match="refusing install root") as e:
        read_facts(t, layout, SERVICES)
    assert e.value.exit_code == 6 and "chmod go-w" in (e.value.hint or "")
    with pytest.raises(HostStateError):
        install_helper(t, layout)


@pytest.mark.parametrize("what", ["pid", "state", "log"])
def test_pid_state_and_log_files_linked_to_dev_zero_are_no_hang(host, what):
    """Issue 32 #9: a pid file linked to /dev/zero hung `status` for 246 s and left readers spinning
    on the host; set_state copied the state file through links. Every helper read of run/ is
    bounded and refuses links, within seconds."""
    import time

    t, layout = host
    name = "llama-server"
    path = {"pid": layout.log(f"{name}.pid"), "state": layout.log(f"{name}.state"), "log": layout.log("x.log")}[what]
    os.symlink("/dev/zero", path)
    t0 = time.monotonic()
    if what == "pid":
        res = t.run(layout.alive_cmd(name), check=False, timeout=20)
        assert res.exit_status != 0
        res = t.run(layout.identity_cmd(name), check=False, timeout=20)
    elif what == "state":
        res = t.run(layout.svc_cmd("supervisor", name), check=False, timeout=20)
    else:
        res = t.run(layout.log_tail_cmd("x.log"), check=False, timeout=20)
        assert t.run(layout.log_grep_cmd("x.log", "a"), check=False, timeout=20).exit_status != 0
    assert time.monotonic() - t0 < 10, res
    assert os.path.islink(path) and os.readlink(path) == "/dev/zero"


def test_set_state_never_copies_through_a_link(host, tmp_path):
    """The supervisor's state file replaced by a link to a root-only file: the next state write
    (a stop) must not copy that file's text into the world-readable state file."""
    t, layout = host
    secret = tmp_path / "secret"
    secret.write_text("root-only=1\n")
    secret.chmod(0o600)
    exe = _release(layout, "pkg-a")
    services.start(t, layout, "llama-server", [exe, "30"])
    state = layout.log("llama-server.state")
    # swapped in one rename: the supervisor writes its state too, and a remove-then-link left a
    # moment in which its write made the link fail (FileExistsError, seen at load 9)
    planted = f"{state}.planted"
    os.symlink(secret, planted)
    os.replace(planted, state)
    services.stop(t, layout, "llama-server")
    assert secret.read_text() == "root-only=1\n"
    assert not os.path.islink(state) and "root-only" not in open(state).read()


def test_run_is_a_link_to_the_state_dir_and_a_bad_one_is_refused(tmp_path):
    """Issue 49: every start wrote pidfiles, state and logs under the install root, so a root that
    turned read-only left a rollback unable to start the previous release. install_helper makes
    run/ a link to the state_dir (outside the root), and the helper's files land there; the link
    is trusted only when it names this host's state_dir exactly (not merely outside the root, not
    normalising to it, never without one), and the target is judged as a root is, trusting no
    link of its own (run/ links pointing at each other recursed without limit)."""
    from orchestrator.errors import HostStateError
    from orchestrator.hosts.root_trust import root_problem

    t = LocalTransport("local-test")
    root, state = str(tmp_path / "root"), str(tmp_path / "state")
    layout = HostLayout(root, state=state)
    install_helper(t, layout)
    install_helper(t, layout)  # again: the link is kept
    assert os.readlink(layout.run) == state and os.path.isdir(state)
    res = t.run(layout.svc_cmd("log-tail", "x.log"), check=False)
    assert res.exit_status == 0 and root_problem(t, root, state) is None
    assert "not to this host's state_dir None" in (root_problem(t, root) or "")  # no state_dir: no link
    os.chmod(state, 0o777)
    assert "writable by others" in (root_problem(t, root, state) or "")
    os.chmod(state, 0o755)
    for target in ("state-elsewhere", str(tmp_path / "x" / ".." / "state"), str(tmp_path / "other")):
        os.remove(layout.run)
        os.symlink(target, layout.run)
        assert "not to this host's state_dir" in (root_problem(t, root, state) or ""), target
    with pytest.raises(HostStateError, match="refusing install root .*other', not to this host's state_dir"):
        install_helper(t, layout)
    os.remove(layout.run)
    os.symlink(state, layout.run)
    os.symlink(layout.run, state + "/run")  # run/ links that point at each other
    assert "not to this host's state_dir None" in (root_problem(t, root, state) or "")


def test_a_run_directory_from_before_moves_to_the_state_dir(tmp_path, monkeypatch):
    """The default layout on a root deployed before it: run/'s small files (pidfiles, supervisor
    state) are copied to the state dir, run/ is renamed aside and the link takes its name, so a
    stop finds the live service's pidfile through the link; a default state dir that cannot be
    made (the root's parent not the login user's) leaves run/ the directory it was for a leased
    command that uploads nothing, and refuses a deploy's install_helper naming state_dir."""
    t = LocalTransport("local-test")
    root = str(tmp_path / "root")
    install_helper(t, HostLayout(root))
    with open(os.path.join(root, "run", "llama-server.pid"), "w") as fh:
        fh.write("4242\n")
    layout = HostLayout(root, state=root + ".state")
    install_helper(t, layout)
    assert os.readlink(layout.run) == root + ".state"
    with open(layout.log("llama-server.pid")) as fh:
        assert fh.read() == "4242\n"
    assert not [n for n in os.listdir(root) if n.startswith(".")]  # the old run/ removed once replaced
    other = HostLayout(str(tmp_path / "r2"), state=str(tmp_path / "r2") + ".state")
    install_helper(t, HostLayout(other.root))
    makedirs = t.makedirs

    def refused(path: str, mode: int = 0o755) -> None:
        if path == other.state:
            raise PermissionError(13, "Permission denied", path)
        makedirs(path, mode)

    monkeypatch.setattr(t, "makedirs", refused)
    assert move_layout(t, other)
    assert os.path.isdir(other.run) and not os.path.islink(other.run)
    with pytest.raises(HostStateError, match="state_dir"):
        install_helper(t, other, strict=True)  # a deploy's prepare only


def test_an_older_layout_moves_into_run_under_the_lease(tmp_path):
    """A root deployed before everything written after the upload moved into run/ (issue 49):
    current/previous (re-pointed at absolute release paths), route.json and the lease this run
    took in leases/ move to the state dir, leases/ becomes a link to run/leases, and nothing is
    left in the root but releases/, bin/, secrets/ and the links (what an earlier move set aside
    is removed, a link there unfollowed); status read the old places first."""
    t = LocalTransport("local-test")
    root = tmp_path / "root"
    for d in ("releases/a", "releases/b", "run", "leases/host.lock"):
        (root / d).mkdir(parents=True)
    os.symlink("releases/b", root / "current")
    os.symlink("releases/a", root / "previous")
    (root / "route.json").write_bytes(b'{"revision": 3}\n')
    (root / "leases/host.lock/lease.json").write_text('{"nonce": "n"}')
    (root / ".run.old.tmp-0a").mkdir()  # an earlier pairctl's move kept what it set aside
    (root / ".run.old.tmp-0a/llama-server.log").write_text("old")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/keep").write_text("not ours")
    os.symlink(tmp_path / "elsewhere", root / ".leases.old.tmp-0b")  # removed, never followed
    layout = HostLayout(str(root), state=str(root) + ".state")
    f = read_facts(t, HostLayout(str(root)), ())
    assert (f.current, f.previous, f.route_bytes) == ("b", "a", b'{"revision": 3}\n')
    install_helper(t, layout)
    assert os.readlink(layout.current) == layout.release("b") and os.readlink(layout.previous) == layout.release("a")
    assert open(layout.route, "rb").read() == b'{"revision": 3}\n'
    assert os.readlink(layout.leases) == "run/leases"
    assert (tmp_path / "root.state/leases/host.lock/lease.json").read_text() == '{"nonce": "n"}'
    assert sorted(os.listdir(root)) == ["bin", "leases", "releases", "run", "secrets"]
    f = read_facts(t, layout, ())
    assert (f.current, f.previous, f.route_bytes) == ("b", "a", b'{"revision": 3}\n')
    assert (tmp_path / "elsewhere/keep").read_text() == "not ours"
    install_helper(t, layout)  # once moved, nothing more to do
    assert sorted(os.listdir(root)) == ["bin", "leases", "releases", "run", "secrets"]


def test_a_server_that_exits_while_its_identity_is_read_is_not_running(host, tmp_path):
    """The start of a server that cannot load its model: it is alive when the helper checks it and
    gone when the helper hashes /proc/PID/exe. A sha256sum that kills the process first makes that
    window certain; the identity is `not running`, never the line `NAME:PID::` the parser refuses."""
    t, layout = host
    exe = _release(layout, "pkg-a")
    pid, _ = services.start(t, layout, "llama-server", [exe, "30"])
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("sha256sum")
    (shim / "sha256sum").write_text(
        f'#!/bin/sh\nkill -9 {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.01; done\nexec {real} "$@"\n'
    )
    (shim / "sha256sum").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["sh", layout.svc, "identity", layout.root, "llama-server"], env=env, capture_output=True, text=True, timeout=20
    )
    assert parse_identity(out.stdout)["llama-server"].running is False, out
