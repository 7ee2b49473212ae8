"""The supervisor (pairctl-svc `supervise`) run for real on this machine through LocalTransport
with real processes (copies of /bin/sleep, /bin/false and python named as the services), plus
its pure parts (options, state and uptime parsers). The lab's real servers: tests/e2e/test_supervision.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config.inventory import Supervision
from orchestrator.hosts.layout import HostLayout, install_helper
from orchestrator.hosts.supervisor import (
    CLOCK_TICKS_PER_S,
    ipv4_endpoint,
    parse_state,
    parse_uptime,
    read_state,
    sup_args,
)
from orchestrator.remote.command import Cmd
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.result import as_text

NAME = "ggml-rpc-server"
QUICK = ["sup.backoff=0.05", "sup.backoff_max=0.2", "sup.loop_n=3", "sup.loop_s=30", "sup.probe_s=0.05"]


@pytest.fixture
def host(tmp_path):
    t = LocalTransport("local-test")
    layout = HostLayout(str(tmp_path / "root"))
    install_helper(t, layout)
    yield t, layout
    t.run(layout.stop_cmd(NAME), check=False)


def _binary(layout: HostLayout, source: str) -> str:
    b = Path(layout.release("r1"), "bin")
    b.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, b / NAME)
    return str(b / NAME)


def _pid(layout: HostLayout) -> int | None:
    try:
        return int(Path(layout.log(f"{NAME}.pid")).read_text())
    except (OSError, ValueError):
        return None


def _until(cond, within_s: float = 10.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < within_s, "condition not met in time"
        time.sleep(0.02)


def _state(t, layout):
    st = read_state(t, layout, NAME)
    assert st is not None
    return st


def test_sup_args_and_endpoints():
    s = Supervision(backoff_s=0.2, backoff_max_s=2, hang_after_s=4)
    args = sup_args(s, health="127.0.0.2:8080", peer="127.0.0.3:50052")
    assert "sup.backoff=0.2" in args and "sup.backoff_max=2" in args and "sup.hang_s=4" in args
    assert args[-1] == "sup.peer=127.0.0.3:50052" and "sup.health=127.0.0.2:8080" in args
    assert not [a for a in sup_args(s) if a.startswith(("sup.health", "sup.peer", "sup.hang_s"))]
    assert ipv4_endpoint("127.0.0.2", 80) == "127.0.0.2:80"
    assert ipv4_endpoint("::1", 80) is None and ipv4_endpoint("host; rm -rf /", 80) is None
    with pytest.raises(ValueError, match="backoff_max_s"):
        Supervision(backoff_s=5, backoff_max_s=1)


def test_state_and_uptime_parsers():
    st = parse_state("state=given-up\nrestarts=4\nlast_exit=signal 9\nstarted_at=17\ngiven_up=1\njunk\n")
    assert (st.state, st.restarts, st.last_exit, st.started_at, st.given_up) == ("given-up", 4, "signal 9", 17, True)
    assert parse_state("restarts=x\nlast_exit=-\n").restarts == 0 and parse_state("").last_exit is None
    # A process started just now has run for seconds, whatever the age of the test run itself
    # (CI ran this 45 min into the suite, so /proc/self was the wrong process to ask).
    child = subprocess.Popen(["sleep", "30"])
    try:
        up = parse_uptime(Path("/proc/uptime").read_text(), Path(f"/proc/{child.pid}/stat").read_text())
    finally:
        child.kill()
        child.wait()
    assert up is not None and 0 <= up < 20
    stat = "7 (a ) b) S" + " 0" * 18 + " 500 0"  # field 22 = 500 ticks, after a name holding ") "
    assert parse_uptime("12.5 3.0", stat) == pytest.approx(12.5 - 500 / CLOCK_TICKS_PER_S)
    assert parse_uptime("garbage", "1 (a) b") is None


def test_killed_service_is_restarted_with_the_same_exe_and_argv(host):
    t, layout = host
    exe = _binary(layout, "/bin/sleep")
    out = as_text(t.run(layout.start_cmd(NAME, [exe, "300"], QUICK)).stdout)
    first = _pid(layout)
    assert f"pid={first}" in out
    os.kill(first, signal.SIGKILL)
    _until(lambda: _pid(layout) not in (None, first) and _state(t, layout).state == "running")
    st = _state(t, layout)
    assert st.restarts == 1 and st.last_exit == "signal 9" and st.supervisor_alive
    ident = as_text(t.run(layout.identity_cmd(NAME)).stdout)
    assert f"proc={NAME}:{_pid(layout)}:" in ident
    assert Path(f"/proc/{_pid(layout)}/cmdline").read_bytes() == f"{exe}\x00300\x00".encode()


def test_crash_loop_gives_up(host):
    t, layout = host
    exe = _binary(layout, "/bin/false")
    t.run(layout.start_cmd(NAME, [exe], QUICK))
    _until(lambda: _state(t, layout).given_up and not _state(t, layout).supervisor_alive)
    st = _state(t, layout)
    assert st.state == "given-up" and st.restarts == 2 and st.last_exit == "exit 1" and not st.supervisor_alive


def test_deliberate_stop_is_not_restarted_and_a_lease_holds_restarts(host):
    t, layout = host
    exe = _binary(layout, "/bin/sleep")
    t.run(layout.start_cmd(NAME, [exe, "300"], QUICK))
    first = _pid(layout)
    os.makedirs(os.path.join(layout.leases, "host.lock"))
    os.kill(first, signal.SIGKILL)
    _until(lambda: _state(t, layout).state == "passive-lease")
    time.sleep(0.5)  # ten backoffs: still nothing started under the lease
    assert _pid(layout) == first
    os.rmdir(os.path.join(layout.leases, "host.lock"))
    _until(lambda: _pid(layout) not in (None, first) and _state(t, layout).state == "running")
    second = _pid(layout)
    assert f"stopped={NAME}:{second}" in as_text(t.run(layout.stop_cmd(NAME)).stdout)
    time.sleep(0.5)
    st = _state(t, layout)
    assert st.state == "stopped" and not st.supervisor_alive and _pid(layout) is None


def test_environment_is_cleared(host):
    t, layout = host
    exe = _binary(layout, "/bin/sleep")
    t.run(Cmd(("env", "LLAMA_ARG_N_PARALLEL=1", *layout.start_cmd(NAME, [exe, "300"], QUICK).argv)))
    env = dict(e.split(b"=", 1) for e in Path(f"/proc/{_pid(layout)}/environ").read_bytes().split(b"\0") if e)
    assert sorted(env) == [b"HOME", b"LD_LIBRARY_PATH", b"PATH"]
    assert env[b"HOME"].decode() == layout.log(f"home/{NAME}")
    assert os.readlink(f"/proc/{_pid(layout)}/cwd") == layout.log(f"home/{NAME}")


def test_out_rotates_by_size_and_keeps_the_lines_in_order(host):
    t, layout = host
    exe = _binary(layout, os.path.realpath(sys.executable))
    code = (
        "import time\nfor i in range(400):\n    print(f'line {i:05d}', flush=True); time.sleep(0.002)\ntime.sleep(300)"
    )
    t.run(layout.start_cmd(NAME, [exe, "-c", code], [*QUICK, "sup.log_max=1500", "sup.log_keep=50"]))
    out = Path(layout.log(f"{NAME}.out"))
    _until(lambda: "line 00399" in out.read_text(), 30)
    time.sleep(0.2)
    rotated = sorted(out.parent.glob(f"{NAME}.out.*"), key=lambda p: -int(p.suffix[1:]))
    assert rotated, "nothing rotated"
    lines = [x for p in [*rotated, out] for x in p.read_text().splitlines()]
    # copy, then truncate (logrotate's copytruncate): a line written between the two can be lost
    assert lines == sorted(lines) and len(lines) >= 390 and lines[-1] == "line 00399"
    assert len(rotated) >= 2


def _release_with_manifest(layout: HostLayout) -> tuple[str, str]:
    """releases/r1 as a deploy leaves it: bin/NAME, lib/libggml.so, manifest.json; returns the
    service's path and the release-files digest pairctl passes (sup.files)."""
    import hashlib
    import json

    from orchestrator.hosts.supervisor import release_files_digest

    exe = _binary(layout, "/bin/sleep")
    rel = Path(layout.release("r1"))
    (rel / "lib").mkdir()
    (rel / "lib" / "libggml.so").write_bytes(b"\x7fELF the real one")
    files = {str(p.relative_to(rel)): hashlib.sha256(p.read_bytes()).hexdigest() for p in rel.rglob("*") if p.is_file()}
    (rel / "manifest.json").write_text(json.dumps({"files": files}))
    return exe, release_files_digest(files)


def test_a_restart_from_a_release_with_a_planted_library_is_refused(host):
    """Issue 49 item 5: a library planted in a running release was refused by deploy and reported
    by `status --verify-files`, but the supervisor's next restart (after a crash) loaded it. Now
    every start first checks the release against the manifest's digest; a planted file starts
    nothing, and the state says why (status reports it)."""
    t, layout = host
    exe, digest = _release_with_manifest(layout)
    t.run(layout.start_cmd(NAME, [exe, "300"], [*QUICK, f"sup.files={digest}"]))
    first = _pid(layout)
    assert first is not None
    _until(lambda: _state(t, layout).state == "running")
    ok = Path(layout.log("release-ok")).read_text().split()
    assert ok[0] == digest and len(ok) == 2  # the listing that passed, for the next start's shortcut
    os.kill(first, signal.SIGKILL)  # an unchanged release: restarted (by its stat, no re-hash needed)
    _until(lambda: _pid(layout) not in (None, first) and _state(t, layout).state == "running")
    second = _pid(layout)
    assert second is not None
    Path(layout.release("r1"), "lib", "libggml-cpu.so").write_bytes(b"\x7fELF planted")
    os.kill(second, signal.SIGKILL)
    _until(lambda: _state(t, layout).state == "refused" and not _state(t, layout).supervisor_alive)
    st = _state(t, layout)
    assert st.refused is not None and "differ from its manifest" in st.refused and st.restarts == 1
    assert not Path(f"/proc/{second}").exists() and "not started" in Path(layout.log(f"{NAME}.sup.log")).read_text()


@pytest.mark.parametrize("change", ["same-size rewrite", "removed"])
def test_a_changed_or_missing_release_file_is_refused_at_the_first_start(host, change):
    t, layout = host
    exe, digest = _release_with_manifest(layout)
    lib = Path(layout.release("r1"), "lib", "libggml.so")
    if change == "removed":
        lib.unlink()
    else:
        lib.write_bytes(b"\x7fELF the evil one"[: len(lib.read_bytes())].ljust(len(lib.read_bytes()), b"!"))
    r = t.run(layout.start_cmd(NAME, [exe, "300"], [*QUICK, f"sup.files={digest}"]), check=False)
    assert r.exit_status == 4 and "started nothing" in as_text(r.stderr)
    assert _state(t, layout).state == "refused"


def test_a_declared_file_replaced_under_a_running_server_stops_its_next_start(host, tmp_path):
    """Issue 49 item 3 (the supervisor's restarts): a grammar the profile declares, replaced on
    the host, was loaded by the next crash restart. sup.want=SHA256:PATH is re-hashed (cached by
    stat) before every start: unchanged, the restart goes ahead; replaced, nothing starts."""
    import hashlib

    t, layout = host
    exe = _binary(layout, "/bin/sleep")
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= "yes"\n')
    want = f"sup.want={hashlib.sha256(grammar.read_bytes()).hexdigest()}:{grammar}"
    t.run(layout.start_cmd(NAME, [exe, "300"], [*QUICK, want]))
    first = _pid(layout)
    assert first is not None
    _until(lambda: _state(t, layout).state == "running")
    os.kill(first, signal.SIGKILL)
    _until(lambda: _pid(layout) not in (None, first) and _state(t, layout).state == "running")
    second = _pid(layout)
    assert second is not None
    grammar.write_text('root ::= "no!"\n')  # the same size: only the hash tells
    os.kill(second, signal.SIGKILL)
    _until(lambda: _state(t, layout).state == "refused" and not _state(t, layout).supervisor_alive)
    st = _state(t, layout)
    assert st.refused == f"file {grammar} changed since it was deployed", st
    r = t.run(layout.start_cmd(NAME, [exe, "300"], [*QUICK, "sup.want=xyz:relative"]), check=False)
    assert r.exit_status != 0


def test_the_kept_listing_never_passes_a_release_changed_since(host):
    """run/release-ok spares a fresh supervisor the full hash of an unchanged release; a file
    planted after it was written changes the listing's stat, so the next start hashes and refuses."""
    t, layout = host
    exe, digest = _release_with_manifest(layout)
    args = [*QUICK, f"sup.files={digest}"]
    t.run(layout.start_cmd(NAME, [exe, "300"], args))
    _until(lambda: _state(t, layout).state == "running")
    t.run(layout.stop_cmd(NAME))
    t.run(layout.start_cmd(NAME, [exe, "300"], args))  # unchanged: the kept listing
    _until(lambda: _state(t, layout).state == "running")
    t.run(layout.stop_cmd(NAME))
    Path(layout.release("r1"), "lib", "libggml-cpu.so").write_bytes(b"\x7fELF planted")
    r = t.run(layout.start_cmd(NAME, [exe, "300"], args), check=False)
    assert r.exit_status == 4 and _state(t, layout).state == "refused"
