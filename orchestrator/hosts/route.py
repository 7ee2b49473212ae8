"""The route record: what is active on a pair, persisted on the hosts with a revision number.

`route.json` on the native host (the record of truth) and a copy on the RPC host, replaced only
by compare-and-swap (the helper swaps under flock only if the content hash the writer read is
still there, and prints the file back). It carries the active and previous pair's argv (a check
only: a rollback renders argv anew). The host is untrusted: `mac` is an HMAC over the rest with a
key in the operator's home (engine/route_trust.py), and `evidence_head`/`evidence_home` name the
pair's newest receipt, so a deleted receipt or chain shows up on the next read. Its states are
engine/route_states.py's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import HostStateError
from orchestrator.evidence.safejson import MAX_DEPTH, parse_bounded
from orchestrator.hashing import canonical_json, sha256_bytes, sha256_json
from orchestrator.remote.transport import HOST_FILE_MAX, Transport

SCHEMA = "pairctl.route/1"


class RouteEntry(BaseModel):
    """One matched pair as it runs: packages, profile and the exact argv of both services."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    native_package: str
    rpc_package: str
    package_revision: str
    profile_name: str
    profile_sha256: str
    profile: dict[str, Any]
    native_argv: list[str]
    rpc_argv: list[str]
    argv_sha256: str
    # the inventory's model files (name -> sha256) as hashed on the native host at deploy time
    models: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        native_package: str,
        rpc_package: str,
        package_revision: str,
        profile: dict[str, Any],
        native_argv: list[str],
        rpc_argv: list[str],
    ) -> RouteEntry:
        return cls(
            native_package=native_package,
            rpc_package=rpc_package,
            package_revision=package_revision,
            profile_name=str(profile.get("name", "")),
            profile_sha256=sha256_json(profile),
            profile=profile,
            native_argv=list(native_argv),
            rpc_argv=list(rpc_argv),
            argv_sha256=argv_digest(native_argv, rpc_argv),
        )

    def names(self) -> str:
        return f"{self.native_package} + {self.rpc_package} ({self.profile_name})"

    def package(self, role: str) -> str:
        return self.native_package if role == "native" else self.rpc_package


class RouteRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: str = Field(default=SCHEMA, alias="schema")
    pair: str
    revision: int = Field(ge=1)
    active: RouteEntry | None
    previous: RouteEntry | None = None
    updated_at: str
    updated_by: str  # the run id that wrote it
    # engine/route_states.py; previous_state: what `previous` had
    state: Literal["active", "activating", "identity-verified"] = "active"
    previous_state: Literal["active", "identity-verified"] | None = None
    evidence_head: str | None = None  # the pair's newest receipt when the writing run began
    # the writing home's id: whose chain `evidence_head` is in (None: written before homes were named)
    evidence_home: str | None = None
    mac: str | None = None  # HMAC-SHA256 of the record without `mac` (None: not signed)

    def _dump(self) -> dict[str, Any]:
        d = self.model_dump(mode="json", by_alias=True)
        for k in ("previous_state", "evidence_home"):  # records written before they existed keep their bytes
            if d.get(k) is None:
                d.pop(k, None)
        return d

    def to_bytes(self) -> bytes:
        return canonical_json(self._dump()) + b"\n"

    def signed_part(self) -> bytes:
        """What the mac covers: the canonical record without its mac."""
        d = self._dump()
        d.pop("mac", None)
        return canonical_json(d)

    def sign(self, key: bytes) -> RouteRecord:
        return self.model_copy(update={"mac": record_mac(key, self.signed_part())})

    def mac_ok(self, key: bytes) -> bool:
        return self.mac is not None and hmac.compare_digest(self.mac, record_mac(key, self.signed_part()))


def record_mac(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def argv_digest(native_argv: list[str], rpc_argv: list[str]) -> str:
    return sha256_json({"native": list(native_argv), "rpc": list(rpc_argv)})


def entry_argv_ok(entry: RouteEntry) -> bool:
    """The entry's argv_sha256 is the digest of its argv (an edited argv left it stale)."""
    return entry.argv_sha256 == argv_digest(entry.native_argv, entry.rpc_argv)


def parse_route(data: bytes | None, *, where: str = "route.json", pair: str | None = None) -> RouteRecord | None:
    """The record in `data` (None: no record). `where` names host and path for the message."""
    if data is None:
        return None
    try:
        obj = parse_bounded(data, max_bytes=HOST_FILE_MAX, max_depth=MAX_DEPTH, noun="route record")
        rec = RouteRecord.model_validate(obj)
        rec.to_bytes()  # a record that has no canonical form (a lone surrogate) cannot be judged
        return rec
    except (ValueError, ValidationError) as exc:  # Unbounded is a ValueError
        first = str(exc).splitlines()[0][:200]
        fix = f"`pairctl repair --pair {pair}` rebuilds it from the links" if pair else "`pairctl repair` rebuilds it"
        raise HostStateError(f"{where} does not parse ({first})", hint=fix) from None


def content_sha(data: bytes | None) -> str | None:
    """The CAS token: sha256 of the bytes read (None = no record yet)."""
    return None if data is None else sha256_bytes(data)


def next_record(
    current: RouteRecord | None,
    *,
    pair: str,
    active: RouteEntry | None,
    previous: RouteEntry | None,
    run_id: str,
    now: datetime | None = None,
) -> RouteRecord:
    """The successor record: revision + 1 (1 for the first), pure."""
    ts = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    return RouteRecord(
        pair=pair,
        revision=(current.revision + 1) if current else 1,
        active=active,
        previous=previous,
        updated_at=ts,
        updated_by=run_id,
    )


class RouteConflict(Exception):
    """route.json is not what this run read: someone else wrote it (compare-and-swap refused)."""


def cas_write(transport: Transport, path: str, expected: bytes | None, data: bytes) -> bytes:
    """Compare-and-swap over SFTP: read, check it is still `expected`, write a temporary file,
    rename it over route.json, read back. Returns what was read back (the caller compares)."""
    try:
        current: bytes | None = transport.read_bytes(path, max_bytes=HOST_FILE_MAX)
    except FileNotFoundError:
        current = None
    if content_sha(current) != content_sha(expected):
        raise RouteConflict(
            f"route.json changed under this run: expected {_describe(expected)}, found {_describe(current)}"
        )
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    transport.put_bytes(data, tmp, mode=0o644)
    transport.rename(tmp, path)
    return transport.read_bytes(path, max_bytes=HOST_FILE_MAX)


def _describe(data: bytes | None) -> str:
    if data is None:
        return "no record"
    try:
        rec = parse_route(data)
        return f"revision {rec.revision} by {rec.updated_by}" if rec else "no record"
    except HostStateError:
        return f"content sha256 {sha256_bytes(data)[:16]}"
