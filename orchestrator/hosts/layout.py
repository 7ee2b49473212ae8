"""Where things live on a host, and the remote commands that read or change that layout.

On each host, under the inventory's install_root:

    releases/<package-id>/   immutable, uploaded under a temporary name and renamed in
    current, previous        symlinks to releases/<id>, switched by rename (never rm + ln)
    leases/                  lease directories (orchestrator.hosts.leases)
    route.json               the route record (orchestrator.hosts.route)
    run/                     pidfiles, stdout/stderr and server logs
    secrets/                 0700; the API key file, 0600
    bin/pairctl-svc          the pidfile supervisor (orchestrator/hosts/pairctl-svc.sh)

Every command here is data (a `Cmd` rendering an argv). The helper script is fixed text and
takes every value as an argument, so no user value is ever parsed as shell code.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from orchestrator.hashing import sha256_bytes
from orchestrator.remote.command import Cmd

SVC_SOURCE = Path(__file__).with_name("pairctl-svc.sh")

# Names of the two supervised services (also argv[0]'s basename, which `stop` checks).
LLAMA_SERVER = "llama-server"
RPC_SERVER = "ggml-rpc-server"
SERVICE_OF_ROLE = {"native": LLAMA_SERVER, "rpc": RPC_SERVER}
API_KEY_NAME = "api-key"


@lru_cache(maxsize=1)
def svc_script() -> bytes:
    return SVC_SOURCE.read_bytes()


def svc_sha256() -> str:
    return sha256_bytes(svc_script())


@dataclass(frozen=True)
class HostLayout:
    """Paths under one host's install root (POSIX paths on the host, not here)."""

    root: str

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def releases(self) -> str:
        return self._p("releases")

    def release(self, package_id: str) -> str:
        return self._p("releases", package_id)

    def binary(self, package_id: str, name: str) -> str:
        """A binary by its release path, so argv[0] names the release it runs from."""
        return self._p("releases", package_id, "bin", name)

    @property
    def current(self) -> str:
        return self._p("current")

    @property
    def previous(self) -> str:
        return self._p("previous")

    @property
    def leases(self) -> str:
        return self._p("leases")

    @property
    def route(self) -> str:
        return self._p("route.json")

    @property
    def run(self) -> str:
        return self._p("run")

    def log(self, name: str) -> str:
        return self._p("run", name)

    @property
    def secrets(self) -> str:
        return self._p("secrets")

    @property
    def api_key(self) -> str:
        return self._p("secrets", API_KEY_NAME)

    @property
    def svc(self) -> str:
        return self._p("bin", "pairctl-svc")

    # --- commands -------------------------------------------------------------------------

    def svc_cmd(self, sub: str, *args: str) -> Cmd:
        """Run the installed helper: `sh <root>/bin/pairctl-svc SUB ROOT ARGS...`."""
        return Cmd(("sh", self.svc, sub, self.root, *args))

    def inline_cmd(self, sub: str, *args: str) -> Cmd:
        """Run the helper's fixed text without installing it (read-only facts, first prepare)."""
        return Cmd(("sh", "-c", svc_script().decode(), "pairctl-svc", sub, self.root, *args))

    def facts_cmd(self) -> Cmd:
        return self.inline_cmd("facts", LLAMA_SERVER, RPC_SERVER)

    def prepare_cmd(self) -> Cmd:
        """Create the layout and install the helper from stdin (send `svc_script()` as stdin)."""
        return self.inline_cmd("prepare", "--install-self")

    def start_cmd(self, name: str, argv: list[str]) -> Cmd:
        return self.svc_cmd("start", name, *argv)

    def stop_cmd(self, name: str) -> Cmd:
        return self.svc_cmd("stop", name)

    def wait_listen_cmd(self, name: str, address: str, port: int, timeout_s: int) -> Cmd:
        return self.svc_cmd("wait-listen", name, address, str(port), str(timeout_s))

    def identity_cmd(self, *names: str) -> Cmd:
        return self.svc_cmd("identity", *names)

    def alive_cmd(self, name: str) -> Cmd:
        return self.svc_cmd("alive", name)

    def log_grep_cmd(self, file: str, text: str) -> Cmd:
        return self.svc_cmd("log-grep", file, text)

    def log_tail_cmd(self, file: str, lines: int = 40) -> Cmd:
        return self.svc_cmd("log-tail", file, str(lines))

    def switch_cmd(self, current: str | None, previous: str | None) -> Cmd:
        """Point current/previous at releases by rename; None removes a link."""
        return self.svc_cmd("switch", current or "-", previous or "-")

    def unpack_cmd(self, tmp_name: str) -> Cmd:
        return self.svc_cmd("unpack", tmp_name)

    def hash_cmd(self, dirname: str) -> Cmd:
        return self.svc_cmd("hash", dirname)

    def commit_cmd(self, tmp_name: str, package_id: str) -> Cmd:
        return self.svc_cmd("commit", tmp_name, package_id)

    def discard_cmd(self, tmp_name: str) -> Cmd:
        return self.svc_cmd("discard", tmp_name)

    def put_secret_cmd(self, name: str = API_KEY_NAME) -> Cmd:
        return self.svc_cmd("put-secret", name)

    def cas_write_cmd(self, expected_sha256: str | None, file: str = "route.json") -> Cmd:
        return self.svc_cmd("cas-write", file, expected_sha256 or "absent")


def tmp_release_name(package_id: str, nonce: str) -> str:
    return f".{package_id}.tmp-{nonce}"
