"""The one interface every host is reached through: the `Transport` contract, its errors,
counters and retry policy (implemented by ssh.py and local.py, which import this module)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol, Self, TypeVar, runtime_checkable

from orchestrator.errors import HostError
from orchestrator.log import get_logger
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import CommandTimeout, Result

T = TypeVar("T")

# The most pairctl reads of a host's small state files (route record, lease, pid and svc files):
# the host is untrusted, and one of them may be a link to /dev/zero or a huge sparse file.
HOST_FILE_MAX = 4 << 20
# The most of a host's log pairctl reads (its supervisor rotates logs at 64 MiB by default).
HOST_LOG_MAX = 64 << 20
# The most output (stdout, stderr each) pairctl reads of one command on a host.
HOST_OUTPUT_MAX = 64 << 20


@dataclass(frozen=True)
class FileStat:
    """What `Transport.stat` reports about a path (lstat: a symlink is not followed)."""

    mode: int
    size: int
    mtime: float
    uid: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def perms(self) -> int:
        return self.mode & 0o7777


class ConnectionLost(HostError):
    """The connection failed while a command or transfer was in flight (transient)."""


class NotStarted(ConnectionLost):
    """No session channel could be opened on the connection: the command never started, so it
    changed nothing there (transient: `run_idempotent` reconnects and tries again)."""

    never_ran = True


class Unreachable(HostError):
    """No connection could be made (after the connect retries): nothing ran. Not retried again
    by `run_idempotent`, whose connect already retried."""

    never_ran = True


def never_ran(exc: BaseException) -> bool:
    """The command did not start on the host (the engine turns this, at the first change, into a
    refusal with the previous pair still serving)."""
    return bool(getattr(exc, "never_ran", False))


@dataclass
class TransportStats:
    """Counters for benchmarks and receipts: how many round trips and bytes a run cost."""

    connects: int = 0
    connect_s: float = 0.0
    commands: int = 0
    command_s: float = 0.0
    retries: int = 0
    puts: int = 0
    put_bytes: int = 0
    put_s: float = 0.0
    gets: int = 0
    get_bytes: int = 0
    get_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    @property
    def round_trips(self) -> int:
        """Commands plus file transfers: each costs at least one request/response on the wire."""
        return self.commands + self.puts + self.gets

    def as_dict(self) -> dict[str, float]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}
        return {**{k: round(v, 6) if k.endswith("_s") else v for k, v in d.items()}, "round_trips": self.round_trips}


@runtime_checkable
class Transport(Protocol):
    """Run commands on and copy files to/from one host. `run` never retries (a command may change
    state); `run_idempotent` retries transient failures, for read-only probes only. `check=True`
    raises `RemoteCommandError` on a nonzero exit."""

    name: str
    stats: TransportStats

    def connect(self) -> None:
        """Reach the host now (every other method does so on first use); idempotent. A failure
        is a HostError naming the host (`Unreachable` when no connection could be made)."""

    def run(
        self, cmd: Cmd, *, check: bool = True, timeout: float | None = None, stdin: bytes | None = None
    ) -> Result: ...

    def run_idempotent(
        self, cmd: Cmd, *, check: bool = True, timeout: float | None = None, stdin: bytes | None = None
    ) -> Result: ...

    def put(self, local_path: str | Path, remote_path: str) -> None: ...

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None: ...

    def put_private(self, data: bytes, remote_path: str) -> None:
        """Create `remote_path` exclusively (O_CREAT|O_EXCL) with mode 0600 from its first byte,
        never chmod after: a secret is never readable by others, even for a moment."""

    def chmod(self, path: str, mode: int) -> None: ...

    def get(self, remote_path: str, local_path: str | Path) -> None: ...

    def close(self) -> None: ...

    # file operations without a shell (SFTP on SSH hosts, os.* locally), same syscall semantics

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        """mkdir(2), then chmod to `mode`: FileExistsError if the path exists (cannot be won twice)."""

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """`mkdir -p`: create missing parents with `mode`; existing directories are fine."""

    def stat(self, path: str) -> FileStat | None:
        """lstat(2), or None when the path does not exist."""

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's content; FileNotFoundError when it does not exist. With `max_bytes`, at most
        `max_bytes + 1` bytes: a caller learns that a host's file is larger than it accepts
        without reading a hostile one (a link to /dev/zero) to its end."""

    def rename(self, src: str, dst: str) -> None:
        """rename(2): atomic, replaces `dst` if it is a file or symlink."""

    def remove(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def symlink(self, target: str, path: str) -> None:
        """Create `path` as a symlink pointing to `target` (like `ln -s target path`)."""

    def readlink(self, path: str) -> str | None:
        """The link's target, or None when `path` does not exist or is not a symlink."""


# -- batched file reads (`fs_batch`: SSH pipelines them, two round trips for the whole batch) ----


@dataclass(frozen=True)
class Lstat:
    """lstat(2) of `path`: a FileStat, or None when it does not exist; any other error raised, or
    (`soft`) this op's result, not an error of the batch (an lstat the host refuses: EACCES under a
    stranger's 0700 folder, or a state dir under an unsearchable one)."""

    path: str
    soft: bool = False


@dataclass(frozen=True)
class ReadFile:
    """At most `max_bytes + 1` bytes of `path` (as `read_bytes`), or the error the host answered
    (FileNotFoundError when it does not exist)."""

    path: str
    max_bytes: int = HOST_FILE_MAX


@dataclass(frozen=True)
class Readlink:
    """The link's target, or None (as `readlink`)."""

    path: str


@dataclass(frozen=True)
class HostClock:
    """The host's clock: `path` created exclusively now (empty, `mode`), its lstat read, then
    removed (as leases.host_now does). The FileStat, or the error making the file raised."""

    path: str
    mode: int = 0o600


@dataclass(frozen=True)
class FreeBytes:
    """Bytes available to an unprivileged writer on `path`'s filesystem (what `df -Pk` calls
    Available, in whole KiB), from the SFTP server's statvfs: an int, or NotImplementedError
    where the transport cannot tell without an exec (hosts/space.py then runs `df`)."""

    path: str


@dataclass(frozen=True)
class MountFlags:
    """The f_flag of `path`'s filesystem (statvfs, links followed: ST_RDONLY is bit 0x1), from the
    SFTP server's statvfs (the local transport's os.statvfs): an int, the host's error, or
    NotImplementedError where the transport cannot tell without an exec (hosts/writable: no prediction)."""

    path: str


@runtime_checkable
class StatvfsFlags(Protocol):
    """A transport that answers MountFlags itself, with no SFTP batch (the local transport)."""

    def mount_flags(self, path: str) -> int: ...


FsRead = Lstat | ReadFile | Readlink | HostClock | FreeBytes | MountFlags
FsResult = FileStat | bytes | str | int | None | OSError | NotImplementedError


def fs_batch(transport: Transport, ops: list[FsRead]) -> list[FsResult]:
    """Run OPS on one host, results in order, pipelined where the transport can. A refused
    ReadFile, HostClock, FreeBytes, MountFlags or Lstat(soft) gives the error; a connection lost raises."""
    batch = getattr(transport, "fs_batch", None)
    if batch is not None:
        return list(batch(ops))
    return [one_fs_read(transport, op) for op in ops]


def one_fs_read(transport: Transport, op: FsRead) -> FsResult:
    """OP with the transport's own one-request methods (what `fs_batch` does one by one)."""
    if isinstance(op, Lstat):
        try:
            return transport.stat(op.path)
        except OSError as exc:
            if not op.soft or isinstance(exc, ConnectionLost):
                raise
            return exc
    if isinstance(op, Readlink):
        return transport.readlink(op.path)
    if isinstance(op, FreeBytes):
        return NotImplementedError("statvfs")
    if isinstance(op, MountFlags):
        if not isinstance(transport, StatvfsFlags):
            return NotImplementedError("statvfs")
        try:
            return transport.mount_flags(op.path)
        except OSError as exc:
            return exc
    if isinstance(op, ReadFile):
        try:
            return transport.read_bytes(op.path, max_bytes=op.max_bytes)
        except ConnectionLost:
            raise
        except OSError as exc:  # HostError is one: the host refused the read
            return exc
    try:
        transport.put_bytes(b"", op.path, mode=op.mode)
    except OSError as exc:  # a full or read-only disk (HostError is an OSError): the caller asks `date`
        return exc
    try:
        st = transport.stat(op.path)
    finally:
        with contextlib.suppress(OSError):
            transport.remove(op.path)
    return st if st is not None else FileNotFoundError(2, f"{op.path} vanished")


# -- retries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast to retry one idempotent step (connect, a read-only probe)."""

    attempts: int = 4
    initial_s: float = 0.2
    max_s: float = 2.0
    budget_s: float | None = None  # set: retry until this many seconds have passed, not `attempts` times

    def call(
        self,
        fn: Callable[[], T],
        *,
        retry_on: Callable[[BaseException], bool],
        what: str,
        host: str,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run `fn`, retrying errors `retry_on` accepts; every retry is logged with its cause."""
        import tenacity  # start-up time (~30 ms): loaded by the first idempotent step, not at import

        log = get_logger(host=host, step=what)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "retrying",
                attempt=state.attempt_number,
                of=self.attempts,
                sleep_s=round(state.next_action.sleep if state.next_action else 0.0, 3),
                error=f"{type(exc).__name__}: {exc}",
            )
            if on_retry:
                on_retry()

        r = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.budget_s)
            if self.budget_s is not None
            else tenacity.stop_after_attempt(max(1, self.attempts)),
            wait=tenacity.wait_exponential(multiplier=self.initial_s, min=self.initial_s, max=self.max_s),
            retry=tenacity.retry_if_exception(retry_on),
            before_sleep=before_sleep,
            reraise=True,
        )
        return r(fn)


DEFAULT_RETRY = RetryPolicy()


def _reconnect_budget(default: float = 60.0) -> float:
    """How long a host this run already reached may stay unreachable (an sshd restart takes about
    25 s) before a step fails: 60 s, well inside the leases' heartbeat, where the first connect's
    1.4 s rolled healthy pairs back; PAIRCTL_SSH_RECONNECT_S (5 to 3600) overrides it."""
    raw = os.environ.get("PAIRCTL_SSH_RECONNECT_S", "")
    try:
        v = float(raw) if raw else default
    except ValueError:
        return default
    return min(3600.0, max(5.0, v))


RECONNECT_BUDGET_S = _reconnect_budget()
RECONNECT_RETRY = RetryPolicy(attempts=1000, initial_s=0.5, max_s=5.0, budget_s=RECONNECT_BUDGET_S)


def transient_command_error(exc: BaseException) -> bool:
    """What `run_idempotent` retries: the connection broke, or the probe timed out."""
    return isinstance(exc, (ConnectionLost, CommandTimeout))


class Retrying:
    """What SshTransport and LocalTransport share over their own `run` and `close`:
    `run_idempotent` and closing at the end of a `with` block."""

    name: str
    stats: TransportStats
    retry: RetryPolicy

    def run(self, cmd: Cmd, *, check: bool = True, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run_idempotent(
        self, cmd: Cmd, *, check: bool = True, timeout: float | None = None, stdin: bytes | None = None
    ) -> Result:
        """For read-only probes: `run`, again after a `transient_command_error` (reconnecting)."""
        return self.retry.call(
            lambda: self.run(cmd, check=check, timeout=timeout, stdin=stdin),
            retry_on=transient_command_error,
            what=f"probe: {cmd.display()[:80]}",
            host=self.name,
            on_retry=lambda: self.stats.add(retries=1),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
