"""The lab's keys: the operator key pairctl logs in with, host keys, and known_hosts.

Keys are made with OpenSSH's own `ssh-keygen` (argv, no shell) so their format is exactly what
sshd and paramiko expect. known_hosts is the only trust anchor: pairctl never adds a key it
was not given here.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import PairctlError
from orchestrator.remote.known_hosts import known_hosts_name

SSH_KEYGEN = "/usr/bin/ssh-keygen"


def keygen_argv(path: Path, comment: str) -> tuple[str, ...]:
    """argv of `ssh-keygen` for an unencrypted ed25519 key at `path` (pure)."""
    return (SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))


def ensure_ed25519(path: Path, comment: str) -> Path:
    """Create the ed25519 key pair `path` / `path.pub` once; return the public key's path."""
    pub = path.with_name(path.name + ".pub")
    if path.is_file() and pub.is_file():
        return pub
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, pub):  # a half-written pair is useless; ssh-keygen would prompt to overwrite
        p.unlink(missing_ok=True)
    proc = subprocess.run(keygen_argv(path, comment), stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PairctlError(f"ssh-keygen failed for {path}: {proc.stderr.strip() or proc.returncode}")
    os.chmod(path, 0o600)
    return pub


def public_key_line(pub: Path) -> str:
    """`ssh-ed25519 AAAA...` without the comment."""
    parts = pub.read_text().split()
    if len(parts) < 2:
        raise PairctlError(f"{pub}: not an OpenSSH public key")
    return f"{parts[0]} {parts[1]}"


@dataclass(frozen=True)
class KnownHost:
    address: str
    port: int
    key: str  # "ssh-ed25519 AAAA..."

    def line(self) -> str:
        return f"{known_hosts_name(self.address, self.port)} {self.key}"


def merge_known_hosts(existing: str, entries: list[KnownHost]) -> str:
    """known_hosts text with `entries` replacing any line for the same host pattern (pure); other
    hosts' lines kept in order."""
    ours = {known_hosts_name(e.address, e.port) for e in entries}
    kept = []
    for line in existing.splitlines():
        fields = line.split()
        if fields and not line.lstrip().startswith("#") and set(fields[0].split(",")) & ours:
            continue
        if line.strip():
            kept.append(line)
    return "\n".join(kept + [e.line() for e in entries]) + "\n"


def write_known_hosts(path: Path, entries: list[KnownHost]) -> None:
    """Merge `entries` into `path` (see write_if_changed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(path, merge_known_hosts(path.read_text() if path.is_file() else "", entries), 0o644)


def write_if_changed(path: Path, text: str, mode: int) -> bool:
    """Write `text` to a temp name and rename it over `path` (never half a file), unless `path`
    already holds it; True when written."""
    if path.is_file() and path.read_text() == text:
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    tmp.replace(path)
    return True
