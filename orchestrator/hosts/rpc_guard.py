"""The RPC guard: ggml-rpc-server (no authentication, runs any graph) serves only the pair's peers.

Binding to an address is not access control and a firewall needs root, so pairctl preloads a
small shim (`rpc_guard.c`, compiled here) into the server: accept() resets every peer outside
`Inventory.rpc_peers` before a byte is read, and challenges the rest for HMAC-SHA256 with the
route's key (`secrets/rpc.key`, 0600, never in argv, logs or receipts), since every local user
of the native host shares its address. llama-server and the supervisors' probes answer through
the same shim (PAIRCTL_RPC_DIAL). The host verifies the running server maps exactly that file and
holds exactly the inventory's list (`pairctl-svc guard`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import posixpath
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from orchestrator.errors import BuildError
from orchestrator.hosts.layout import GUARD, HostLayout, put_secret
from orchestrator.hosts.root_trust import put_new
from orchestrator.remote.transport import Transport

SOURCE = Path(__file__).with_name("rpc_guard.c")


@functools.lru_cache(maxsize=1)
def guard_bytes() -> bytes:
    """The shim, compiled once per process with `$CC` or `cc` (about 0.1 s)."""
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise BuildError(
            f"pairctl builds ggml-rpc-server's guard (orchestrator/hosts/rpc_guard.c) with a C compiler; {cc!r} "
            "is not on PATH",
            hint="install one (e.g. apt-get install gcc) or point CC at it",
        )
    with tempfile.TemporaryDirectory(prefix="pairctl-guard-") as d:
        out = Path(d) / GUARD
        p = subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if p.returncode != 0:
            raise BuildError(f"compiling {SOURCE.name} failed (exit {p.returncode}): {p.stderr.strip()[-400:]}")
        return out.read_bytes()


def guard_sha256() -> str:
    return hashlib.sha256(guard_bytes()).hexdigest()


def install_guard(transport: Transport, layout: HostLayout) -> str:
    """The guard on the RPC host (bin/ is judged by install_helper first), replaced only when it
    differs; 'up to date' or 'installed'."""
    try:
        there = transport.read_bytes(layout.guard, max_bytes=1 << 20)
    except (FileNotFoundError, OSError):
        there = None
    if there == guard_bytes() and ((st := transport.stat(layout.guard)) is None or not st.is_link):
        return "up to date"
    put_new(transport, guard_bytes(), layout.guard, 0o755)
    return "installed"


ROUTE_KEY = "rpc.key"  # in secrets/ on both hosts of a pair (pairctl-svc key_ok)
KEY_LEN = 32


def key_id(key: bytes) -> str:
    """What receipts and `status` show of a route key: its sha256, 16 digits."""
    return hashlib.sha256(key).hexdigest()[:16]


def install_route_key(native: tuple[Transport, HostLayout], rpc: tuple[Transport, HostLayout]) -> str:
    """The pair's route key on both hosts (kept when both hold the same 32 bytes, else a new one,
    RPC host first) and the shim on the native host, before ggml-rpc-server starts; the key's id."""
    held = []
    for t, layout in (native, rpc):
        try:
            held.append(t.read_bytes(posixpath.join(layout.secrets, ROUTE_KEY), max_bytes=KEY_LEN + 1))
        except (FileNotFoundError, OSError):
            held.append(b"")
    key = held[0]
    if len(key) != KEY_LEN or held[1] != key:
        key = secrets.token_bytes(KEY_LEN)
        for t, layout in (rpc, native):
            put_secret(t, layout, key, ROUTE_KEY)
    install_guard(*native)
    return key_id(key)


def parse_guard(out: str, name: str) -> tuple[str, str, str] | None:
    """`guard=NAME:SHA256:ALLOW:KEYID` -> (sha256, allow, key id or "-"); None when the server runs
    without it (`guard=NAME:-`), is down, or the line is missing."""
    for line in out.splitlines():
        if line.startswith(f"guard={name}:"):
            parts = line[len(f"guard={name}:") :].split(":")
            if len(parts) == 3:
                return parts[0], parts[1], parts[2]
    return None


def guard_problem(host: str, name: str, state: tuple[str, str, str] | None, peers: list[str]) -> str | None:
    """What is wrong with the guard the running server has, as a problem line (None: as rendered).
    Its file's hash is data, not a problem: another compiler builds other bytes, and whoever can
    write bin/ can already replace the helper (hosts/root_trust.py)."""
    if state is None:
        return f"{host}: {name} runs without pairctl's RPC guard: any host that reaches its port is served"
    _, allow, key = state
    if allow != ",".join(peers):
        return f"{host}: {name} serves {allow!r}, the inventory says {','.join(peers)!r}"
    if key == "-":
        return f"{host}: {name} checks no route key: any local user of {allow} is served (deploy again)"
    return None
