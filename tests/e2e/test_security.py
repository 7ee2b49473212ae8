"""Issue 10, security properties, each with a test that fails if the property is broken.

Already proven elsewhere (referenced, not duplicated):
  - unknown / changed host keys are refused before anything runs:
      tests/integration/test_transport.py::test_unknown_host_key_refused_before_anything_runs,
      ::test_missing_known_hosts_file_is_unknown_key, ::test_changed_host_key_refused_with_both_fingerprints,
      ::test_host_key_error_is_not_retried; and for a whole deploy
      tests/e2e/test_deploy.py::test_changed_host_key_refused_before_any_host
  - command arguments cannot inject shell (hypothesis over a real sshd):
      tests/integration/test_transport.py::test_args_reach_remote_program_unchanged (and
      ::test_control_unquoted_line_is_mangled, which shows the property test can fail)
  - ggml-rpc-server bound to 0.0.0.0 without explicit opt-in is refused at config load:
      tests/unit/test_config.py::test_rpc_bind_any_needs_opt_in
  - a lease cannot be released by a holder with the wrong nonce:
      tests/integration/test_leases.py::test_wrong_nonce_refused_then_release_verified

Here, on a deployed pair (`sec`: the lab's sshd hosts, its own install roots and ports, and an
`api_key_file`), deployed with acceptance checks running against it:
  - the API key reaches llama-server only through --api-key-file: never in /proc/<pid>/cmdline,
    never in pairctl's logs, the hosts' run logs, or the evidence store; requests without it get
    401 and acceptance passes with it;
  - the running ggml-rpc-server listens only on the inventory's address (its own sockets, read from
    /proc/<pid>/fd and /proc/net/tcp);
  - the API key never crosses the network in cleartext (issue 32 item 6): captured on the wire
    (lo, AF_PACKET) while `pairctl accept` runs, every segment that carries it is on the native
    host's own last hop (sshd -> llama-server), and pairctl itself opens no TCP connection to the
    server: its requests travel inside the SSH connection to the native host;
  - nothing pairctl created under the install roots is world-writable.
Each property's checker is first shown to flag a planted violation.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.faults.harness import (
    FaultPair,
    lab_for,
    lease_held,
    make_pair,
    packages_for,
    service_pid_of,
    teardown_pair,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHECKS = ("identity", "two_lane_near_full", "cached_continuation")


# -- the checkers (pure over /proc and files), each shown to fail first --------------------------


def cmdline_of(pid: int) -> list[str]:
    return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def secret_in_argv(argv: list[str], secret: str) -> list[str]:
    """Arguments that carry the secret or pass a key by value (`--api-key VALUE`)."""
    bad = [a for a in argv if secret in a]
    bad += [a for a in argv if a == "--api-key" or a.startswith("--api-key=")]
    return bad


def files_containing(roots: list[Path], secret: str, *, skip: set[Path] = frozenset()) -> list[Path]:
    """Every regular file under `roots` whose bytes contain the secret (except `skip`)."""
    needle = secret.encode()
    hits = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                p = Path(dirpath) / name
                if p in skip or p.is_symlink() or not p.is_file():
                    continue
                try:
                    if needle in p.read_bytes():
                        hits.append(p)
                except OSError:
                    pass
    return hits


def world_writable(roots: list[Path]) -> list[str]:
    """Files and directories under `roots` (roots included) that others may write."""
    bad = []
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for p in [Path(dirpath)] + [Path(dirpath) / n for n in dirs + files]:
                try:
                    st = p.lstat()
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    continue  # a symlink's own mode means nothing; its target is walked
                if st.st_mode & stat.S_IWOTH:
                    bad.append(f"{p} {stat.filemode(st.st_mode)}")
    return sorted(set(bad))


def _tcp_tables() -> dict[str, tuple[str, int, str]]:
    """inode -> (local address, port, state) for IPv4 and IPv6 TCP sockets."""
    out = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            addr_hex, port_hex = f[1].split(":")
            raw = bytes.fromhex(addr_hex)
            if v6:
                addr = str(ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))))
            else:
                addr = str(ipaddress.IPv4Address(raw[::-1]))
            out[f[9]] = (addr, int(port_hex, 16), f[3])
    return out


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket process `pid` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    tables = _tcp_tables()
    return {(a, p) for i, (a, p, state) in tables.items() if i in inodes and state == "0A"}


def test_checkers_flag_planted_violations(tmp_path):
    secret = "sk-planted-" + os.urandom(6).hex()
    assert secret_in_argv(["llama-server", "--api-key", "x"], secret)
    assert secret_in_argv(["llama-server", f"--api-key={secret}"], secret)
    assert not secret_in_argv(["llama-server", "--api-key-file", "/r/secrets/api-key"], secret)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "a.log").write_text(f"header Authorization: Bearer {secret}\n")
    assert files_containing([tmp_path], secret) == [tmp_path / "log" / "a.log"]
    (tmp_path / "w").mkdir()
    os.chmod(tmp_path / "w", 0o777)
    (tmp_path / "f").write_text("x")
    os.chmod(tmp_path / "f", 0o666)
    assert {b.split()[0] for b in world_writable([tmp_path])} == {str(tmp_path / "w"), str(tmp_path / "f")}
    # a listener on every interface is seen as 0.0.0.0 for its own pid
    code = (
        "import socket,time,sys\ns=socket.socket();s.bind(('0.0.0.0',0));s.listen();"
        "print(s.getsockname()[1],flush=True);time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        assert listening_addresses(p.pid) == {("0.0.0.0", port)}
    finally:
        p.kill()
        p.wait()


# -- the pair ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sec_pair(request, pairctl_home):
    home, inv_path, inv = lab_for(request, pairctl_home)
    packages = packages_for(request, pairctl_home)
    fp = make_pair(home, inv_path, inv, packages, root_mb=None, name="sec", ports=(8192, 50192))
    yield fp
    teardown_pair(fp)


@pytest.fixture(scope="module")
def deployed_sec(sec_pair: FaultPair):
    """The `sec` pair deployed with its API key, acceptance checks run during the deploy."""
    fp = sec_pair
    pkg = fp.packages[0]
    args = ["--json", "deploy", "--pair", fp.name, "--packages", pkg, pkg]
    for c in CHECKS:
        args += ["--checks", c]
    p = fp.run(*args, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["outcome"] == "passed"
    return fp, out


def test_api_key_only_through_file(deployed_sec):
    fp, out = deployed_sec
    pid = service_pid_of(fp, "native")
    assert pid is not None
    argv = cmdline_of(pid)
    assert "--api-key-file" in argv, argv
    assert secret_in_argv(argv, fp.api_key) == [], argv
    key_path = Path(argv[argv.index("--api-key-file") + 1])
    assert key_path.read_text().strip() == fp.api_key
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_path.parent.stat().st_mode) == 0o700
    for rpid in filter(None, [service_pid_of(fp, "rpc")]):
        assert secret_in_argv(cmdline_of(rpid), fp.api_key) == []


def test_api_key_never_in_logs_or_receipts(deployed_sec):
    fp, out = deployed_sec
    # run an acceptance through `pairctl accept` too, so its logs and receipt are in the haystack
    a = fp.run("--json", "accept", "--pair", fp.name, "--only", "identity", timeout=600)
    assert a.returncode == 0, a.stderr[-2000:]
    assert fp.api_key not in a.stdout + a.stderr
    key_files = {fp.roots["native"] / "secrets" / "api-key", fp.home.root / fp.name / "api-key"}
    hits = files_containing(
        [
            fp.home.logs,
            fp.home.evidence,
            fp.roots["native"] / "run",
            fp.roots["rpc"] / "run",
            fp.roots["native"],
            fp.roots["rpc"],
        ],
        fp.api_key,
        skip=key_files,
    )
    assert hits == [], f"the API key leaked into {hits}"
    receipt = fp.home.evidence / "receipts" / f"{out['receipt']}.json"
    assert receipt.is_file()  # the deploy's receipt exists and was in the haystack


def test_unauthenticated_request_refused_and_authenticated_served(deployed_sec):
    fp, _ = deployed_sec
    pair_host = fp.base_inventory.hosts[fp.base_hosts["native"]].address
    url = f"http://{pair_host}:8192"
    with httpx.Client(timeout=30, trust_env=False) as c:
        body = {"prompt": "Hello", "n_predict": 4}
        assert c.post(url + "/completion", json=body).status_code == 401
        assert c.get(url + "/props").status_code == 401
        assert (
            c.post(url + "/completion", json=body, headers={"Authorization": "Bearer wrong-" + fp.api_key}).status_code
            == 401
        )
        ok = c.post(url + "/completion", json=body, headers={"Authorization": f"Bearer {fp.api_key}"})
        assert ok.status_code == 200 and "content" in ok.json()


def test_acceptance_passed_with_the_key_set(deployed_sec):
    fp, out = deployed_sec
    from orchestrator.evidence.store import EvidenceStore

    r = EvidenceStore(fp.home.evidence).load(out["receipt"])
    accept = r.step("accept")
    assert accept is not None and accept.outcome == "passed", accept
    assert accept.data.get("checks") == list(CHECKS), accept.data  # the suite ran, not "skipped"
    for c in CHECKS:
        step = r.step(f"check:{c}")
        assert step is not None and step.outcome == "passed", (c, step)


def test_rpc_server_listens_only_on_inventory_address(deployed_sec):
    fp, _ = deployed_sec
    pid = service_pid_of(fp, "rpc")
    assert pid is not None
    want = fp.base_inventory.hosts[fp.base_hosts["rpc"]].address
    listening = listening_addresses(pid)
    assert listening == {(want, 50192)}, listening
    argv = cmdline_of(pid)
    assert argv[argv.index("-H") + 1] == want
    # and from another loopback address nothing answers on that port
    with socket.socket() as s:
        s.settimeout(1)
        assert s.connect_ex(("127.0.0.1", 50192)) != 0


def test_nothing_pairctl_created_is_world_writable(deployed_sec):
    fp, _ = deployed_sec
    runs = [Path(os.path.realpath(r / "run")) for r in fp.roots.values()]  # run/ is a link to the state_dir
    assert world_writable([fp.roots["native"], fp.roots["rpc"], *runs]) == []
    # every file pairctl wrote is there to be judged: releases, run/ (links, route, leases), secrets/
    for role in ("native", "rpc"):
        names = {p.name for p in fp.roots[role].iterdir()} | {p.name for p in (fp.roots[role] / "run").iterdir()}
        assert {"releases", "current", "run", "leases", "route.json", "bin"} <= names, names


# -- the API key on the wire (issue 32 item 6) ---------------------------------------------------


class LoCapture:
    """Every IPv4 TCP segment on `lo` to PORT whose payload holds NEEDLE: (source port, payload).
    A real capture (AF_PACKET, as tcpdump reads it), so what a client sends is what is judged."""

    def __init__(self, port: int, needle: bytes) -> None:
        self.port, self.needle = port, needle
        self.hits: list[tuple[int, bytes]] = []
        self.segments = 0
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
        self._sock.bind(("lo", 0))
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        drained_by = None  # once stopped, what is queued is still read: until a quiet 0.2 s, at most 3 s
        while drained_by is None or time.monotonic() < drained_by:
            if drained_by is None and self._stop.is_set():
                drained_by = time.monotonic() + 3
            try:
                frame = self._sock.recv(1 << 17)
            except TimeoutError:
                if self._stop.is_set():
                    return
                continue
            ip = frame[14:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            ihl = (ip[0] & 0x0F) * 4
            tcp = ip[ihl:]
            sport, dport = struct.unpack("!HH", tcp[:4])
            if dport != self.port:
                continue
            self.segments += 1
            payload = tcp[(tcp[12] >> 4) * 4 :]
            if self.needle in payload:
                self.hits.append((sport, bytes(payload[:200])))

    def __enter__(self) -> LoCapture:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self._sock.close()


class ConnectLog:
    """The local port of every TCP connection this process opens to (address, port)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, address: str, port: int) -> None:
        self.ports: list[int] = []
        real = socket.socket.connect

        def connect(sock: socket.socket, addr: object) -> None:
            real(sock, addr)
            if isinstance(addr, tuple) and addr[:2] == (address, port):
                self.ports.append(sock.getsockname()[1])

        monkeypatch.setattr(socket.socket, "connect", connect)


def capture_allowed() -> bool:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003)).close()
    except (PermissionError, OSError, AttributeError):
        return False
    return True


def test_api_key_never_crosses_the_network_in_cleartext(deployed_sec, monkeypatch):
    if not capture_allowed():
        pytest.skip("capturing on lo needs CAP_NET_RAW")
    fp, _ = deployed_sec
    address = fp.base_inventory.hosts[fp.base_hosts["native"]].address
    needle = fp.api_key.encode()
    # the checker first flags a planted violation: a client of this process sending the key directly
    log = ConnectLog(monkeypatch, address, 8192)
    with LoCapture(8192, needle) as direct:
        with httpx.Client(timeout=30, trust_env=False) as c:
            assert c.get(f"http://{address}:8192/props", headers={"Authorization": f"Bearer {fp.api_key}"}).is_success
    assert direct.hits and {p for p, _ in direct.hits} <= set(log.ports), (direct.hits, log.ports)
    # pairctl's acceptance, in this process: /props, /slots and completions, all with the key
    log.ports.clear()
    with LoCapture(8192, needle) as cap:
        a = fp.cli("--json", "accept", "--pair", fp.name, "--only", "identity", "--only", "cached_continuation")
    assert a.returncode == 0, a.stderr[-2000:]
    assert log.ports == [], f"pairctl opened {len(log.ports)} TCP connections to the server itself"
    assert cap.hits, f"no segment with the key on lo at all ({cap.segments} to the port): the capture saw nothing"
    assert not {p for p, _ in cap.hits} & set(log.ports)


# -- the RPC port (issue 32 item 2) ---------------------------------------------------------------

# ggml-rpc-server's HELLO (ggml/src/ggml-rpc/ggml-rpc.cpp): command 14, u64 LE size 24, 24 zero bytes
HELLO = bytes([14]) + (24).to_bytes(8, "little") + bytes(24)
STRAY = "127.0.0.93"  # an address no lab uses (the labs: 127.0.0.2-81)


def stray_client(address: str, port: int) -> socket.socket | str:
    """A client from an address no inventory names, its HELLO sent; "reset" when the server's
    guard reset it before that: an idle server accepts at once, and on loopback the guard's RST
    can arrive before connect() has reported success or before the HELLO is written."""
    s = socket.socket()
    s.bind((STRAY, 0))
    s.settimeout(5)
    try:
        s.connect((address, port))  # the kernel completes the handshake into the listen backlog
        s.sendall(HELLO)
    except (ConnectionResetError, BrokenPipeError):
        s.close()
        return "reset"
    return s


def close_stray(s: socket.socket | str) -> None:
    if not isinstance(s, str):
        s.close()


def answer_of(s: socket.socket | str, within_s: float) -> bytes | str:
    """What the server sent back: bytes (a HELLO answer when 36 arrive), or why none came."""
    if isinstance(s, str):
        return s
    s.settimeout(within_s)
    try:
        data = s.recv(64)
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "no answer yet"
    return data or "closed"


def test_rpc_server_serves_only_the_native_host(deployed_sec):
    """Issue 32 #2, as it was run: a client from a third address held the RPC server's one client
    slot through a llama-server restart (HELLO answered, /health down for 44 s). Now the server
    runs with pairctl's guard preloaded, verified on the host (mapped, the list from the
    inventory): the stray client is reset without a byte, llama-server comes back, and the
    server's log names the refused peer."""
    fp, _ = deployed_sec
    rpc_addr = fp.base_inventory.hosts[fp.base_hosts["rpc"]].address
    native_addr = fp.base_inventory.hosts[fp.base_hosts["native"]].address
    stray = stray_client(rpc_addr, 50192)  # waits in the backlog behind llama-server's connection
    try:
        npid = service_pid_of(fp, "native")
        assert npid is not None
        os.kill(npid, 9)  # its supervisor starts it again; the RPC server accepts the next client
        got = answer_of(stray, 30)
        assert got in ("reset", "closed"), f"the stray client got {got!r}"
        deadline = time.monotonic() + 60
        healthy = False
        while time.monotonic() < deadline and not healthy:
            try:
                healthy = httpx.get(f"http://{native_addr}:8192/health", timeout=2, trust_env=False).status_code == 200
            except httpx.HTTPError:
                pass
            if not healthy:
                time.sleep(0.3)
        assert healthy, "llama-server did not come back within 60 s"
        assert service_pid_of(fp, "native") != npid
    finally:
        close_stray(stray)
    out = (fp.roots["rpc"] / "run" / "ggml-rpc-server.out").read_text(errors="replace")
    assert f"refused a connection from {STRAY}" in out, out[-2000:]
    # what did it: the guard mapped into the running server, with the inventory's list
    rpid = service_pid_of(fp, "rpc")
    assert rpid is not None
    assert str(fp.roots["rpc"] / "bin" / "pairctl-rpc-guard.so") in Path(f"/proc/{rpid}/maps").read_text()
    env = Path(f"/proc/{rpid}/environ").read_bytes().split(b"\0")
    assert b"PAIRCTL_RPC_ALLOW=127.0.0.1" in env, env  # the lab's hosts reach each other from 127.0.0.1


STRANGER_CLIENT = """
import socket, sys
s = socket.socket(); s.settimeout(30); got = b""
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    s.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))  # the ggml RPC HELLO
    got = b""
    while True:
        b = s.recv(64)
        if not b:
            break
        got += b
    print("closed", got.hex())
except ConnectionResetError:
    print("reset", got.hex())
except OSError as e:
    print("error", e)
"""


@pytest.fixture
def stranger():
    """A real second local user (issue 49 item 4): made here, removed after."""
    if os.geteuid() != 0 or not all(map(shutil.which, ("useradd", "setpriv", "/usr/bin/python3"))):
        pytest.skip("a second local user needs root with useradd, setpriv and /usr/bin/python3")
    name = f"pcs{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def test_a_local_stranger_at_the_peers_address_gets_nothing(deployed_sec, stranger):
    """Issue 49 item 4, as it was run: an unprivileged local user connecting from the allowed
    address (127.0.0.1 in the lab) got HELLO answers and held the server's slot. Now the guard
    challenges every allowed peer for the route key (secrets/rpc.key, 0600, on both hosts): the
    stranger, who cannot read it, gets the challenge and a reset, never a HELLO answer, while the
    pairctl-run llama-server (the shim preloaded with the key) comes back and serves."""
    fp, _ = deployed_sec
    rpc_addr = fp.base_inventory.hosts[fp.base_hosts["rpc"]].address
    native_addr = fp.base_inventory.hosts[fp.base_hosts["native"]].address
    port = 50192  # sec_pair's
    for role in ("native", "rpc"):  # the key: the same 32 bytes on both hosts, owner-only
        key = fp.roots[role] / "secrets" / "rpc.key"
        assert stat.S_IMODE(key.stat().st_mode) in (0o600, 0o400), key
        assert len(key.read_bytes()) == 32
    assert (fp.roots["native"] / "secrets" / "rpc.key").read_bytes() == (
        fp.roots["rpc"] / "secrets" / "rpc.key"
    ).read_bytes()
    shim = fp.roots["native"] / "bin" / "pairctl-rpc-guard.so"
    npid = service_pid_of(fp, "native")
    assert npid is not None
    env = Path(f"/proc/{npid}/environ").read_bytes().split(b"\0")
    assert f"LD_PRELOAD={shim}".encode() in env and f"PAIRCTL_RPC_DIAL={rpc_addr}:{port}".encode() in env, env
    # the stranger waits in the backlog behind llama-server's connection; its restart frees the slot
    uid = pwd.getpwnam(stranger).pw_uid
    as_stranger = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    plain = subprocess.Popen(
        [*as_stranger, "/usr/bin/python3", "-c", STRANGER_CLIENT, rpc_addr, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    time.sleep(1)
    os.kill(npid, 9)
    got, err = plain.communicate(timeout=60)
    verdict, _, data = got.strip().partition(" ")
    assert verdict in ("reset", "closed"), (got, err)
    assert len(bytes.fromhex(data)) <= 32, f"the stranger got more than the challenge: {data}"  # HELLO's answer: 36
    # with pairctl's shim and the key's path the stranger still cannot answer: the file is not theirs
    borrowed = subprocess.run(
        [
            *as_stranger,
            "env",
            f"LD_PRELOAD={shim}",
            f"PAIRCTL_RPC_DIAL={rpc_addr}:{port}",
            f"PAIRCTL_RPC_KEY={fp.roots['native'] / 'secrets' / 'rpc.key'}",
            "/usr/bin/python3",
            "-c",
            STRANGER_CLIENT,
            rpc_addr,
            str(port),
        ],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert borrowed.stdout.split()[:1] in (["reset"], ["closed"], ["error"]), borrowed
    assert "closed 0" not in borrowed.stdout and len(borrowed.stdout.split()[-1]) <= 64, borrowed.stdout
    deadline, healthy = time.monotonic() + 60, False
    while time.monotonic() < deadline and not healthy:
        try:
            healthy = httpx.get(f"http://{native_addr}:8192/health", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            time.sleep(0.3)
    assert healthy, "llama-server did not come back within 60 s"
    log = (fp.roots["rpc"] / "run" / "ggml-rpc-server.out").read_text(errors="replace")
    assert "refused a connection from 127.0.0.1 (no proof of the route's key)" in log, log[-2000:]


def test_silent_peers_at_the_allowed_address_do_not_keep_llama_server_out(deployed_sec):
    """Issue 49: the guard waited up to 2 s for each allowed peer's proof before it looked at the
    next, so a local process at the allowed address that keeps connecting and says nothing kept
    the real llama-server's connection waiting past its own 2 s (refused, restarted, refused).
    Such a process runs here (a connection every 0.3 s from 127.0.0.1, each held open, silent)
    while llama-server is killed: its supervisor starts it again, it proves the route key and
    serves a completion through the RPC device, and the silent ones are reset on their deadline."""
    fp, _ = deployed_sec
    rpc_addr = fp.base_inventory.hosts[fp.base_hosts["rpc"]].address
    native_addr = fp.base_inventory.hosts[fp.base_hosts["native"]].address
    stop, held = threading.Event(), []

    def silent_peers() -> None:
        while not stop.is_set() and len(held) < 200:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", 0))  # the allowed address (rpc_peers in the lab)
                s.settimeout(2)
                s.connect((rpc_addr, 50192))
            except OSError:
                pass
            held.append(s)
            stop.wait(0.3)

    th = threading.Thread(target=silent_peers, daemon=True)
    th.start()
    try:
        time.sleep(1)  # some already wait in the backlog behind llama-server's connection
        npid = service_pid_of(fp, "native")
        assert npid is not None
        os.kill(npid, 9)
        deadline, served = time.monotonic() + 45, None
        with httpx.Client(timeout=10, trust_env=False) as c:
            while time.monotonic() < deadline and served is None:
                try:
                    r = c.post(
                        f"http://{native_addr}:8192/completion",
                        json={"prompt": "Hello", "n_predict": 4},
                        headers={"Authorization": f"Bearer {fp.api_key}"},
                    )
                    served = r.json() if r.status_code == 200 else None
                except httpx.HTTPError:
                    pass
                if served is None:
                    time.sleep(0.3)
        assert served is not None and "content" in served, "llama-server did not serve within 45 s"
        assert service_pid_of(fp, "native") != npid
    finally:
        stop.set()
        th.join(timeout=10)
        for s in held:
            s.close()
    log = (fp.roots["rpc"] / "run" / "ggml-rpc-server.out").read_text(errors="replace")
    assert "refused a connection from 127.0.0.1 (no proof of the route's key)" in log, log[-2000:]


def test_a_guard_list_other_than_the_inventorys_fails_identity(deployed_sec):
    """Verified on the host, against the inventory as it stands: the list the running server's
    guard holds (its environment, read on the host) must be the pair's rpc_peers. An inventory
    that now names another list fails `accept` (identity) until a deploy applies it."""
    fp, _ = deployed_sec
    text = fp.inventory_path.read_text()
    inv = yaml.safe_load(text)
    inv["pairs"][fp.name]["rpc_peers"] = ["127.0.0.1", STRAY]
    try:
        fp.inventory_path.write_text(yaml.safe_dump(inv))
        a = fp.cli("--json", "accept", "--pair", fp.name, "--only", "identity")
        assert a.returncode != 0, a.stdout[-2000:]
        assert f"serves '127.0.0.1', the inventory says '127.0.0.1,{STRAY}'" in a.stdout + a.stderr
    finally:
        fp.inventory_path.write_text(text)
    a = fp.cli("--json", "accept", "--pair", fp.name, "--only", "identity")
    assert a.returncode == 0, (a.stdout + a.stderr)[-2000:]


# -- issue 32 #14: CORS, answer-changing files, the kernel check's rpc-server ---------------------

EVIL = "https://evil.example"


def test_a_foreign_web_page_cannot_read_the_servers_answers(deployed_sec):
    """The pinned llama-server's own default is `--cors-origins *` with credentials: it echoes any
    page's Origin, so a page a user opens could drive the server and read its answers. pairctl
    renders the profile's cors (default localhost, no credentials): a foreign Origin gets nothing."""
    fp, _ = deployed_sec
    url = f"http://{fp.base_inventory.hosts[fp.base_hosts['native']].address}:8192"
    auth = {"Authorization": f"Bearer {fp.api_key}"}
    with httpx.Client(timeout=10, trust_env=False) as c:
        for r in (
            c.get(f"{url}/health", headers={"Origin": EVIL}),
            c.get(f"{url}/v1/models", headers={"Origin": EVIL, **auth}),
            c.options(f"{url}/completion", headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"}),
        ):
            assert r.headers.get("access-control-allow-origin") not in (EVIL, "*"), dict(r.headers)
            assert r.headers.get("access-control-allow-credentials") != "true", dict(r.headers)
        local = c.get(f"{url}/health", headers={"Origin": "http://localhost:3000"})
        assert local.headers.get("access-control-allow-origin") == "http://localhost:3000"  # what localhost allows
    argv = cmdline_of(service_pid_of(fp, "native"))  # type: ignore[arg-type]
    assert argv[argv.index("--cors-origins") + 1] == "localhost" and "--no-cors-credentials" in argv


def _control_vector(path: Path, value: float) -> str:
    """A control vector for the lab model (n_embd 128), as llama.cpp's cvector tools write one."""
    import hashlib

    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_uint32("controlvector.layer_count", 1)
    w.add_tensor("direction.1", np.full(128, value, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_answer_changing_file_is_declared_verified_and_watched(deployed_sec, tmp_path):
    """A --control-vector named in extra_args changes every answer, and was deployed without its
    hash anywhere: swapping the file on the host left status and identity clean. Now the profile
    must declare it with its sha256, deploy hashes the host's copy before any change, the route
    entry records it, and status sees it replaced."""
    fp, _ = deployed_sec
    pkg = fp.packages[0]
    cv = tmp_path / "calm.gguf"
    sha = _control_vector(cv, 0.5)
    base = yaml.safe_load(Path(__file__).parents[2].joinpath("manifests", "profiles", "lab.yaml").read_text())
    route = (fp.roots["native"] / "run" / "route.json").read_bytes()

    def profile(name: str, **extra: object) -> str:
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump({**base, "name": name, "extra_args": ["--control-vector", str(cv)], **extra}))
        return str(p)

    deploy = ("--json", "deploy", "--pair", fp.name, "--packages", pkg, pkg, "--skip-accept", "--profile")
    r = fp.cli(*deploy, profile("cv-undeclared"))
    assert r.returncode == 3 and f"files ({cv}: SHA256" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = fp.cli(*deploy, profile("cv-wrong", files={str(cv): "0" * 64}))
    assert r.returncode != 0 and f"file {cv} has sha256 {sha}, the profile declares" in r.stderr, r.stderr[-2000:]
    assert "nothing was changed" in r.stderr and (fp.roots["native"] / "run" / "route.json").read_bytes() == route
    try:
        r = fp.cli(*deploy, profile("cv", files={str(cv): sha}))
        assert r.returncode == 0, r.stderr[-3000:]
        code, st = fp.status()
        assert code == 0 and st["route"]["files"] == {str(cv): sha} and st["route"]["files_verified"], st
        _control_vector(cv, -0.5)  # the same size, other directions: every answer moves
        code, st = fp.status()
        changed = [p for p in st["problems"] if str(cv) in p and "changed since it was deployed" in p]
        assert code != 0 and changed, st["problems"]
        a = fp.cli("--json", "accept", "--pair", fp.name, "--only", "identity")
        assert a.returncode != 0 and str(cv) in a.stdout + a.stderr
    finally:
        r = fp.cli("--json", "deploy", "--pair", fp.name, "--packages", pkg, pkg, "--skip-accept")
        assert r.returncode == 0, r.stderr[-3000:]


def test_rollback_and_restart_rehash_declared_files_before_starting_a_server(deployed_sec, tmp_path):
    """Issue 49 item 3: a profile declaring an answer-changing file (a grammar there; a control
    vector here, which the pair allows) deployed, then another profile, then the file replaced on
    the host, then `rollback`: exit 0 "passed", and the server answered with the planted file.
    Rollback and restart now re-hash every declared file against the route record before anything
    stops: refused (exit 6) naming the file, the running pair untouched, no lease left held."""
    fp, _ = deployed_sec
    pkg = fp.packages[0]
    cv = tmp_path / "calm.gguf"
    sha = _control_vector(cv, 0.5)
    base = yaml.safe_load(Path(__file__).parents[2].joinpath("manifests", "profiles", "lab.yaml").read_text())
    prof = tmp_path / "cv.yaml"
    prof.write_text(yaml.safe_dump({**base, "name": "cv", "extra_args": ["--control-vector", str(cv)],
                                    "files": {str(cv): sha}}))  # fmt: skip
    plain = ("--json", "deploy", "--pair", fp.name, "--packages", pkg, pkg, "--skip-accept")

    def leases_free() -> bool:
        return not any(lease_held(fp.roots[r]) for r in ("native", "rpc"))

    try:
        r = fp.cli(*plain, "--profile", str(prof))
        assert r.returncode == 0, r.stderr[-3000:]
        _control_vector(cv, -0.5)  # the same size, other directions: every answer moves
        pid = service_pid_of(fp, "native")
        r = fp.cli("--json", "restart", "--pair", fp.name)
        assert r.returncode == 6 and f"file {cv} has sha256" in r.stderr, r.stderr[-3000:]
        assert "changed since it was deployed" in r.stderr and "nothing was changed" in r.stderr
        assert "Traceback" not in r.stderr and service_pid_of(fp, "native") == pid and leases_free()
        assert _control_vector(cv, 0.5) == sha
        r = fp.cli(*plain)  # another profile: the control-vector pair becomes the record's previous
        assert r.returncode == 0, r.stderr[-3000:]
        _control_vector(cv, -0.5)
        pid, route = service_pid_of(fp, "native"), (fp.roots["native"] / "run" / "route.json").read_bytes()
        r = fp.cli("--json", "rollback", "--pair", fp.name)
        assert r.returncode == 6 and f"file {cv} has sha256" in r.stderr, r.stderr[-3000:]
        assert "rollback refused, nothing was changed" in r.stderr and "Traceback" not in r.stderr
        assert service_pid_of(fp, "native") == pid and (fp.roots["native"] / "run" / "route.json").read_bytes() == route
        assert leases_free()
        _control_vector(cv, 0.5)  # the deployed bytes back: the rollback goes ahead
        r = fp.cli("--json", "rollback", "--pair", fp.name)
        assert r.returncode == 0 and json.loads(r.stdout)["outcome"] == "passed", r.stderr[-3000:]
    finally:
        r = fp.cli(*plain)
        assert r.returncode == 0, r.stderr[-3000:]


def test_the_kernel_checks_rpc_server_serves_only_the_pairs_peers(deployed_sec, tmp_path):
    """`kernels check` starts a second ggml-rpc-server on rpc_port + 1 for the length of the
    check; it ran without the RPC guard, so any host reaching that port got HELLO answered, and
    then (issue 49) with the address rule only. Held at its first harness (the server up, no
    client yet), a third address is reset, the peer's address without the route key gets nothing,
    a client with the key is served; the check (its harnesses proving the key) then passes."""
    fp, _ = deployed_sec
    fault = tmp_path / "fault"
    env = fp.env(PAIRCTL_ENABLE_FAULT_HOOKS="1", PAIRCTL_FAULT_HOOK="kernels.harness.native:pause",
                 PAIRCTL_FAULT_DIR=str(fault))  # fmt: skip
    p = subprocess.Popen(
        fp.argv("--json", "kernels", "check", "--pair", fp.name), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (fault / "paused").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (fault / "paused").exists(), f"kernels check never reached its harness (exit {p.poll()})"
        addr = fp.base_inventory.hosts[fp.base_hosts["rpc"]].address
        stray = stray_client(addr, 50193)
        try:
            assert answer_of(stray, 10) in ("reset", "closed")
        finally:
            close_stray(stray)
        # issue 49: the peer's address is not enough there either (any local user has it): a
        # client at 127.0.0.1 (rpc_peers in the lab) without the route key gets the challenge, a
        # reset, never a HELLO answer; the same client through the shim with the native host's key
        # (what the harness runs with) is served
        with socket.socket() as plain:
            plain.bind(("127.0.0.1", 0))
            plain.settimeout(10)
            plain.connect((addr, 50193))
            plain.sendall(HELLO)
            got = b""
            try:
                while b := plain.recv(64):
                    got += b
            except (ConnectionResetError, TimeoutError):  # reset after the challenge; served: waits
                pass
            assert len(got) <= 32, f"a client without the route key got more than the challenge: {got.hex()}"
        nroot = fp.roots["native"]
        keyed = subprocess.run(
            [sys.executable, "-c", HELLO_CLIENT, addr, "50193"],
            env={"PATH": os.environ["PATH"], "LD_PRELOAD": str(nroot / "bin" / "pairctl-rpc-guard.so"),
                 "PAIRCTL_RPC_DIAL": f"{addr}:50193", "PAIRCTL_RPC_KEY": str(nroot / "secrets" / "rpc.key")},
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert bytes.fromhex(keyed.stdout.strip() or "00")[:1] == bytes([28]), (keyed.stdout, keyed.stderr)
    finally:
        (fault / "resume").touch()
        out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert json.loads(out)["plan"]["rpc_server"]["allow"] == ["127.0.0.1"]
    log = (fp.roots["rpc"] / "run" / "kernel-check" / "run" / "ggml-rpc-server.out").read_text(errors="replace")
    assert f"refused a connection from {STRAY}" in log, log[-2000:]
    assert "refused a connection from 127.0.0.1 (no proof of the route's key)" in log, log[-2000:]


HELLO_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
print(s.recv(64).hex())
"""
