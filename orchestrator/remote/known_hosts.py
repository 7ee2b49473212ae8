"""How a host is named in known_hosts: the one spelling pairctl writes (the lab) and looks up
(SSH, doctor). Kept apart from ssh.py so that writing known_hosts needs no SSH stack."""

from __future__ import annotations

from dataclasses import dataclass


def known_hosts_name(address: str, port: int) -> str:
    """The host pattern OpenSSH and paramiko look up: the bare address on 22, `[addr]:port` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


@dataclass(frozen=True)
class KnownHostsText:
    """A known_hosts file read as OpenSSH reads it: plain entries, `@revoked` keys (never accepted
    for any host), `@cert-authority` lines (not verified: set aside) and unreadable lines (skipped)."""

    entries: tuple[tuple[int, str], ...]  # (line number, line) of plain host-key lines
    revoked: frozenset[tuple[str, str]]  # (key type, base64 blob)
    cert_authorities: int
    skipped: tuple[int, ...]


def read_known_hosts(text: str) -> KnownHostsText:
    entries: list[tuple[int, str]] = []
    revoked: set[tuple[str, str]] = set()
    cas = 0
    skipped: list[int] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if fields[0].startswith("@"):
            if fields[0] == "@revoked" and len(fields) >= 4:
                revoked.add((fields[2], fields[3]))
            elif fields[0] == "@cert-authority":
                cas += 1
            else:
                skipped.append(n)
            continue
        entries.append((n, line))
    return KnownHostsText(tuple(entries), frozenset(revoked), cas, tuple(skipped))
