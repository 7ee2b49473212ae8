"""Leases: an exclusive, expiring hold on a host, taken atomically on the host itself.

Layout on a host: `<root>/leases/host.lock/lease.json`. Taking is `mkdir host.lock` (mkdir(2)
cannot be won twice), then writing `lease.json` to a temp name and renaming it into place.
Everything goes through the transport's file operations (SFTP on SSH hosts), so a lease costs a
few cheap requests and never depends on the remote login shell.

States a host can be in (`lease_state`):
  free       no lock directory
  held       lease.json present and not expired
  expired    lease.json present, expires_at passed: breakable with `break_expired=True` only
  half-made  lock directory without lease.json (a taker died between mkdir and write, or is
             writing right now): held, holder unknown; breakable once older than a grace period
  unreadable lease.json present but not a lease: held; never broken automatically

Times are UTC from the operator's clock (hosts and operators are assumed NTP-synced); the
lock directory's mtime (host clock) dates a half-made lease.
"""

from __future__ import annotations

import getpass
import hmac
import json
import re
import secrets
import socket
import stat as _stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator, Literal, Sequence

from orchestrator.errors import ConfigError, LeaseError, LeaseHeldError, RollbackFailed
from orchestrator.hashing import canonical_json
from orchestrator.log import get_logger

LEASES_DIR = "leases"
LOCK_DIR = "host.lock"
LEASE_FILE = "lease.json"
SCHEMA = 1
DEFAULT_TTL_S = 2 * 3600
DEFAULT_GRACE_S = 120.0
MAX_TTL_S = 7 * 24 * 3600

State = Literal["free", "held", "expired", "half-made", "unreadable"]


# -- pure parts ---------------------------------------------------------------------------------


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _parse_time(v: Any, what: str) -> datetime:
    if not isinstance(v, str):
        raise LeaseError(f"lease.json: {what} is not a timestamp string")
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise LeaseError(f"lease.json: {what} {v!r} is not an ISO 8601 timestamp") from None
    if t.tzinfo is None:
        raise LeaseError(f"lease.json: {what} {v!r} has no time zone")
    return t.astimezone(timezone.utc)


def new_nonce() -> str:
    return secrets.token_hex(16)


def default_owner() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Lease:
    """One lease record (what `lease.json` holds). `broken` is the record of an expired lease
    this one replaced, so a receipt can say what was broken and why."""

    nonce: str = field(repr=False)
    owner: str
    purpose: str
    taken_at: datetime
    expires_at: datetime
    host: str
    broken: dict[str, Any] | None = None

    def expired(self, now: datetime | None = None) -> bool:
        return (now or utcnow()) >= self.expires_at

    def remaining_s(self, now: datetime | None = None) -> float:
        return (self.expires_at - (now or utcnow())).total_seconds()

    def to_dict(self, *, include_nonce: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "host": self.host,
            "owner": self.owner,
            "purpose": self.purpose,
            "taken_at": _iso(self.taken_at),
            "expires_at": _iso(self.expires_at),
        }
        if include_nonce:
            d["nonce"] = self.nonce
        if self.broken is not None:
            d["broken"] = self.broken
        return d

    def to_json(self) -> bytes:
        return canonical_json(self.to_dict()) + b"\n"

    def public(self) -> dict[str, Any]:
        """For `show`, logs and receipts: everything but the nonce (the nonce releases it)."""
        return self.to_dict(include_nonce=False)


def parse_lease(data: bytes | str, *, host: str | None = None) -> Lease:
    """Parse `lease.json`; anything that is not a well-formed lease raises LeaseError."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise LeaseError("lease.json is not UTF-8") from None
    try:
        d = json.loads(data)
    except json.JSONDecodeError as exc:
        raise LeaseError(f"lease.json is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(d, dict):
        raise LeaseError("lease.json is not a JSON object")
    if d.get("schema") != SCHEMA:
        raise LeaseError(f"lease.json has schema {d.get('schema')!r}, expected {SCHEMA}")
    for k in ("nonce", "owner", "purpose", "host"):
        if not isinstance(d.get(k), str):
            raise LeaseError(f"lease.json: {k} missing or not a string")
    if not re.fullmatch(r"[0-9a-f]{16,128}", d["nonce"]):
        raise LeaseError("lease.json: nonce is not a hex token")
    taken, expires = _parse_time(d.get("taken_at"), "taken_at"), _parse_time(d.get("expires_at"), "expires_at")
    if expires <= taken:
        raise LeaseError("lease.json: expires_at is not after taken_at")
    broken = d.get("broken")
    if broken is not None and not isinstance(broken, dict):
        raise LeaseError("lease.json: broken is not an object")
    return Lease(
        nonce=d["nonce"],
        owner=d["owner"],
        purpose=d["purpose"],
        taken_at=taken,
        expires_at=expires,
        host=host or d["host"],
        broken=broken,
    )


def make_lease(host: str, owner: str, purpose: str, ttl_s: float, *, nonce: str | None = None,
               now: datetime | None = None) -> Lease:
    if not (0 < ttl_s <= MAX_TTL_S):
        raise ConfigError(f"lease ttl must be between 1 s and {MAX_TTL_S // 86400} days, not {ttl_s:g} s")
    if not owner.strip() or not purpose.strip():
        raise ConfigError("a lease needs an owner and a purpose")
    nonce = nonce or new_nonce()
    if not re.fullmatch(r"[0-9a-f]{16,128}", nonce):
        raise ConfigError("a lease nonce must be 16-128 lowercase hex characters")
    t = (now or utcnow()).replace(microsecond=0)
    return Lease(nonce=nonce, owner=owner, purpose=purpose, taken_at=t,
                 expires_at=t + timedelta(seconds=max(1, round(ttl_s))), host=host)


# -- on a host ----------------------------------------------------------------------------------


def _paths(install_root: str) -> tuple[str, str, str]:
    root = install_root.rstrip("/")
    leases = f"{root}/{LEASES_DIR}"
    lock = f"{leases}/{LOCK_DIR}"
    return leases, lock, f"{lock}/{LEASE_FILE}"


@dataclass(frozen=True)
class LeaseState:
    """What `lease_state` found on one host."""

    host: str
    state: State
    lease: Lease | None = None
    lock_age_s: float | None = None
    detail: str = ""

    @property
    def free(self) -> bool:
        return self.state == "free"

    def breakable(self, grace_s: float = DEFAULT_GRACE_S) -> bool:
        if self.state == "expired":
            return True
        return self.state == "half-made" and self.lock_age_s is not None and self.lock_age_s > grace_s

    def describe(self, now: datetime | None = None) -> str:
        if self.state == "free":
            return f"{self.host}: free"
        if self.lease is not None:
            l = self.lease
            if self.state == "expired":
                return (f"{self.host}: lease by {l.owner} for {l.purpose!r} EXPIRED at {_iso(l.expires_at)} "
                        f"(taken {_iso(l.taken_at)})")
            mins = l.remaining_s(now) / 60
            return (f"{self.host}: leased by {l.owner} for {l.purpose!r} until {_iso(l.expires_at)} "
                    f"({mins:.0f} min left)")
        age = f"{self.lock_age_s:.0f} s" if self.lock_age_s is not None else "unknown time"
        if self.state == "half-made":
            return (f"{self.host}: held, holder unknown: the lock directory exists without {LEASE_FILE} "
                    f"(for {age}; a taker is writing it or died between mkdir and write)")
        return f"{self.host}: held, holder unknown: {LEASE_FILE} is unreadable ({self.detail})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "state": self.state,
            "lease": self.lease.public() if self.lease else None,
            "lock_age_s": None if self.lock_age_s is None else round(self.lock_age_s, 1),
            "detail": self.detail,
        }


def lease_state(transport: Any, install_root: str, *, now: datetime | None = None) -> LeaseState:
    host = transport.name
    _, lock, file = _paths(install_root)
    now = now or utcnow()
    st = transport.stat(lock)
    if st is None:
        return LeaseState(host, "free")
    age = max(0.0, now.timestamp() - st.mtime)
    if not _stat.S_ISDIR(st.mode):
        return LeaseState(host, "unreadable", lock_age_s=age, detail=f"{lock} is not a directory")
    try:
        data = transport.read_bytes(file)
    except FileNotFoundError:
        return LeaseState(host, "half-made", lock_age_s=age)
    try:
        lease = parse_lease(data, host=host)
    except LeaseError as exc:
        return LeaseState(host, "unreadable", lock_age_s=age, detail=exc.message)
    return LeaseState(host, "expired" if lease.expired(now) else "held", lease=lease, lock_age_s=age)


def read_lease(transport: Any, install_root: str) -> Lease | None:
    """The lease in `lease.json`, or None when there is none (see `lease_state` for half-made)."""
    return lease_state(transport, install_root).lease


def _held_error(st: LeaseState, *, grace_s: float) -> LeaseHeldError:
    hint = None
    if st.state == "expired":
        hint = "the lease has expired; `--break-expired` (break_expired=True) breaks it, and that is recorded"
    elif st.state == "half-made":
        hint = (f"it can be broken with --break-expired once older than {grace_s:.0f} s"
                if not st.breakable(grace_s) else "it is older than the grace period: --break-expired breaks it")
    elif st.state == "unreadable":
        hint = "inspect the host's leases/ directory by hand; pairctl never breaks an unreadable lease"
    return LeaseHeldError(f"host is leased: {st.describe()}", hint=hint)


def _tomb(leases_dir: str, why: str, nonce: str) -> str:
    return f"{leases_dir}/.{why}.{nonce}.{secrets.token_hex(4)}"


def _remove_tree_shallow(transport: Any, d: str) -> None:
    """Remove a (former) lock directory: its files, then itself. Best effort."""
    try:
        for n in transport.listdir(d):
            try:
                transport.remove(f"{d}/{n}")
            except OSError:
                pass
        transport.rmdir(d)
    except OSError:
        get_logger(host=transport.name).warning("could not remove old lease directory", path=d)


def _break(transport: Any, install_root: str, st: LeaseState, *, by: str, grace_s: float,
           may_break: Callable[[LeaseState], bool] | None = None, why: str | None = None) -> dict[str, Any]:
    """Move the judged lock away atomically (rename) and return its record for the receipt.

    The rename only happens after re-reading that the lock is still the one judged breakable
    (`may_break`, by default: expired, or half-made past `grace_s`); if the moved lock turns out
    to hold another lease (lost race), it is moved back.
    """
    leases, lock, file = _paths(install_root)
    log = get_logger(host=transport.name)
    again = lease_state(transport, install_root)
    same = (again.state == st.state and
            ((st.lease is None and again.lease is None) or
             (st.lease is not None and again.lease is not None and again.lease.nonce == st.lease.nonce)))
    if not same or not (may_break or (lambda s: s.breakable(grace_s)))(again):
        raise LeaseHeldError(f"host is leased: {again.describe()}", hint="the lease changed while breaking it; nothing broken")
    old_nonce = st.lease.nonce if st.lease else "none"
    tomb = _tomb(leases, "broken", old_nonce)
    transport.rename(lock, tomb)
    try:
        moved = transport.read_bytes(f"{tomb}/{LEASE_FILE}")
        moved_nonce = parse_lease(moved).nonce
    except FileNotFoundError:
        moved_nonce = "none"
    except LeaseError:
        moved_nonce = "unparseable"
    if moved_nonce != old_nonce:
        try:
            transport.rename(tomb, lock)
        except OSError:
            pass
        raise LeaseHeldError(f"{transport.name}: the lease changed while breaking it; nothing broken")
    _remove_tree_shallow(transport, tomb)
    record = {
        "host": transport.name,
        "state": st.state,
        "lease": st.lease.public() if st.lease else None,
        "lock_age_s": None if st.lock_age_s is None else round(st.lock_age_s, 1),
        "broken_at": _iso(utcnow()),
        "broken_by": by,
    }
    if why:
        record["why"] = why
    log.warning("lease broken", **{k: v for k, v in record.items() if k != "host"})
    return record


def take_lease(
    transport: Any,
    install_root: str,
    owner: str,
    purpose: str,
    ttl_s: float = DEFAULT_TTL_S,
    *,
    nonce: str | None = None,
    break_expired: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
) -> Lease:
    """Take the host's lease or fail at once (LeaseHeldError naming holder, purpose, until when).

    With `break_expired`, an expired lease (or a half-made one older than `grace_s`) is broken
    first; the returned lease's `broken` holds the broken record. A live lease is never broken.
    """
    log = get_logger(host=transport.name)
    leases, lock, file = _paths(install_root)
    lease = make_lease(transport.name, owner, purpose, ttl_s, nonce=nonce)
    transport.makedirs(leases, 0o755)
    broken: dict[str, Any] | None = None
    for attempt in range(3):
        try:
            transport.mkdir(lock, 0o755)
        except FileExistsError:
            st = lease_state(transport, install_root)
            if st.free:
                continue  # released between our mkdir and our look: try again
            if break_expired and st.breakable(grace_s) and broken is None:
                broken = _break(transport, install_root, st, by=owner, grace_s=grace_s)
                continue
            raise _held_error(st, grace_s=grace_s) from None
        # we own the lock directory: write lease.json by temp + rename
        if broken is not None:
            lease = Lease(**{**lease.__dict__, "broken": broken})
        tmp = f"{lock}/.{LEASE_FILE}.{lease.nonce[:8]}.tmp"
        try:
            transport.put_bytes(lease.to_json(), tmp, mode=0o644)
            transport.rename(tmp, file)
        except BaseException:
            # leave no half-made lease behind if we can help it
            for p, fn in ((tmp, transport.remove), (file, transport.remove), (lock, transport.rmdir)):
                try:
                    fn(p)
                except Exception:
                    pass
            raise
        log.info("lease taken", owner=owner, purpose=purpose, expires_at=_iso(lease.expires_at),
                 broke=bool(broken))
        return lease
    st = lease_state(transport, install_root)
    raise _held_error(st, grace_s=grace_s)


def release_lease(transport: Any, install_root: str, nonce: str) -> Lease:
    """Release the lease holding `nonce`, then read back that it is no longer active.

    A wrong nonce raises LeaseError and leaves the lease untouched. Returns the released lease.
    """
    leases, lock, file = _paths(install_root)
    st = lease_state(transport, install_root)
    if st.lease is None:
        if st.free:
            raise LeaseError(f"{transport.name}: no lease is held; nothing to release")
        raise LeaseError(f"cannot release: {st.describe()}")
    if not hmac.compare_digest(st.lease.nonce.encode(), nonce.encode()):
        raise LeaseError(
            f"wrong nonce for the lease on {transport.name} (held by {st.lease.owner} for "
            f"{st.lease.purpose!r} until {_iso(st.lease.expires_at)}); the lease is untouched",
            hint="use the nonce `pairctl lease take` printed",
        )
    tomb = _tomb(leases, "released", nonce[:16])
    transport.rename(lock, tomb)
    try:
        moved_nonce = parse_lease(transport.read_bytes(f"{tomb}/{LEASE_FILE}")).nonce
    except (FileNotFoundError, LeaseError):
        moved_nonce = ""
    if moved_nonce != nonce:  # someone replaced the lease between our read and our rename
        try:
            transport.rename(tomb, lock)
        except OSError:
            pass
        raise LeaseError(f"{transport.name}: the lease changed while releasing it; left as found")
    _remove_tree_shallow(transport, tomb)
    after = lease_state(transport, install_root)
    if after.lease is not None and after.lease.nonce == nonce:
        raise LeaseError(f"{transport.name}: lease still active after release ({after.describe()})")
    get_logger(host=transport.name).info("lease released", owner=st.lease.owner, purpose=st.lease.purpose,
                                         verified=after.state)
    return st.lease


def renew_lease(transport: Any, install_root: str, nonce: str, ttl_s: float) -> Lease:
    """Extend the live lease holding `nonce` to at least now + `ttl_s` (never shortened).

    For a run that holds a pair across several steps (qualification's arms): each step renews
    the one lease instead of taking its own, so no other run slips in between. Only a live lease
    is renewed: an expired one may be broken by anybody at any moment, so renewing it could
    write into another taker's lock (LeaseError; take a new one instead). Written by temp +
    rename inside the lock directory, as taking does.
    """
    _, lock, file = _paths(install_root)
    st = lease_state(transport, install_root)
    if st.lease is None or not hmac.compare_digest(st.lease.nonce.encode(), nonce.encode()):
        raise LeaseError(f"cannot renew: the lease this run holds is gone ({st.describe()})")
    if st.state != "held":
        raise LeaseError(f"cannot renew: {st.describe()}; an expired lease may already be someone else's")
    want = make_lease(transport.name, st.lease.owner, st.lease.purpose, ttl_s, nonce=nonce).expires_at
    if want <= st.lease.expires_at:
        return st.lease
    renewed = Lease(**{**st.lease.__dict__, "expires_at": want})
    tmp = f"{lock}/.{LEASE_FILE}.{nonce[:8]}.renew.tmp"
    transport.put_bytes(renewed.to_json(), tmp, mode=0o644)
    transport.rename(tmp, file)
    get_logger(host=transport.name).info("lease renewed", purpose=renewed.purpose, expires_at=_iso(want))
    return renewed


def parse_run_of(purpose: str) -> str | None:
    """The run id a pairctl run writes at the end of its lease's purpose: `... (run RUN_ID)`."""
    m = re.search(r"\(run ([A-Za-z0-9_.:-]+)\)$", purpose)
    return m.group(1) if m else None


def run_of(lease: Lease) -> str | None:
    return parse_run_of(lease.purpose)


def break_run_lease(transport: Any, install_root: str, run_id: str, *, by: str, why: str) -> dict[str, Any] | None:
    """Break the lease that run `run_id` holds on this host (the caller has proven the run over:
    its nonce died with it). None when the host is free; LeaseError when another holds it."""
    st = lease_state(transport, install_root)
    if st.free:
        return None
    if st.lease is None or run_of(st.lease) != run_id:
        raise LeaseError(f"not run {run_id}'s lease: {st.describe()}; nothing broken")
    return _break(transport, install_root, st, by=by, grace_s=DEFAULT_GRACE_S, why=why,
                  may_break=lambda s: s.lease is not None and run_of(s.lease) == run_id)


# -- several hosts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseTarget:
    transport: Any
    install_root: str

    @property
    def name(self) -> str:
        return self.transport.name


def _targets(targets: Sequence[Any]) -> list[LeaseTarget]:
    out = [t if isinstance(t, LeaseTarget) else LeaseTarget(*t) for t in targets]
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"the same host twice in one lease request: {names}")
    return sorted(out, key=lambda t: t.name)  # one fixed order for every taker


def take_leases(targets: Sequence[Any], owner: str, purpose: str, ttl_s: float = DEFAULT_TTL_S, *,
                nonce: str | None = None, break_expired: bool = False,
                grace_s: float = DEFAULT_GRACE_S) -> list[Lease]:
    """Take every host's lease with one nonce, in name order; if one fails, release those taken."""
    nonce = nonce or new_nonce()
    taken: list[tuple[LeaseTarget, Lease]] = []
    try:
        for t in _targets(targets):
            taken.append((t, take_lease(t.transport, t.install_root, owner, purpose, ttl_s, nonce=nonce,
                                        break_expired=break_expired, grace_s=grace_s)))
    except BaseException as exc:
        for t, _ in reversed(taken):
            try:
                release_lease(t.transport, t.install_root, nonce)
            except Exception as rel_exc:
                exc.add_note(f"and releasing the lease already taken on {t.name} failed: {rel_exc}")
        raise
    return [lease for _, lease in taken]


def release_leases(targets: Sequence[Any], nonce: str) -> list[Lease]:
    """Release on every host (reverse order), collecting each host's error; one error at the end."""
    released: list[Lease] = []
    errors: list[str] = []
    for t in reversed(_targets(targets)):
        try:
            released.append(release_lease(t.transport, t.install_root, nonce))
        except Exception as exc:
            errors.append(f"{t.name}: {exc}")
    if errors:
        raise LeaseError("release failed on " + "; ".join(errors))
    return released


@dataclass
class HeldLeases:
    """What `hold_pair_leases` yields: the leases, their nonce, and a way to keep them."""

    targets: list[LeaseTarget]
    leases: list[Lease]
    nonce: str = field(repr=False)
    kept: str | None = None
    ended: dict[str, Any] = field(default_factory=dict)  # how the hold ended, once it has

    def keep(self, reason: str) -> None:
        """Do not release on exit (a failed rollback: nobody may deploy onto an unknown state)."""
        self.kept = reason

    def public(self) -> dict[str, Any]:
        """For receipts: the leases without their nonce."""
        return {"hosts": [l.public() for l in self.leases]}

    def end(self) -> dict[str, Any]:
        return dict(self.ended)

    @property
    def broken(self) -> list[dict[str, Any]]:
        return [l.broken for l in self.leases if l.broken]


@contextmanager
def hold_pair_leases(
    targets: Sequence[Any],
    *,
    owner: str,
    purpose: str,
    ttl_s: float = DEFAULT_TTL_S,
    break_expired: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    record_release_error: bool = False,
) -> Iterator[HeldLeases]:
    """Hold every host's lease for the body; release them on every path.

    `targets` are `(transport, install_root)` pairs (or `LeaseTarget`s). The leases are kept
    (not released) when the body calls `held.keep(reason)` or raises `RollbackFailed`. A failed
    release after a failed body is added as a note to the body's exception, never hiding it;
    after a body that succeeded it is raised, or with `record_release_error` only recorded in
    `held.ended` (the body's work is done and must not be lost to it). `held.ended` says how the
    hold ended on every path.
    """
    nonce = new_nonce()
    ts = _targets(targets)
    leases = take_leases(ts, owner, purpose, ttl_s, nonce=nonce, break_expired=break_expired, grace_s=grace_s)
    held = HeldLeases(targets=ts, leases=leases, nonce=nonce)
    log = get_logger(lease=nonce[:8])
    hosts = [t.name for t in ts]
    try:
        yield held
    except BaseException as exc:
        if isinstance(exc, RollbackFailed) and held.kept is None:
            held.keep("rollback failed")
        if held.kept is None:
            try:
                release_leases(ts, nonce)
                held.ended = {"released": hosts}
            except Exception as rel_exc:
                held.ended = {"release_failed": str(rel_exc)}
                exc.add_note(f"releasing the leases also failed: {rel_exc}")
        else:
            held.ended = {"kept": held.kept, "hosts": hosts}
            exc.add_note(f"leases KEPT on {', '.join(hosts)}: {held.kept}")
            log.warning("leases kept", reason=held.kept, hosts=hosts)
        raise
    else:
        if held.kept is not None:
            held.ended = {"kept": held.kept, "hosts": hosts}
            log.warning("leases kept", reason=held.kept, hosts=hosts)
            return
        try:
            release_leases(ts, nonce)
            held.ended = {"released": hosts}
        except LeaseError as rel_exc:
            held.ended = {"release_failed": str(rel_exc)}
            if not record_release_error:
                raise
            log.error("releasing the leases failed", error=str(rel_exc), hosts=hosts)


# -- operator level: a host or a pair of an inventory -------------------------------------------


def hosts_of(inventory: Any, target: str) -> list[str]:
    """A pair name means both its hosts; otherwise a host name. Unknown names are ConfigError."""
    if target in inventory.pairs:
        p = inventory.pairs[target]
        return sorted([p.native, p.rpc])
    if target in inventory.hosts:
        return [target]
    raise ConfigError(
        f"{target!r} is neither a pair nor a host of the inventory "
        f"(pairs: {', '.join(sorted(inventory.pairs)) or 'none'}; hosts: {', '.join(sorted(inventory.hosts))})"
    )


def targets_of(inventory: Any, pool: Any, target: str) -> list[LeaseTarget]:
    return [LeaseTarget(pool.get(h), inventory.host(h).install_root) for h in hosts_of(inventory, target)]


def show_leases(inventory: Any, pool: Any, target: str) -> list[LeaseState]:
    return [lease_state(t.transport, t.install_root) for t in targets_of(inventory, pool, target)]
