"""The RPC guard itself (orchestrator/hosts/rpc_guard.c), compiled as deploy compiles it and
preloaded into a real listening process, as the supervisor preloads it into ggml-rpc-server
(the whole pair: tests/e2e/test_security.py::test_rpc_server_serves_only_the_native_host).
CPython's socket.accept() goes through libc's accept4(), the symbol the guard replaces."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.config.inventory import Inventory
from orchestrator.hosts.rpc_guard import guard_bytes, guard_problem, guard_sha256, parse_guard

SERVER = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.94", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept()
    c.sendall(("hello " + peer[0]).encode()); c.close()
"""


def _serve(tmp_path: Path, allow: str | None, key: Path | None = None) -> tuple[subprocess.Popen[str], int]:
    so = tmp_path / "pairctl-rpc-guard.so"
    so.write_bytes(guard_bytes())
    so.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAIRCTL_RPC_") and k != "LD_PRELOAD"}
    env["LD_PRELOAD"] = str(so)
    if allow is not None:
        env["PAIRCTL_RPC_ALLOW"] = allow
    if key is not None:
        env["PAIRCTL_RPC_KEY"] = str(key)
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def _ask(port: int, source: str) -> str:
    with socket.socket() as c:
        c.bind((source, 0))
        c.settimeout(5)
        try:  # on loopback the reset can come before connect() returns
            c.connect(("127.0.0.94", port))
            return c.recv(64).decode() or "closed"
        except ConnectionResetError:
            return "reset"


@pytest.mark.parametrize(
    ("allow", "served", "refused"),
    [
        ("127.0.0.1", ["127.0.0.1"], ["127.0.0.93", "127.0.0.95"]),
        ("127.0.0.95,127.0.0.93", ["127.0.0.93", "127.0.0.95"], ["127.0.0.1"]),
        (None, [], ["127.0.0.1", "127.0.0.93"]),  # fails closed: no list, nobody
        ("not-an-address", [], ["127.0.0.1"]),
    ],
)
def test_guard_serves_only_the_listed_peers(tmp_path, allow, served, refused):
    p, port = _serve(tmp_path, allow)
    try:
        for src in refused:  # reset before the program saw it; it goes on accepting
            assert _ask(port, src) == "reset", src
        for src in served:
            assert _ask(port, src) == f"hello {src}", src
    finally:
        p.kill()
        _, err = p.communicate(timeout=10)
    for src in refused:
        assert f"pairctl-rpc-guard: refused a connection from {src}" in err, err


def test_guard_state_judged_against_the_inventory():
    state = parse_guard(f"guard=ggml-rpc-server:{guard_sha256()}:127.0.0.1:0123456789abcdef\n", "ggml-rpc-server")
    assert state == (guard_sha256(), "127.0.0.1", "0123456789abcdef")
    assert guard_problem("h", "ggml-rpc-server", state, ["127.0.0.1"]) is None
    unkeyed = parse_guard(f"guard=ggml-rpc-server:{guard_sha256()}:127.0.0.1:-\n", "ggml-rpc-server")
    assert "checks no route key" in (guard_problem("h", "ggml-rpc-server", unkeyed, ["127.0.0.1"]) or "")
    assert "serves '127.0.0.1'" in (guard_problem("h", "ggml-rpc-server", state, ["10.0.0.2"]) or "")
    for out in ("guard=ggml-rpc-server:-\n", "guard=ggml-rpc-server:down\n", ""):
        assert "runs without pairctl's RPC guard" in (
            guard_problem("h", "ggml-rpc-server", parse_guard(out, "ggml-rpc-server"), ["127.0.0.1"]) or ""
        )


SYSTEM_PYTHON = "/usr/bin/python3"
PROBE = """
import socket, sys
s = socket.socket(); s.settimeout(10); got = b""
try:
    s.connect(("127.0.0.94", int(sys.argv[1])))
    while b := s.recv(64):
        got += b
    print("closed", got.decode(errors="replace"))
except (ConnectionResetError, ConnectionRefusedError):
    print("reset", len(got))
"""


def _client(port: int, shim: Path | None, key: Path | None, user: list[str] | None = None) -> str:
    env = {"PATH": os.environ["PATH"]}
    if shim is not None:
        env |= {"LD_PRELOAD": str(shim), "PAIRCTL_RPC_DIAL": f"127.0.0.94:{port}", "PAIRCTL_RPC_KEY": str(key)}
    python = sys.executable if user is None else SYSTEM_PYTHON  # root's may lie where a stranger cannot search
    argv = [*(user or []), "env", *(f"{k}={v}" for k, v in env.items()), python, "-c", PROBE, str(port)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr[-500:]
    return r.stdout.strip()


@pytest.fixture
def stranger():
    """A real second local user: made here, removed after (needs root)."""
    if os.geteuid() != 0 or not all(map(shutil.which, ("useradd", "setpriv", SYSTEM_PYTHON))):
        pytest.skip(f"a second local user needs root with useradd, setpriv and {SYSTEM_PYTHON}")
    name = f"pcg{os.getpid() % 100000}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        uid = pwd.getpwnam(name).pw_uid
        yield ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    finally:
        subprocess.run(["userdel", name], check=False)


def test_keyed_guard_serves_only_who_proves_the_route_key(tmp_path, stranger):
    """Issue 49 item 4: an allowed address is not enough. The guard sends a challenge and resets
    a peer whose answer is not HMAC-SHA256(key, challenge); the shim preloaded with the key
    (as the supervisor preloads it into llama-server) answers it. A real second local user at
    the allowed address, even with the shim and the key's path, cannot read the key (0600)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="pairctl-guard-"))  # pytest's is 0700: the stranger may
    tmp_path.chmod(0o755)  # load the shim from here, never read the key
    key = tmp_path / "rpc.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32))
    other.chmod(0o600)
    shim = tmp_path / "pairctl-rpc-guard.so"
    p, port = _serve(tmp_path, "127.0.0.1", key)
    try:
        assert _client(port, shim, key) == "closed hello 127.0.0.1"  # the route's process
        assert _client(port, None, None).startswith(("reset", "closed")), "no proof"
        assert "hello" not in _client(port, None, None)
        assert "hello" not in _client(port, shim, other)  # another key
        assert "hello" not in _client(port, shim, key, stranger)  # another user: the key unreadable
        assert "hello" not in _client(port, None, None, stranger)
        assert _client(port, shim, key) == "closed hello 127.0.0.1"  # still serving
    finally:
        p.kill()
        _, err = p.communicate(timeout=10)
        shutil.rmtree(tmp_path)
    assert err.count("refused a connection from 127.0.0.1 (no proof of the route's key)") == 5, err


def test_a_silent_peer_does_not_hold_up_the_route_s_client(tmp_path):
    """Issue 49: the guard waited up to 2 s for one peer's answer before it accepted the next, so
    any local process at the allowed address could delay (or, reconnecting, starve) the real
    client at every connection. Two real connections from the allowed address stay open and say
    nothing; the client with the key is served at once, while both are still waiting, and they
    are reset on their own deadline."""
    key = tmp_path / "rpc.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    p, port = _serve(tmp_path, "127.0.0.1", key)
    silent = [socket.create_connection(("127.0.0.94", port), timeout=10) for _ in range(2)]
    try:
        for s in silent:  # challenged (so already accepted by the guard), never answering
            assert len(s.recv(32)) == 32
        t0 = time.monotonic()
        assert _client(port, tmp_path / "pairctl-rpc-guard.so", key) == "closed hello 127.0.0.1"
        took = time.monotonic() - t0
        assert took < 1.0, f"the route's client waited {took:.2f} s behind silent peers"
        for s in silent:  # still pending when the client was served, then reset at their deadline
            s.settimeout(5)
            with pytest.raises(ConnectionResetError):
                s.recv(1)
    finally:
        for s in silent:
            s.close()
        p.kill()
        _, err = p.communicate(timeout=10)
    assert err.count("refused a connection from 127.0.0.1 (no proof of the route's key)") == 2, err


def _inventory(native: str, rpc: str, **pair: object) -> Inventory:
    return Inventory.model_validate(
        {
            "hosts": {
                "n": {"address": native, "role": "native", "install_root": "/srv/n"},  # (server on loopback)
                "r": {"address": rpc, "role": "rpc", "install_root": "/srv/r"},
            },
            "pairs": {"p": {"native": "n", "rpc": "r", "server_bind": "127.0.0.1", **pair}},
        }
    )


def test_rpc_peers_default_and_override():
    assert _inventory("10.0.0.1", "10.0.0.2").rpc_peers("p") == ["10.0.0.1", "10.0.0.2"]
    assert _inventory("127.0.0.2", "127.0.0.3").rpc_peers("p") == ["127.0.0.1"]
    assert _inventory("10.0.0.1", "10.0.0.2", rpc_peers=["192.168.7.1"]).rpc_peers("p") == ["192.168.7.1"]
    with pytest.raises(ValueError, match="rpc_peers"):
        _inventory("native.example", "10.0.0.2")
    for bad in (["0.0.0.0"], [], ["10.0.0.0/8"]):
        with pytest.raises(ValueError, match="rpc_peers"):
            _inventory("10.0.0.1", "10.0.0.2", rpc_peers=bad)


SHUT_LISTENER = """
import resource, socket, threading, time
s = socket.socket(); s.bind(("127.0.0.94", 0)); s.listen(8)
threading.Timer(0.3, s.shutdown, (socket.SHUT_RD,)).start()  # the listener goes: POLLHUP, no POLLIN
try:
    s.accept()
    print("accepted", flush=True)
except OSError as exc:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print("refused", exc.errno, ru.ru_utime + ru.ru_stime, flush=True)
"""


def test_a_listener_that_ends_returns_its_error_instead_of_spinning(tmp_path):
    """A listener shut down while the program waits in accept polls POLLHUP without POLLIN: the
    guard looped on poll at once forever (one core at 100 %, the program never told). It now asks
    the listener itself, and accept returns the listener's error, as accept4 would."""
    so = tmp_path / "pairctl-rpc-guard.so"
    so.write_bytes(guard_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAIRCTL_RPC_")}
    env |= {"LD_PRELOAD": str(so), "PAIRCTL_RPC_ALLOW": "127.0.0.1"}
    p = subprocess.Popen([sys.executable, "-c", SHUT_LISTENER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        out, _ = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        cpu = sum(int(x) for x in Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
        p.kill()
        p.communicate()
        pytest.fail(f"accept never returned on a listener that ended ({cpu / os.sysconf('SC_CLK_TCK'):.1f} s CPU)")
    word, errno_, cpu = out.split()
    assert word == "refused" and int(errno_) == 22, out  # EINVAL: what accept4 says of a listener that ended
    assert float(cpu) < 2.0, out


PENDING = """
import ctypes, os, socket, sys, threading
s = socket.socket(); s.bind(("127.0.0.94", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
libc = ctypes.CDLL(None, use_errno=True)

def flags(fd):
    text = open(f"/proc/self/fdinfo/{fd}").read()
    return int(next(l for l in text.splitlines() if l.startswith("flags:")).split()[1], 8)

def pending():  # once told a peer waits on its challenge: the guard's fds beyond the listener
    sys.stdin.readline()
    fds = [f"/proc/self/fd/{f}" for f in os.listdir("/proc/self/fd") if int(f) > s.fileno()]
    socks = [int(f.rsplit("/", 1)[1]) for f in fds if os.path.exists(f) and os.readlink(f).startswith("socket:")]
    print("pending", *(bool(flags(f) & os.O_CLOEXEC) for f in socks), flush=True)

threading.Thread(target=pending).start()
c = libc.accept(s.fileno(), None, None)  # accept(), no SOCK_CLOEXEC asked: as ggml-rpc-server calls it
print("accepted", bool(flags(c) & os.O_CLOEXEC), flush=True)
"""


def test_pending_peers_are_close_on_exec_and_the_handed_over_one_as_asked(tmp_path):
    """A peer owing its proof is held by the guard inside accept; a process the program starts
    meanwhile (another thread's fork and exec) must not inherit it: the guard accepts with
    SOCK_CLOEXEC, and the connection it hands over carries the flags the program asked for."""
    key = tmp_path / "rpc.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    so = tmp_path / "pairctl-rpc-guard.so"
    so.write_bytes(guard_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAIRCTL_RPC_")}
    env |= {"LD_PRELOAD": str(so), "PAIRCTL_RPC_ALLOW": "127.0.0.1", "PAIRCTL_RPC_KEY": str(key)}
    p = subprocess.Popen(
        [sys.executable, "-c", PENDING], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        port = int(p.stdout.readline())
        with socket.create_connection(("127.0.0.94", port), timeout=10) as silent:
            assert len(silent.recv(32)) == 32  # challenged: pending in the guard
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline().split() == ["pending", "True"]
        assert _client(port, so, key) == "closed"  # proved the key; the program got it (and prints)
        assert p.stdout.readline().split() == ["accepted", "False"]
    finally:
        p.kill()
        p.communicate(timeout=10)
