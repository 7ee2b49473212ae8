"""The RPC guard itself (orchestrator/hosts/rpc_guard.c), compiled as deploy compiles it and
preloaded into a real listening process, as the supervisor preloads it into ggml-rpc-server
(the whole pair: tests/e2e/test_security.py::test_rpc_server_serves_only_the_native_host).
CPython's socket.accept() goes through libc's accept4(), the symbol the guard replaces."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def _serve(tmp_path: Path, allow: str | None) -> tuple[subprocess.Popen[str], int]:
    so = tmp_path / "pairctl-rpc-guard.so"
    so.write_bytes(guard_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("PAIRCTL_RPC_ALLOW", "LD_PRELOAD")}
    env["LD_PRELOAD"] = str(so)
    if allow is not None:
        env["PAIRCTL_RPC_ALLOW"] = allow
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
    state = parse_guard(f"guard=ggml-rpc-server:{guard_sha256()}:127.0.0.1\n", "ggml-rpc-server")
    assert state == (guard_sha256(), "127.0.0.1")
    assert guard_problem("h", "ggml-rpc-server", state, ["127.0.0.1"]) is None
    assert "serves '127.0.0.1'" in (guard_problem("h", "ggml-rpc-server", state, ["10.0.0.2"]) or "")
    for out in ("guard=ggml-rpc-server:-\n", "guard=ggml-rpc-server:down\n", ""):
        assert "runs without pairctl's RPC guard" in (
            guard_problem("h", "ggml-rpc-server", parse_guard(out, "ggml-rpc-server"), ["127.0.0.1"]) or ""
        )


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
