"""The RPC guard: ggml-rpc-server serves only the pair's peers (issue 32 item 2).

ggml-rpc-server has no authentication and runs any graph a client sends, and binding it to one
address is not access control: any host that can route to that address could talk to it (HELLO,
ALLOC_BUFFER, SET_TENSOR, GRAPH_COMPUTE), and one stray client held its single client slot. The
fixes that need root (a firewall rule, systemd's IPAddressAllow=) are not available to a login
user, and a tunnel would need keys between the hosts; so pairctl preloads a 60-line shim
(`rpc_guard.c`) into the server: accept() resets every peer outside `Inventory.rpc_peers` before
a byte is read. It is compiled here with the operator's C compiler (pairctl already builds
llama.cpp with one), put on the RPC host as `bin/pairctl-rpc-guard.so` (exclusive temp name,
rename), preloaded by the supervisor (`sup.allow=`), and verified on the host: the running
server must have that file mapped (not a deleted one) and its environment must hold exactly the
inventory's list (`pairctl-svc guard`); its hash is recorded beside.

An address is not a user: every local user of the native host connects from its address (issue
49). So each route also has a key: 32 random bytes made here, put over SFTP as `secrets/rpc.key`
on both hosts (0600, the service user's 0400 once started; never argv, logs or receipts, which
keep a 16-digit id of its sha256). The guard challenges every allowed peer and resets one whose
answer is not HMAC-SHA256(key, challenge); llama-server answers through the same shim preloaded
with PAIRCTL_RPC_DIAL (its connect() to the RPC endpoint), as do the supervisors' probes. Why this
design: a local stranger can neither read the key nor use llama-server's connections (another
uid), whereas a loopback forwarder or a uid check by /proc/net/tcp would need a second process
to supervise and would not reach a stranger on the RPC host's side of a remote native host.
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
    """The shim, compiled with `$CC` or `cc` once per source and compiler (0.1 s wall, about
    0.3 s CPU: every `status` and deploy compiled it again), kept in the user's cache folder under
    a name made of both (the compiler by its resolved path, size and mtime: an upgrade moves it)."""
    cc = os.environ.get("CC") or "cc"
    if (where := shutil.which(cc)) is None:
        raise BuildError(
            f"pairctl builds ggml-rpc-server's guard (orchestrator/hosts/rpc_guard.c) with a C compiler; {cc!r} "
            "is not on PATH",
            hint="install one (e.g. apt-get install gcc) or point CC at it",
        )
    st = os.stat(where)
    key = hashlib.sha256(SOURCE.read_bytes() + f"\0{os.path.realpath(where)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pairctl"
    cached = cache / f"guard-{key.hexdigest()[:32]}.so"
    try:
        return cached.read_bytes()
    except OSError:
        pass
    data = _compile(cc)
    try:  # best effort: a cache that cannot be written only costs the next process a compile
        cached.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    except OSError:
        pass
    return data


def _compile(cc: str) -> bytes:
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
    if there == guard_bytes() and not (transport.stat(layout.guard) or _NoStat).is_link:
        return "up to date"
    put_new(transport, guard_bytes(), layout.guard, 0o755)
    return "installed"


class _NoStat:
    is_link = False


ROUTE_KEY = "rpc.key"  # in secrets/ on both hosts of a pair (pairctl-svc key_ok)
KEY_LEN = 32


def key_id(key: bytes) -> str:
    """What receipts and `status` show of a route key: its sha256, 16 digits."""
    return hashlib.sha256(key).hexdigest()[:16]


def install_route_key(native: tuple[Transport, HostLayout], rpc: tuple[Transport, HostLayout]) -> str:
    """The pair's route key on both hosts (the one there when both hold the same 32 bytes, else a
    new one, RPC host first), and the shim on the native host; returns the key's id. Called before
    ggml-rpc-server starts: the supervisors read the key at every start, the guard and the shim
    at every connection."""
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
    Its file's hash is data, not a problem: another pairctl version or compiler builds other
    bytes (the next deploy replaces them), and whoever can write bin/ can already replace the
    helper pairctl runs (hosts/root_trust.py). Every server pairctl starts (the pair's, and the
    kernel check's second one) also checks the route key."""
    if state is None:
        return f"{host}: {name} runs without pairctl's RPC guard: any host that reaches its port is served"
    _, allow, key = state
    if allow != ",".join(peers):
        return f"{host}: {name} serves {allow!r}, the inventory says {','.join(peers)!r}"
    if key == "-":
        return f"{host}: {name} checks no route key: any local user of {allow} is served (deploy again)"
    return None
