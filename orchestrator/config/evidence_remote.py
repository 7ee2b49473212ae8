"""The team's evidence remote (inventory field `evidence_remote`): a git repository reached over SSH.

In the inventory because the team shares one, so all who deploy its pairs push to one remote. The
URL's host must be an inventory host (or its address): user, port, key and the `known_hosts` check
are that host's, exactly as pairctl's own SSH connections.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from orchestrator.config.base import StrictModel

if TYPE_CHECKING:
    from orchestrator.evidence.team import RemoteAccess

_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,63}$")


class EvidenceRemote(StrictModel):
    url: str = Field(
        description="ssh://[USER@]HOST[:PORT]/ABSOLUTE/PATH.git; HOST is an inventory host (name or address)"
    )
    allowed_signers: str | None = Field(
        default=None,
        description="OpenSSH allowed_signers file listing the team's signing keys (`receipts verify --remote`)",
    )
    signing_key: str | None = Field(
        default=None, description="your private SSH key that signs every push (default: the remote host's key)"
    )
    timeout_s: float = Field(default=60.0, gt=0, le=3600, description="bound on one push, fetch or pull")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parse_url(v)
        return v


@dataclass(frozen=True)
class ParsedUrl:
    user: str | None
    host: str
    port: int | None
    path: str


def parse_url(url: str) -> ParsedUrl:
    """`ssh://[user@]host[:port]/abs/path`, strictly: no query, fragment, password or relative path
    (a path is handed to git-receive-pack on the host; nothing in it may read as an option)."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as exc:
        raise ValueError(
            f"evidence_remote.url {url!r} is not a URL ({exc}); write ssh://HOST/ABSOLUTE/PATH.git"
        ) from None
    if u.scheme != "ssh" or not u.hostname:
        raise ValueError(f"evidence_remote.url {url!r}: only ssh://[USER@]HOST[:PORT]/ABSOLUTE/PATH.git is supported")
    if u.password is not None or u.query or u.fragment:
        raise ValueError(f"evidence_remote.url {url!r}: no password, query or fragment")
    if u.username is not None and not _USER.match(u.username):
        raise ValueError(
            f"evidence_remote.url {url!r}: the user name must be letters, digits, . _ - (not starting with -)"
        )
    path = u.path
    if not _PATH.match(path) or posixpath.normpath(path) != path or path == "/":
        raise ValueError(
            f"evidence_remote.url {url!r}: the path must be absolute and plain (letters, digits, . _ / + -), "
            "e.g. /srv/pairctl/evidence.git"
        )
    return ParsedUrl(user=u.username, host=u.hostname, port=port, path=path)


class _Host(Protocol):
    """What the remote borrows of an inventory host (config.inventory's HostSpec)."""

    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def user(self) -> str | None: ...
    @property
    def key(self) -> str | None: ...


class Hosts(Protocol):
    """What the remote is resolved against: an Inventory, named by its parts because the inventory
    module validates with this one (an import back would be a cycle)."""

    @property
    def hosts(self) -> Mapping[str, _Host]: ...
    @property
    def known_hosts(self) -> str: ...
    @property
    def use_ssh_config(self) -> bool: ...


def resolve_remote(inv: Hosts) -> RemoteAccess | None:
    """The inventory's remote resolved against its hosts (None: no remote configured).
    Raises ValueError naming the field when the URL's host is not one of the inventory's."""
    from orchestrator.evidence.team import RemoteAccess  # only a command that reaches the remote loads git's side

    spec = getattr(inv, "evidence_remote", None)
    if spec is None:
        return None
    p = parse_url(spec.url)
    name = next((n for n, h in inv.hosts.items() if p.host in (n, h.address)), None)
    if name is None:
        raise ValueError(
            f"evidence_remote.url: host {p.host!r} is not a host of this inventory "
            f"(hosts: {', '.join(sorted(inv.hosts))}); name one of them, whose key and known_hosts entry pairctl uses"
        )
    h = inv.hosts[name]
    user = p.user or h.user
    port = p.port or h.port
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={inv.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "ConnectTimeout=10",
        "-p",
        str(port),
    ]
    if h.key:
        argv += ["-i", h.key, "-o", "IdentitiesOnly=yes"]
    if not inv.use_ssh_config:
        argv += ["-F", "/dev/null"]
    dest = f"{user}@{h.address}" if user else h.address
    host_part = f"[{h.address}]" if ":" in h.address else h.address
    url = f"ssh://{user + '@' if user else ''}{host_part}:{port}{p.path}"
    return RemoteAccess(
        url=url,
        path=p.path,
        host_name=name,
        ssh_argv=tuple(argv),
        destination=dest,
        port=port,
        signing_key=spec.signing_key or h.key,
        allowed_signers=spec.allowed_signers,
        timeout_s=spec.timeout_s,
    )
