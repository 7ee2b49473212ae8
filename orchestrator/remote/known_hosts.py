"""How a host is named in known_hosts: the one spelling pairctl writes (the lab) and looks up
(SSH, doctor). Kept apart from ssh.py so that writing known_hosts needs no SSH stack."""

from __future__ import annotations


def known_hosts_name(address: str, port: int) -> str:
    """The host pattern OpenSSH and paramiko look up: the bare address on 22, `[addr]:port` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"
