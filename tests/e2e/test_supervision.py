"""The pair stays up on its own: the hosts' supervisors (pairctl-svc `supervise`) on the lab's
real llama-server + ggml-rpc-server, deployed by `pairctl deploy`.

Faults are real signals sent to the real processes (by pid, from the pidfiles): kill -9 of
either service, SIGSTOP of llama-server, a port taken so llama-server exits at once on every
start (a crash loop). Deliberate stops and held leases must not be answered by a restart. The
lab inventory's `supervision` makes backoffs short (0.2 s doubling to 2 s, hung after 4 s).
Tests that leave the pair down put the baseline back (`deploy_baseline` redeploys when status
shows it not running).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, HostLayout
from orchestrator.hosts.probes import runtime_path
from orchestrator.hosts.supervisor import ipv4_endpoint, parse_state, sup_args
from orchestrator.remote.command import Cmd
from orchestrator.remote.pool import open_transport
from tests.plugins.pairs import deploy_baseline, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BACK_WITHIN_S = 30.0  # crash -> healthy again: backoff (<= 2 s) + start (~0.1 s) + probes, on a loaded machine


_wait = functools.partial(wait_until, every_s=0.05)  # a restart is judged to the tenth of a second


def _pid(root: str, name: str) -> int | None:
    try:
        return int(Path(root, "run", f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _state(root: str, name: str) -> dict[str, Any]:
    try:
        text = Path(root, "run", f"{name}.state").read_text()
    except OSError:
        return {}
    return parse_state(text).as_dict()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/health", timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _back_after(pair: Any, name: str, old_pid: int) -> float:
    """Seconds until NAME runs as a new pid and llama-server answers /health."""
    root = pair.roots()["native" if name == LLAMA_SERVER else "rpc"]

    def back() -> bool:
        new = _pid(root, name)
        return new is not None and new != old_pid and _alive(new) and _healthy(pair.base_url)

    return _wait(f"{name} back after pid {old_pid}", back, BACK_WITHIN_S)


def _status(cli: Any) -> tuple[int, dict[str, Any]]:
    r = cli("--json", "status", "--pair", "lab")
    return r.exit_code, json.loads(r.stdout)


def _host_of(st: dict[str, Any], role: str) -> dict[str, Any]:
    return next(h for h in st["hosts"].values() if h["role"] == role)


def _svc(pair: Any, role: str, sub: str, *args: str, prefix: tuple[str, ...] = ()) -> str:
    """Run the installed helper on the lab host over its real sshd."""
    host = pair.inventory.pair("lab").native if role == "native" else pair.inventory.pair("lab").rpc
    t = open_transport(pair.inventory, host)
    try:
        cmd = HostLayout(pair.roots()[role]).svc_cmd(sub, *args)
        res = t.run(Cmd((*prefix, *cmd.argv)), check=False, timeout=60)
        return res.stdout if isinstance(res.stdout, str) else res.stdout.decode()
    finally:
        t.close()


@pytest.fixture
def pair(deployed_lab, lab_packages, cli):
    """The baseline deployed and healthy; put back afterwards if a test left it down."""
    yield deployed_lab
    deploy_baseline(cli, lab_packages.id)


def test_killed_llama_server_is_restarted_with_the_same_identity(pair, cli):
    root = pair.roots()["native"]
    old = _pid(root, LLAMA_SERVER)
    assert old is not None
    before = _state(root, LLAMA_SERVER)["restarts"]
    os.kill(old, signal.SIGKILL)
    took = _back_after(pair, LLAMA_SERVER, old)
    print(f"kill -9 llama-server -> healthy again in {took:.2f} s")
    code, st = _status(cli)
    h = _host_of(st, "native")
    assert code == 0, st["problems"]
    assert h["running"] and h["matches_manifest"] and h["pid"] != old
    assert h["supervisor"]["restarts"] == before + 1
    assert h["supervisor"]["last_exit"] == "signal 9"
    assert h["supervisor"]["state"] == "running" and h["supervisor"]["uptime_s"] is not None
    r = cli("--json", "accept", "--pair", "lab", "--only", "identity")
    assert r.exit_code == 0, r.stdout[-3000:]


def test_killed_rpc_server_brings_both_back_and_accept_passes(pair, cli):
    nroot, rroot = pair.roots()["native"], pair.roots()["rpc"]
    old_rpc, old_native = _pid(rroot, RPC_SERVER), _pid(nroot, LLAMA_SERVER)
    assert old_rpc is not None and old_native is not None
    os.kill(old_rpc, signal.SIGKILL)
    took = _back_after(pair, RPC_SERVER, old_rpc)
    # llama-server cannot survive losing its peer: its supervisor restarts it once the port listens
    took_native = _wait(
        "llama-server restarted after its peer",
        lambda: _pid(nroot, LLAMA_SERVER) not in (None, old_native) and _healthy(pair.base_url),
        BACK_WITHIN_S,
    )
    print(f"kill -9 ggml-rpc-server -> rpc back in {took:.2f} s, llama-server healthy {took_native:.2f} s later")
    # restarted by its supervisor for the lost peer (or, had it noticed first, after its own abort)
    assert _state(nroot, LLAMA_SERVER)["last_exit"].startswith(("peer-lost", "signal", "exit")), _state(
        nroot, LLAMA_SERVER
    )
    r = cli("--json", "accept", "--pair", "lab", "--checks", "identity,cached_continuation")
    assert r.exit_code == 0, r.stdout[-3000:]
    code, st = _status(cli)
    assert code == 0, st["problems"]
    assert _host_of(st, "rpc")["supervisor"]["last_exit"] == "signal 9"


def test_stopped_llama_server_is_restarted_as_hung(pair, cli):
    root = pair.roots()["native"]
    old = _pid(root, LLAMA_SERVER)
    assert old is not None
    os.kill(old, signal.SIGSTOP)
    try:
        took = _back_after(pair, LLAMA_SERVER, old)
    finally:
        if _alive(old):
            os.kill(old, signal.SIGCONT)
    print(f"SIGSTOP llama-server -> restarted and healthy in {took:.2f} s (hang_after_s 4)")
    assert not _alive(old)
    assert _state(root, LLAMA_SERVER)["last_exit"].startswith("hung")


def test_deliberate_stop_is_never_restarted(pair, cli):
    root = pair.roots()["native"]
    old = _pid(root, LLAMA_SERVER)
    out = _svc(pair, "native", "stop", LLAMA_SERVER)
    assert f"stopped={LLAMA_SERVER}:{old}" in out
    time.sleep(4.0)  # 20x the first backoff, 8 probe intervals
    assert _pid(root, LLAMA_SERVER) is None and not _healthy(pair.base_url)
    assert _state(root, LLAMA_SERVER)["state"] == "stopped"
    code, st = _status(cli)
    assert code == 1 and not _host_of(st, "native")["supervisor"]["supervisor_alive"]


def test_nothing_restarts_while_a_lease_is_held(pair, cli):
    root = pair.roots()["native"]
    r = cli("lease", "take", "lab-native", "--purpose", "supervision test", "--ttl", "10m")
    assert r.exit_code == 0, r.output
    nonce = re.search(r"nonce: ([0-9a-f]{32})", r.stdout).group(1)
    old = _pid(root, LLAMA_SERVER)
    assert old is not None
    try:
        os.kill(old, signal.SIGKILL)
        time.sleep(4.0)
        assert _pid(root, LLAMA_SERVER) == old and not _alive(old), "restarted under a held lease"
        assert _state(root, LLAMA_SERVER)["state"] == "passive-lease"
    finally:
        r = cli("lease", "release", "lab-native", "--nonce", nonce)
        assert r.exit_code == 0, r.output
    took = _back_after(pair, LLAMA_SERVER, old)
    print(f"lease released -> llama-server healthy in {took:.2f} s")


def test_crash_loop_gives_up_and_status_says_so(pair, cli):
    """llama-server exits at once on every start while another process holds its port."""
    root = pair.roots()["native"]
    host, port = pair.base_url.removeprefix("http://").rsplit(":", 1)
    old = _pid(root, LLAMA_SERVER)
    assert old is not None
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # under a held lease the supervisor stays passive, so the port is taken before any restart
    r = cli("lease", "take", "lab-native", "--purpose", "crash-loop test", "--ttl", "10m")
    assert r.exit_code == 0, r.output
    nonce = re.search(r"nonce: ([0-9a-f]{32})", r.stdout).group(1)
    try:
        try:
            os.kill(old, signal.SIGKILL)
            _wait("old llama-server gone", lambda: not _alive(old), 5)
            # the killed server's sockets of earlier tests' connections may hold the port for a while
            # (orphaned FIN_WAIT, up to tcp_fin_timeout): retry, still under the lease
            t0 = time.monotonic()
            while True:
                try:
                    blocker.bind((host, int(port)))
                    break
                except OSError:
                    assert time.monotonic() - t0 < 90, "the port stayed in use"
                    time.sleep(0.2)
            blocker.listen(1)
        finally:
            r = cli("lease", "release", "lab-native", "--nonce", nonce)
            assert r.exit_code == 0, r.output
        _wait("supervisor gave up", lambda: _state(root, LLAMA_SERVER).get("given_up"), 60)
        st = _state(root, LLAMA_SERVER)
        assert st["state"] == "given-up" and st["restarts"] >= 3, st
        code, out = _status(cli)
        assert code == 1
        assert any("gave up on llama-server after a crash loop" in p for p in out["problems"]), out["problems"]
        r = cli("status", "--pair", "lab")
        assert "given-up" in r.stdout, r.stdout
    finally:
        blocker.close()


def test_cleared_environment_ignores_a_planted_llama_arg(pair, cli, tmp_path):
    """A host whose login environment carries LLAMA_ARG_ENDPOINT_SLOTS=0 and LLAMA_API_KEY (llama.cpp
    reads flags from LLAMA_ARG_* variables) would turn /slots off and make the server demand a
    key it was never given: shown with the same binary run directly; started by pairctl-svc from
    an SSH session that carries them, they have no effect."""
    root = pair.roots()["native"]
    old = _pid(root, LLAMA_SERVER)
    argv = Path(f"/proc/{old}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    planted = ("env", "LLAMA_API_KEY=planted-by-the-host", "LLAMA_ARG_ENDPOINT_SLOTS=0")

    # the binary with the planted environment, on a port of its own: the variable takes effect
    address = pair.inventory.host(pair.inventory.pair(pair.pair).native).address
    s = socket.socket()
    s.bind((address, 0))
    free = s.getsockname()[1]
    s.close()
    direct = [a.decode() for a in argv]
    direct[direct.index("--port") + 1] = str(free)
    for flag in ("--log-file", "--rpc"):  # its own log; no RPC (ggml-rpc-server serves one client at a time)
        if flag in direct:
            i = direct.index(flag)
            del direct[i : i + 2]
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": os.path.dirname(direct[0]),
        "LLAMA_API_KEY": "planted-by-the-host",
        "LLAMA_ARG_ENDPOINT_SLOTS": "0",
    }
    log = tmp_path / "direct.out"
    proc = subprocess.Popen(direct, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        url = f"http://{address}:{free}"
        try:
            _wait("direct llama-server healthy", lambda: _healthy(url), 30)
        except AssertionError:
            raise AssertionError(log.read_text()[-3000:]) from None
        assert httpx.get(url + "/props", timeout=5, trust_env=False).status_code == 401
        slots = httpx.get(
            url + "/slots", timeout=5, trust_env=False, headers={"Authorization": "Bearer planted-by-the-host"}
        )
        assert slots.status_code == 501, slots.text
    finally:
        proc.kill()
        proc.wait(timeout=30)

    # the same argv started by pairctl-svc from an SSH session carrying the variables
    _svc(pair, "native", "stop", LLAMA_SERVER)
    p = pair.inventory.pair("lab")
    sup = sup_args(
        pair.inventory.supervision,
        health=ipv4_endpoint(pair.base_url.removeprefix("http://").rsplit(":", 1)[0], p.server_port),
        peer=ipv4_endpoint(pair.inventory.rpc_bind("lab"), p.rpc_port),
    )
    out = _svc(pair, "native", "start", LLAMA_SERVER, *sup, *[a.decode() for a in argv], prefix=planted)
    new = int(re.search(r"^pid=(\d+)$", out, re.M).group(1))
    _wait("supervised llama-server healthy", lambda: _healthy(pair.base_url), 30)
    assert httpx.get(pair.base_url + "/props", timeout=5, trust_env=False).status_code == 200
    assert httpx.get(pair.base_url + "/slots", timeout=5, trust_env=False).status_code == 200
    environ = Path(f"/proc/{new}/environ").read_bytes().split(b"\0")
    assert not [e for e in environ if e.startswith(b"LLAMA_")]
    names = sorted(e.split(b"=", 1)[0].decode() for e in environ if e)
    # the cleared environment plus the RPC guard's three (hosts/rpc_guard.c): the shim that answers the
    # route key's challenge, the RPC address it answers for, and the key's PATH (never the key itself)
    assert names == ["HOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "PAIRCTL_RPC_DIAL", "PAIRCTL_RPC_KEY", "PATH"], names
    env = {k.decode(): v.decode() for k, v in (e.split(b"=", 1) for e in environ if e)}
    assert env["LD_PRELOAD"].startswith(f"{root}/bin/") and env["PAIRCTL_RPC_KEY"] == f"{root}/secrets/rpc.key"
    home = env["HOME"]
    assert home == f"{root}/run/home/{LLAMA_SERVER}" and (os.stat(home).st_mode & 0o777) == 0o700
    line = next(x for x in out.splitlines() if x.startswith("proc="))
    assert base64.b64decode(line.split(":")[3]).rstrip(b"\0").split(b"\0") == argv


def _redeployed(pair: Any, cli: Any) -> None:
    """The baseline deployed again by this pairctl: its helper and supervisor options on the hosts
    (an active pair left by an earlier version runs the supervisors that version started)."""
    pkg = pair.package_id
    r = cli("--json", "deploy", "--pair", "lab", "--packages", pkg, pkg, "--profile", "lab", "--skip-accept")
    assert r.exit_code == 0, r.stderr[-3000:]


def _sup_pid(root: str, name: str) -> int:
    return int(Path(root, "run", f"{name}.sup.pid").read_text().split()[0])


def test_stopped_rpc_server_while_idle_is_seen_and_restarted(pair, cli):
    """Issue 33 item 2: ggml-rpc-server SIGSTOPped while idle. The kernel still accepts on its port
    and llama-server's /health stays 200, so a TCP connect or /health sees nothing. Status and
    the identity check must report it (its supervisor is held stopped meanwhile, so the report
    is not raced by the restart); let go, the supervisor kills it as hung within hang_after_s and
    llama-server follows its peer back."""
    _redeployed(pair, cli)
    rroot, nroot = pair.roots()["rpc"], pair.roots()["native"]
    old, sup = _pid(rroot, RPC_SERVER), _sup_pid(rroot, RPC_SERVER)
    assert old is not None
    os.kill(sup, signal.SIGSTOP)
    os.kill(old, signal.SIGSTOP)
    try:
        assert _healthy(pair.base_url)  # what made it invisible
        code, st = _status(cli)
        assert code == 1 and any("stopped (SIGSTOP)" in p for p in st["problems"]), st["problems"]
        assert _host_of(st, "rpc")["rpc_probe"] == "stopped"
        r = cli("--json", "accept", "--pair", "lab", "--checks", "identity")
        assert r.exit_code != 0 and "stopped (SIGSTOP)" in r.stdout, r.stdout[-3000:]
    finally:
        os.kill(sup, signal.SIGCONT)
    try:
        took = _back_after(pair, RPC_SERVER, old)
    finally:
        if _alive(old):
            os.kill(old, signal.SIGCONT)
    print(f"SIGSTOP ggml-rpc-server (idle) -> restarted as hung, pair healthy in {took:.2f} s (hang_after_s 4)")
    assert _state(rroot, RPC_SERVER)["last_exit"].startswith("hung (stopped"), _state(rroot, RPC_SERVER)
    _wait("llama-server back after its peer", lambda: _healthy(pair.base_url), BACK_WITHIN_S)
    assert _pid(nroot, LLAMA_SERVER) is not None


def test_rpc_hello_probe_answers_only_while_no_client_is_served(pair, cli):
    """The probe's wire format against the real ggml-rpc-server: with llama-server connected it
    is not sent (one client at a time: it would wait behind llama-server); with llama-server
    stopped, the RPC HELLO is answered with the protocol version."""
    _redeployed(pair, cli)
    bind = pair.inventory.rpc_bind("lab")
    port = str(pair.inventory.pair("lab").rpc_port)
    assert "rpc=ggml-rpc-server:serving" in _svc(pair, "rpc", "rpc-probe", RPC_SERVER, bind, port, "3")
    _svc(pair, "native", "stop", LLAMA_SERVER)
    out = _svc(pair, "rpc", "rpc-probe", RPC_SERVER, bind, port, "3")
    assert re.search(r"^rpc=ggml-rpc-server:hello:7\.\d+\.\d+$", out, re.M), out


def test_killed_supervisor_is_a_status_problem(pair, cli):
    """Issue 33 item 8: kill -9 of a supervisor left status at exit 0 while the next crash of its
    service would never be restarted."""
    root = pair.roots()["native"]
    sup = _sup_pid(root, LLAMA_SERVER)
    os.kill(sup, signal.SIGKILL)
    _wait("supervisor gone", lambda: not _alive(sup), 10)
    code, st = _status(cli)
    assert code == 1 and any("supervisor of llama-server is not running" in p for p in st["problems"]), st["problems"]
    assert _host_of(st, "native")["running"]  # the service itself still serves


def test_an_expired_lease_does_not_keep_supervision_off(pair, cli):
    """Issue 33 item 8: an expired lease (host time) kept llama-server down until it was released."""
    root = pair.roots()["native"]
    r = cli("lease", "take", "lab-native", "--purpose", "supervision test (expires)", "--ttl", "3s")
    assert r.exit_code == 0, r.output
    nonce = re.search(r"nonce: ([0-9a-f]{32})", r.stdout).group(1)
    old = _pid(root, LLAMA_SERVER)
    assert old is not None
    try:
        os.kill(old, signal.SIGKILL)
        took = _back_after(pair, LLAMA_SERVER, old)  # restarted once the lease expired, lock still there
        assert Path(root, "leases", "host.lock").is_dir()
    finally:
        freed = cli("lease", "release", "lab-native", "--nonce", nonce)
        assert freed.exit_code == 0, freed.output
    print(f"kill -9 llama-server under a 3 s lease -> healthy again in {took:.2f} s, lease not released")


def test_a_start_from_the_runtime_dir_is_what_logs_and_checks_read(pair, cli):
    """Issue 49: with run/ on a read-only filesystem, `pairctl start` starts llama-server with its
    pidfiles, state and output in the runtime dir, and run/ keeps the previous run's files. `pairctl
    logs` and the identity check's split (read from llama-server's --log-file) read run/ directly:
    the previous run's lines, shown as if they were this run's. The lab's runs print the same lines,
    so the previous run's files are told apart by what they hold (one line each, written after the
    stop, as a run before would have left them). leases/ (in run/ on the lab) stays writable, by a
    bind mount of its own: pairctl holds the host as a deploy that held it before its disk turned would."""
    root = pair.roots()["native"]
    run = os.path.realpath(os.path.join(root, "run"))
    stale = "a line of the previous run"
    r = cli("stop", "--pair", "lab")
    assert r.exit_code == 0, r.output[-3000:]
    for f in (f"{LLAMA_SERVER}.out", f"{LLAMA_SERVER}.log"):
        Path(run, f).write_text(stale + "\n")
    leases = os.path.realpath(os.path.join(root, "leases"))
    mounted: list[str] = []  # undone in the finally, newest first: only those made (a second that failed is not)
    try:
        subprocess.run(["mount", "--bind", leases, leases], check=True)
        mounted.append(leases)
        subprocess.run(["mount", "--rbind", run, run], check=True)  # leases/' mount goes along, writable
        mounted.append(run)
        subprocess.run(["mount", "-o", "remount,bind,ro", run], check=True)
        r = cli("--json", "start", "--pair", "lab")
        assert r.exit_code == 0, r.output[-3000:]
        assert Path(runtime_path(os.geteuid(), root), f"{LLAMA_SERVER}.state").is_file()  # started there
        r = cli("--json", "logs", "--pair", "lab", "--host", "native", "-n", "400")
        assert r.exit_code == 0, r.output[-3000:]
        (log,) = json.loads(r.stdout)["logs"]
        text = "\n".join(log["lines"])
        assert stale not in text and "load_tensors:" in text, text[-2000:]
        assert log["path"] == f"{runtime_path(os.geteuid(), root)}/{LLAMA_SERVER}.out"
        r = cli("--json", "accept", "--pair", "lab", "--only", "identity")
        assert r.exit_code == 0, r.output[-3000:]
        r = cli("--json", "diff", "--pair", "lab")  # the moved --log-file is the helper's, not a drift
        assert r.exit_code == 0 and json.loads(r.stdout)["same"], r.output[-3000:]
        assert Path(run, f"{LLAMA_SERVER}.log").read_text() == stale + "\n"  # run/ took nothing
    finally:  # nothing here raises: the body's failure, if any, is the one reported
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", m], check=False)
        restarted = cli("restart", "--pair", "lab")  # back in run/ for the tests after this one
    assert restarted.exit_code == 0, restarted.output[-3000:]
    assert _pid(root, LLAMA_SERVER) is not None
