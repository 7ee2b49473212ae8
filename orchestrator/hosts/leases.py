"""Leases: an exclusive, expiring hold on a host, taken atomically on the host itself.

`<root>/leases/host.lock/lease.json` (0600: its nonce releases it): taking is `mkdir host.lock`
(mkdir(2) cannot be won twice), then lease.json written to a temp name and renamed in, all over
the transport's file operations (SFTP), never the login shell. States (`lease_state`): free;
held; expired (breakable with `break_expired`); half-made (a lock directory without lease.json:
breakable past a grace period); unreadable (never broken automatically).

Every time in a lease is the host's (the mtime of a file it just wrote, `host_now`): an operator
whose clock is off must neither break a live lease nor write one already expired. A run renews
(`renewed_at`, the heartbeat) at least every `stale_after_s`, so another operator can prove it
over from the host alone (`LeaseState.stale`).
"""

from __future__ import annotations

import getpass
import hmac
import json
import re
import secrets
import socket
import stat as _stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from orchestrator.errors import ConfigError, HostError, LeaseError, LeaseHeldError, RollbackFailed
from orchestrator.errors import LeaseLost as LeaseLost  # where callers have always found it
from orchestrator.hashing import canonical_json
from orchestrator.hosts.layout import HostLayout, move_layout
from orchestrator.log import get_logger
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import HOST_FILE_MAX, FileStat, HostClock, Lstat, ReadFile, Transport, fs_batch

LEASES_DIR = "leases"
LOCK_DIR = "host.lock"
LEASE_FILE = "lease.json"
SCHEMA = 1
DEFAULT_TTL_S = 2 * 3600
DEFAULT_GRACE_S = 120.0
MAX_TTL_S = 7 * 24 * 3600


def check_request(owner: str, purpose: str, ttl_s: float) -> None:
    """What a lease asks for, judged before any host is contacted (and again when it is made)."""
    if not (0 < ttl_s <= MAX_TTL_S):
        raise ConfigError(f"lease ttl must be between 1 s and {MAX_TTL_S // 86400} days, not {ttl_s:g} s")
    if not owner.strip() or not purpose.strip():
        raise ConfigError("a lease needs an owner and a purpose")


LEASE_MODE = 0o600
CLOCK_PROBE = ".clock"

State = Literal["free", "held", "expired", "half-made", "unreadable"]


# -- pure parts ---------------------------------------------------------------------------------


def utcnow() -> datetime:
    """The operator's clock: only for records of what the operator did (`broken_at`), never to
    judge a lease."""
    return datetime.now(UTC)


# (transport, leases_dir) -> the host's time now. Injected by tests; `host_now` by default.
Clock = Callable[[Any, str], datetime]


def host_now(transport: Transport, leases_dir: str) -> datetime:
    """The host's clock: the mtime of a file the host writes now (then removed). One cheap SFTP
    write + stat + remove; filesystem times come from the host's kernel clock."""
    probe = f"{leases_dir}/{CLOCK_PROBE}.{secrets.token_hex(4)}"
    try:
        transport.put_bytes(b"", probe, mode=LEASE_MODE)
    except (HostError, OSError):
        return _host_date(transport)  # a full disk (or a read-only one): ask the host's `date` instead
    try:
        st = transport.stat(probe)
    finally:
        with suppress(OSError):
            transport.remove(probe)
    if st is None:
        raise LeaseError(f"{transport.name}: cannot read the host's clock ({probe} vanished)")
    return datetime.fromtimestamp(int(st.mtime), UTC)  # whole seconds, as SFTP reports them


def _host_date(transport: Transport) -> datetime:
    """The host's clock from `date +%s` (one exec): when no file can be written to read it from."""
    res = transport.run(Cmd(("date", "+%s")), check=False, timeout=30)
    text = as_text(res.stdout).strip()
    if res.exit_status != 0 or not text.isdigit():
        raise LeaseError(f"{transport.name}: cannot read the host's clock (date +%s printed {text[:40]!r})")
    return datetime.fromtimestamp(int(text), UTC)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _parse_time(v: Any, what: str) -> datetime:
    if not isinstance(v, str):
        raise LeaseError(f"lease.json: {what} is not a timestamp string")
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise LeaseError(f"lease.json: {what} {v!r} is not an ISO 8601 timestamp") from None
    if t.tzinfo is None:
        raise LeaseError(f"lease.json: {what} {v!r} has no time zone")
    return t.astimezone(UTC)


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
    renewed_at: datetime | None = None  # the holder's last heartbeat (host time); None: never renewed
    # None: no heartbeat promise (`lease take` by a person): never judged stale; only expiry frees it
    stale_after_s: int | None = None  # the holder renews at least this often

    def expired(self, now: datetime) -> bool:
        return now >= self.expires_at

    def remaining_s(self, now: datetime) -> float:
        return (self.expires_at - now).total_seconds()

    @property
    def heartbeat(self) -> datetime:
        return self.renewed_at or self.taken_at

    def heartbeat_age_s(self, now: datetime) -> float:
        return (now - self.heartbeat).total_seconds()

    def stale(self, now: datetime) -> bool:
        """The holder broke its promise to renew: its run is over (judged by host time only)."""
        return self.stale_after_s is not None and self.heartbeat_age_s(now) > self.stale_after_s

    @property
    def run_id(self) -> str | None:
        return parse_run_of(self.purpose)

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
        if self.renewed_at is not None:
            d["renewed_at"] = _iso(self.renewed_at)
        if self.stale_after_s is not None:
            d["stale_after_s"] = self.stale_after_s
        return d

    def to_json(self) -> bytes:
        return canonical_json(self.to_dict()) + b"\n"

    def public(self) -> dict[str, Any]:
        """For `show`, logs and receipts: everything but the nonce (the nonce releases it)."""
        return self.to_dict(include_nonce=False)


def parse_lease(data: bytes | str, *, host: str | None = None) -> Lease:
    """Parse `lease.json`; anything that is not a well-formed lease raises LeaseError."""
    if len(data) > HOST_FILE_MAX:
        raise LeaseError(f"lease.json is more than {HOST_FILE_MAX} bytes, which no lease is")
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
    renewed = None if d.get("renewed_at") is None else _parse_time(d["renewed_at"], "renewed_at")
    stale_after = d.get("stale_after_s")
    if stale_after is not None and (
        not isinstance(stale_after, int) or isinstance(stale_after, bool) or stale_after <= 0
    ):
        raise LeaseError("lease.json: stale_after_s is not a positive integer")
    return Lease(
        nonce=d["nonce"],
        owner=d["owner"],
        purpose=d["purpose"],
        taken_at=taken,
        expires_at=expires,
        host=host or d["host"],
        broken=broken,
        renewed_at=renewed,
        stale_after_s=stale_after,
    )


def make_lease(
    host: str,
    owner: str,
    purpose: str,
    ttl_s: float,
    *,
    nonce: str | None = None,
    now: datetime | None = None,
    stale_after_s: int | None = None,
) -> Lease:
    """A new lease record. `now` is the host's time (`host_now`); the operator's only for pure use."""
    check_request(owner, purpose, ttl_s)
    nonce = nonce or new_nonce()
    if not re.fullmatch(r"[0-9a-f]{16,128}", nonce):
        raise ConfigError("a lease nonce must be 16-128 lowercase hex characters")
    if stale_after_s is not None and not (0 < stale_after_s):
        raise ConfigError(f"a lease's heartbeat bound must be positive, not {stale_after_s} s")
    t = (now or utcnow()).replace(microsecond=0)
    return Lease(
        nonce=nonce,
        owner=owner,
        purpose=purpose,
        taken_at=t,
        expires_at=t + timedelta(seconds=max(1, round(ttl_s))),
        host=host,
        stale_after_s=stale_after_s,
    )


# -- on a host ----------------------------------------------------------------------------------


def _paths(install_root: str) -> tuple[str, str, str]:
    root = install_root.rstrip("/")
    leases = f"{root}/{LEASES_DIR}"
    lock = f"{leases}/{LOCK_DIR}"
    return leases, lock, f"{lock}/{LEASE_FILE}"


@dataclass(frozen=True)
class LeaseState:
    """What `lease_state` found on one host, and the host's time when it looked (`now`)."""

    host: str
    state: State
    lease: Lease | None = None
    lock_age_s: float | None = None
    detail: str = ""
    now: datetime | None = None  # the host's clock at the look (None: free, no clock needed)

    @property
    def free(self) -> bool:
        return self.state == "free"

    @property
    def stale(self) -> bool:
        """Held by a run whose heartbeat is older than the bound it promised (host time)."""
        return self.lease is not None and self.now is not None and self.lease.stale(self.now)

    def remaining_s(self) -> float | None:
        return None if self.lease is None or self.now is None else self.lease.remaining_s(self.now)

    def breakable(self, grace_s: float = DEFAULT_GRACE_S) -> bool:
        if self.state == "expired":
            return True
        return self.state == "half-made" and self.lock_age_s is not None and self.lock_age_s > grace_s

    def describe(self) -> str:
        if self.state == "free":
            return f"{self.host}: free"
        if self.lease is not None:
            lease = self.lease
            run = f" (run {lease.run_id})" if lease.run_id and f"(run {lease.run_id})" not in lease.purpose else ""
            if self.state == "expired":
                return (
                    f"{self.host}: lease by {lease.owner} for {lease.purpose!r}{run} EXPIRED at "
                    f"{_iso(lease.expires_at)} (taken {_iso(lease.taken_at)}, host time)"
                )
            mins = (self.remaining_s() or 0.0) / 60
            beat: str = ""
            if self.now is not None and lease.stale_after_s is not None:
                beat_age = lease.heartbeat_age_s(self.now)
                beat = f"; heartbeat {beat_age:.0f} s ago" + (
                    f", older than its {lease.stale_after_s} s bound: the run is over" if self.stale else ""
                )
            return (
                f"{self.host}: leased by {lease.owner} for {lease.purpose!r}{run} until "
                f"{_iso(lease.expires_at)} ({mins:.0f} min left, host time{beat})"
            )
        age = f"{self.lock_age_s:.0f} s" if self.lock_age_s is not None else "unknown time"
        if self.state == "half-made":
            return (
                f"{self.host}: held, holder unknown: the lock directory exists without {LEASE_FILE} "
                f"(for {age}; a taker is writing it or died between mkdir and write)"
            )
        return f"{self.host}: held, holder unknown: {LEASE_FILE} is unreadable ({self.detail})"

    def to_dict(self) -> dict[str, Any]:
        left = self.remaining_s()
        return {
            "host": self.host,
            "state": self.state,
            "lease": self.lease.public() if self.lease else None,
            "lock_age_s": None if self.lock_age_s is None else round(self.lock_age_s, 1),
            "detail": self.detail,
            "host_time": None if self.now is None else _iso(self.now),
            "remaining_s": None if left is None else round(left),
            "heartbeat_age_s": (
                None if self.lease is None or self.now is None else round(self.lease.heartbeat_age_s(self.now))
            ),
            "stale": self.stale,
        }


def lease_state(transport: Transport, install_root: str, *, clock: Clock | None = None) -> LeaseState:
    """Look at the host's lease and judge it by the host's clock (`clock` is how to read it, one
    batch with the lock and the lease by default). A free host needs no clock read."""
    host = transport.name
    leases, lock, file = _paths(install_root)
    if clock is None:
        # the lock, the host's clock and the lease in one pipelined batch (engine/leasing.py
        # re-checks before every change: this was a dozen SFTP round trips each time)
        probe = f"{leases}/{CLOCK_PROBE}.{secrets.token_hex(4)}"
        st_r, clock_r, data_r = fs_batch(transport, [Lstat(lock), HostClock(probe, LEASE_MODE), ReadFile(file)])
        st = st_r if isinstance(st_r, FileStat) else None
        if st is None:
            return LeaseState(host, "free")
        if isinstance(clock_r, FileStat):
            now = datetime.fromtimestamp(int(clock_r.mtime), UTC)  # whole seconds, as SFTP reports them
        else:
            now = _host_date(transport)  # a full disk (or a read-only one): ask the host's `date` instead
    else:
        st = transport.stat(lock)
        if st is None:
            return LeaseState(host, "free")
        now = clock(transport, leases)
        data_r = None
    age = max(0.0, now.timestamp() - st.mtime)
    if not _stat.S_ISDIR(st.mode):
        return LeaseState(host, "unreadable", lock_age_s=age, detail=f"{lock} is not a directory", now=now)
    try:
        if isinstance(data_r, bytes):
            data = data_r
        elif isinstance(data_r, FileNotFoundError):
            raise data_r
        else:  # not batched, or refused: read it alone, for the error the host gives (or the bytes)
            data = transport.read_bytes(file, max_bytes=HOST_FILE_MAX)
    except FileNotFoundError:
        return LeaseState(host, "half-made", lock_age_s=age, now=now)
    try:
        lease = parse_lease(data, host=host)
    except LeaseError as exc:
        return LeaseState(host, "unreadable", lock_age_s=age, detail=exc.message, now=now)
    return LeaseState(host, "expired" if lease.expired(now) else "held", lease=lease, lock_age_s=age, now=now)


def read_lease(transport: Transport, install_root: str, *, clock: Clock | None = None) -> Lease | None:
    """The lease in `lease.json`, or None when there is none (see `lease_state` for half-made)."""
    return lease_state(transport, install_root, clock=clock).lease


def _held_error(st: LeaseState, *, grace_s: float) -> LeaseHeldError:
    hint = None
    lease = st.lease
    if st.state == "expired":
        hint = (
            f"the lease has expired (host time): `pairctl lease take {st.host} --break-expired --purpose TEXT` "
            f"breaks it (recorded), then `pairctl lease release {st.host} --nonce NONCE` with the nonce it prints"
        )
    elif st.stale and lease is not None and lease.run_id:
        hint = (
            f"its run stopped renewing it (heartbeat older than {lease.stale_after_s} s on the host): "
            f"`pairctl lease release PAIR --dead-run {lease.run_id}` frees it, with a receipt"
        )
    elif lease is not None and lease.run_id:
        hint = (
            f"run {lease.run_id} holds it; if that run is over, `pairctl lease release PAIR --dead-run "
            f"{lease.run_id}` frees it (refused while its heartbeat is fresh)"
        )
    elif st.state == "half-made":
        hint = (
            f"`pairctl lease take {st.host} --break-expired --purpose TEXT` breaks it once older than {grace_s:.0f} s"
            if not st.breakable(grace_s)
            else f"it is older than the grace period: `pairctl lease take {st.host} --break-expired --purpose TEXT` "
            "breaks it"
        )
    elif st.state == "unreadable":
        hint = "inspect the host's leases/ directory by hand; pairctl never breaks an unreadable lease"
    return LeaseHeldError(f"host is leased: {st.describe()}", hint=hint)


def _entomb(
    transport: Transport,
    install_root: str,
    why: str,
    tag: str,
    expect_nonce: str,
    on_changed: Callable[[], BaseException],
) -> None:
    """The one way a lock directory goes away: rename it to `.WHY.TAG.RANDOM` (atomic: a taker's
    mkdir can win the moment after), read back that the moved lock still holds `expect_nonce`
    ("" for none) - if not, someone replaced it between our look and our rename: move it back
    and raise `on_changed()` - then remove the tomb."""
    leases, lock, _ = _paths(install_root)
    tomb = f"{leases}/.{why}.{tag}.{secrets.token_hex(4)}"
    transport.rename(lock, tomb)
    try:
        moved_nonce = parse_lease(transport.read_bytes(f"{tomb}/{LEASE_FILE}", max_bytes=HOST_FILE_MAX)).nonce
    except FileNotFoundError:
        moved_nonce = ""
    except LeaseError:
        moved_nonce = "unparseable"
    if not hmac.compare_digest(moved_nonce.encode(), expect_nonce.encode()):
        with suppress(OSError):
            transport.rename(tomb, lock)
        raise on_changed()
    _remove_tree_shallow(transport, tomb)


def _remove_tree_shallow(transport: Transport, d: str) -> None:
    """Remove a (former) lock directory: its files, then itself. Best effort."""
    try:
        for n in transport.listdir(d):
            with suppress(OSError):
                transport.remove(f"{d}/{n}")
        transport.rmdir(d)
    except OSError:
        get_logger(host=transport.name).warning("could not remove old lease directory", path=d)


def _break(
    transport: Transport,
    install_root: str,
    st: LeaseState,
    *,
    by: str,
    grace_s: float,
    may_break: Callable[[LeaseState], bool] | None = None,
    why: str | None = None,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """Move the judged lock away (`_entomb`) once a re-read shows it still the one judged
    breakable (`may_break`; by default expired, or half-made past `grace_s`); returns its record."""
    log = get_logger(host=transport.name)
    again = lease_state(transport, install_root, clock=clock)
    old_nonce = st.lease.nonce if st.lease else ""
    same = again.state == st.state and (again.lease.nonce if again.lease else "") == old_nonce
    if not same or not (may_break or (lambda s: s.breakable(grace_s)))(again):
        raise LeaseHeldError(
            f"host is leased: {again.describe()}", hint="the lease changed while breaking it; nothing broken"
        )
    changed = f"{transport.name}: the lease changed while breaking it; nothing broken"
    _entomb(transport, install_root, "broken", old_nonce[:16] or "none", old_nonce, lambda: LeaseHeldError(changed))
    record = {
        "host": transport.name,
        "state": st.state,
        "lease": st.lease.public() if st.lease else None,
        "lock_age_s": None if st.lock_age_s is None else round(st.lock_age_s, 1),
        "host_time": None if again.now is None else _iso(again.now),
        "broken_at": _iso(utcnow()),
        "broken_by": by,
    }
    if again.lease is not None and again.now is not None:
        record["heartbeat_age_s"] = round(again.lease.heartbeat_age_s(again.now))
    if why:
        record["why"] = why
    log.warning("lease broken", **{k: v for k, v in record.items() if k != "host"})
    return record


def take_lease(
    transport: Transport,
    install_root: str,
    owner: str,
    purpose: str,
    ttl_s: float = DEFAULT_TTL_S,
    *,
    nonce: str | None = None,
    break_expired: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    stale_after_s: int | None = None,
    clock: Clock | None = None,
) -> Lease:
    """Take the host's lease or fail at once (LeaseHeldError naming holder, purpose, until when).
    With `break_expired`, a breakable lease is broken first (recorded in the lease's `broken`);
    a live one never is. Times come from the host's clock once the lock directory is ours."""
    log = get_logger(host=transport.name)
    leases, lock, file = _paths(install_root)
    make_lease(transport.name, owner, purpose, ttl_s, nonce=nonce, stale_after_s=stale_after_s)  # bad input: refuse now
    nonce = nonce or new_nonce()
    transport.makedirs(leases, 0o700)
    broken: dict[str, Any] | None = None
    for _attempt in range(3):
        try:
            transport.mkdir(lock, 0o700)
        except FileExistsError:
            st = lease_state(transport, install_root, clock=clock)
            if st.free:
                continue  # released between our mkdir and our look: try again
            if break_expired and st.breakable(grace_s) and broken is None:
                broken = _break(transport, install_root, st, by=owner, grace_s=grace_s, clock=clock)
                continue
            raise _held_error(st, grace_s=grace_s) from None
        # we own the lock directory: read the host's clock, write lease.json by temp + rename
        tmp = f"{lock}/.{LEASE_FILE}.{nonce[:8]}.tmp"
        try:
            now = (clock or host_now)(transport, lock)
            lease = make_lease(transport.name, owner, purpose, ttl_s, nonce=nonce, now=now, stale_after_s=stale_after_s)
            if broken is not None:
                lease = replace(lease, broken=broken)
            transport.put_bytes(lease.to_json(), tmp, mode=LEASE_MODE)
            transport.rename(tmp, file)
        except BaseException:
            # leave no half-made lease behind if we can help it
            for p, fn in ((tmp, transport.remove), (file, transport.remove), (lock, transport.rmdir)):
                with suppress(Exception):
                    fn(p)
            raise
        _sweep_probes(transport, leases, now, stale_after_s or grace_s)
        log.info(
            "lease taken",
            owner=owner,
            purpose=purpose,
            expires_at=_iso(lease.expires_at),
            host_time=_iso(now),
            broke=bool(broken),
        )
        return lease
    st = lease_state(transport, install_root, clock=clock)
    raise _held_error(st, grace_s=grace_s)


def _sweep_probes(transport: Transport, leases: str, now: datetime, older_than_s: float) -> None:
    """Clock probes (`.clock.*`, host_now) a killed run left, removed under the lease just taken:
    a live reader's probe lives one round trip, far less than the lease's stale bound. Best effort."""
    try:
        for name in transport.listdir(leases):
            st = transport.stat(probe := f"{leases}/{name}") if name.startswith(CLOCK_PROBE + ".") else None
            if st is not None and st.is_file and now.timestamp() - st.mtime > older_than_s:
                transport.remove(probe)
    except OSError:
        pass


def release_lease(transport: Transport, install_root: str, nonce: str, *, clock: Clock | None = None) -> Lease:
    """Release the lease holding `nonce` (a wrong one: LeaseError, untouched), then read back that
    it is no longer active. Returns the released lease."""
    st = lease_state(transport, install_root, clock=clock)
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
    changed = f"{transport.name}: the lease changed while releasing it; left as found"
    _entomb(transport, install_root, "released", nonce[:16], nonce, lambda: LeaseError(changed))
    after = lease_state(transport, install_root, clock=clock)
    if after.lease is not None and after.lease.nonce == nonce:
        raise LeaseError(f"{transport.name}: lease still active after release ({after.describe()})")
    get_logger(host=transport.name).info(
        "lease released", owner=st.lease.owner, purpose=st.lease.purpose, verified=after.state
    )
    return st.lease


def renew_lease(
    transport: Transport,
    install_root: str,
    nonce: str,
    ttl_s: float,
    *,
    min_left_s: float = 0.0,
    stale_after_s: int | None = None,
    clock: Clock | None = None,
) -> Lease:
    """Prove this run still holds the lease and renew it: `renewed_at` becomes the host's now,
    `expires_at` at least now + `ttl_s` (never shortened); `stale_after_s` replaces the promised
    bound. LeaseLost, before any change, when the lease is gone, another's, expired (anybody may
    break it: renewing could write into another taker's lock) or has under `min_left_s` left."""
    _, lock, file = _paths(install_root)
    st = lease_state(transport, install_root, clock=clock)
    if st.lease is None or not hmac.compare_digest(st.lease.nonce.encode(), nonce.encode()):
        raise LeaseLost(f"cannot renew: the lease this run holds is gone ({st.describe()})")
    if st.state != "held" or st.now is None:
        raise LeaseLost(f"cannot renew: {st.describe()}; an expired lease may already be someone else's")
    left = st.lease.remaining_s(st.now)
    if left < min_left_s:
        raise LeaseLost(
            f"cannot renew: {st.describe()}: {left:.0f} s left by the host's clock is under the "
            f"{min_left_s:.0f} s this run needs to finish safely"
        )
    want = make_lease(transport.name, st.lease.owner, st.lease.purpose, ttl_s, nonce=nonce, now=st.now).expires_at
    renewed = replace(
        st.lease,
        expires_at=max(want, st.lease.expires_at),
        renewed_at=st.now.replace(microsecond=0),
        stale_after_s=st.lease.stale_after_s if stale_after_s is None else stale_after_s,
    )
    tmp = f"{lock}/.{LEASE_FILE}.{nonce[:8]}.renew.tmp"
    transport.put_bytes(renewed.to_json(), tmp, mode=LEASE_MODE)
    transport.rename(tmp, file)
    get_logger(host=transport.name).debug(
        "lease renewed", purpose=renewed.purpose, expires_at=_iso(renewed.expires_at), host_time=_iso(st.now)
    )
    return renewed


def parse_run_of(purpose: str) -> str | None:
    """The run id a pairctl run writes at the end of its lease's purpose: `... (run RUN_ID)`."""
    m = re.search(r"\(run ([A-Za-z0-9_.:-]+)\)$", purpose)
    return m.group(1) if m else None


def run_of(lease: Lease) -> str | None:
    return parse_run_of(lease.purpose)


def break_run_lease(
    transport: Transport,
    install_root: str,
    run_id: str,
    *,
    by: str,
    why: str,
    require_stale: bool = False,
    clock: Clock | None = None,
) -> dict[str, Any] | None:
    """Break the lease run `run_id` holds here (the caller proved the run over: its nonce died with
    it); None when free, LeaseError when another holds it. With `require_stale` the host is the
    proof: a heartbeat older than the run's promised bound."""
    st = lease_state(transport, install_root, clock=clock)
    if st.free:
        return None
    if st.lease is None or run_of(st.lease) != run_id:
        raise LeaseError(f"not run {run_id}'s lease: {st.describe()}; nothing broken")
    if require_stale and not st.stale:
        raise LeaseHeldError(
            f"run {run_id} is not proven over on {transport.name}: {st.describe()}; nothing broken",
            hint="its heartbeat is fresh (or it promised none): the run may be alive",
        )

    def theirs(s: LeaseState) -> bool:
        return s.lease is not None and run_of(s.lease) == run_id and (s.stale or not require_stale)

    return _break(transport, install_root, st, by=by, grace_s=DEFAULT_GRACE_S, why=why, may_break=theirs, clock=clock)


def stale_proof(states: Sequence[LeaseState], run_id: str, *, evidence_says: str = "") -> str:
    """Why run `run_id` is proven over by the hosts alone: every lease it holds has a heartbeat
    older than the bound it promised (host time). LeaseHeldError, naming each host, when not:
    the run may be alive on another operator's machine."""
    theirs = [s for s in states if s.lease is not None and run_of(s.lease) == run_id]
    fresh = [s for s in theirs if not s.stale]
    if not theirs or fresh:
        where = "; ".join(s.describe() for s in (fresh or states))
        raise LeaseHeldError(
            f"run {run_id} is not proven over{f' ({evidence_says})' if evidence_says else ''}, and the hosts do not "
            f"prove it either: {where}; its leases are left alone",
            hint="wait until its heartbeat is older than its bound (status shows it), run this on the machine that "
            "ran it, or, once expired, `pairctl lease take HOST --break-expired`",
        )
    ages = ", ".join(
        f"{s.host} {s.lease.heartbeat_age_s(s.now):.0f} s" for s in theirs if s.lease is not None and s.now is not None
    )
    bound = max(s.lease.stale_after_s or 0 for s in theirs if s.lease is not None)
    return f"run {run_id} stopped renewing its leases: heartbeat ages {ages} exceed its {bound} s bound (host time)"


# -- several hosts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseTarget:
    transport: Transport
    install_root: str
    state: str | None = None  # the inventory's state_dir: where an older layout is moved (layout.move_layout)

    @property
    def name(self) -> str:
        return self.transport.name


def _targets(targets: Sequence[Any]) -> list[LeaseTarget]:
    out = [t if isinstance(t, LeaseTarget) else LeaseTarget(*t) for t in targets]
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"the same host twice in one lease request: {names}")
    return sorted(out, key=lambda t: t.name)  # one fixed order for every taker


def reach_all(targets: Sequence[LeaseTarget]) -> None:
    """Connect (which checks host keys) to every host before any lease changes: a changed key on
    the second host must not leave the first one's lease taken or released."""
    for t in targets:
        connect = getattr(t.transport, "connect", None)
        if callable(connect):
            connect()


def take_leases(
    targets: Sequence[Any],
    owner: str,
    purpose: str,
    ttl_s: float = DEFAULT_TTL_S,
    *,
    nonce: str | None = None,
    break_expired: bool = False,
    grace_s: float = DEFAULT_GRACE_S,
    stale_after_s: int | None = None,
) -> list[Lease]:
    """Take every host's lease with one nonce, in name order; if one fails, release those taken."""
    nonce = nonce or new_nonce()
    taken: list[tuple[LeaseTarget, Lease]] = []
    ordered = _targets(targets)
    reach_all(ordered)
    try:
        for t in ordered:
            lease = take_lease(
                t.transport,
                t.install_root,
                owner,
                purpose,
                ttl_s,
                nonce=nonce,
                break_expired=break_expired,
                grace_s=grace_s,
                stale_after_s=stale_after_s,
            )
            taken.append((t, lease))
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
    ordered = _targets(targets)
    reach_all(ordered)
    for t in reversed(ordered):
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
    ttl_s: float = DEFAULT_TTL_S

    def renew(self, *, min_left_s: float = 0.0) -> None:
        """Prove every lease still ours and push its heartbeat (a long run calls this between its
        parts); LeaseLost on the first that is not, before anything else changes."""
        self.leases = [
            renew_lease(t.transport, t.install_root, self.nonce, self.ttl_s, min_left_s=min_left_s)
            for t in self.targets
        ]

    def keep(self, reason: str) -> None:
        """Do not release on exit (a failed rollback: nobody may deploy onto an unknown state)."""
        self.kept = reason

    def public(self) -> dict[str, Any]:
        """For receipts: the leases without their nonce."""
        return {"hosts": [lease.public() for lease in self.leases]}

    def end(self) -> dict[str, Any]:
        return dict(self.ended)

    @property
    def broken(self) -> list[dict[str, Any]]:
        return [lease.broken for lease in self.leases if lease.broken]


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
    stale_after_s: int | None = None,
) -> Iterator[HeldLeases]:
    """Hold every host's lease (`(transport, install_root)` pairs or `LeaseTarget`s) for the body
    and release them on every path, unless kept (`held.keep`, or `RollbackFailed`). A failed
    release is a note on a failed body's exception; after a body that succeeded it is raised, or
    with `record_release_error` only recorded (the body's work must not be lost to it).
    `held.ended` says how the hold ended."""
    nonce = new_nonce()
    ts = _targets(targets)
    leases = take_leases(
        ts,
        owner,
        purpose,
        ttl_s,
        nonce=nonce,
        break_expired=break_expired,
        grace_s=grace_s,
        stale_after_s=stale_after_s,
    )
    held = HeldLeases(targets=ts, leases=leases, nonce=nonce, ttl_s=ttl_s)
    try:
        _move_layouts(ts)
        yield held
    except BaseException as exc:
        if isinstance(exc, RollbackFailed) and held.kept is None:
            held.keep("rollback failed")
        if (failed := _end_hold(held, Exception)) is not None:
            exc.add_note(f"releasing the leases also failed: {failed}")
        elif held.kept is not None:
            exc.add_note(f"leases KEPT on {', '.join(t.name for t in ts)}: {held.kept}")
        raise
    if (failed := _end_hold(held, LeaseError)) is not None and not record_release_error:
        raise failed
    if failed is not None:
        get_logger(lease=nonce[:8]).error("releasing the leases failed", error=str(failed), hosts=[t.name for t in ts])


def _end_hold(held: HeldLeases, catch: type[Exception]) -> Exception | None:
    """Release the held leases, or keep them (logged); `held.ended` says which. A release error of
    type `catch` is recorded and returned, any other raised."""
    hosts = [t.name for t in held.targets]
    if held.kept is not None:
        held.ended = {"kept": held.kept, "hosts": hosts}
        get_logger(lease=held.nonce[:8]).warning("leases kept", reason=held.kept, hosts=hosts)
        return None
    try:
        release_leases(held.targets, held.nonce)
    except catch as rel_exc:
        held.ended = {"release_failed": str(rel_exc)}
        return rel_exc
    held.ended = {"released": hosts}
    return None


def _move_layouts(targets: Sequence[LeaseTarget]) -> None:
    """An older layout (links, route record and leases in the root itself) moved into run/ under
    the lease just taken, so that every leased command finds them in run/ only."""
    for t in targets:
        move_layout(t.transport, HostLayout(t.install_root, state=t.state))


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
    hosts = {h: inventory.host(h) for h in hosts_of(inventory, target)}
    return [LeaseTarget(pool.get(n), h.install_root, h.state_dir) for n, h in hosts.items()]


def show_leases(inventory: Any, pool: Any, target: str) -> list[LeaseState]:
    return [lease_state(t.transport, t.install_root) for t in targets_of(inventory, pool, target)]
