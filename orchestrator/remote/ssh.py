"""SSH transport on fabric/paramiko with strict host keys, one lazy connection per host.

Host keys come only from the inventory's known_hosts (plus ssh_config's UserKnownHostsFile when
it defers to ~/.ssh/config); an unknown or changed key raises `HostKeyError` with SHA256
fingerprints before anything runs, and no key is ever added. File operations go over SFTP and
start no login shell. Commands run on a raw session channel, not `Connection.run`, whose invoke
feeds stdin a byte per 10 ms and corrupts non-ASCII: here stdin and output are bytes.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import getpass
import hashlib
import io
import os
import posixpath
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, Protocol, runtime_checkable

import paramiko

from orchestrator.config.inventory import Inventory, warn_if_readable_by_others
from orchestrator.errors import DiskFull, HostError, HostKeyError, PairctlError
from orchestrator.log import get_logger
from orchestrator.remote.command import Cmd
from orchestrator.remote.known_hosts import known_hosts_name, read_known_hosts
from orchestrator.remote.result import Result, command_failed, command_timed_out
from orchestrator.remote.transport import (
    DEFAULT_RETRY,
    HOST_FILE_MAX,
    HOST_OUTPUT_MAX,
    RECONNECT_RETRY,
    ConnectionLost,
    FileStat,
    FreeBytes,
    FsRead,
    FsResult,
    HostClock,
    Lstat,
    NotStarted,
    ReadFile,
    Readlink,
    Retrying,
    RetryPolicy,
    T,
    TransportStats,
    Unreachable,
)

_READ = 1 << 16
# A command with a timeout runs under the host's `timeout` (TERM, KILL HOST_KILL_AFTER_S later);
# pairctl waits that long and HOST_SLACK_S more before calling it timed out, so a timed-out step
# is dead on the host before anything else touches it (services run under setsid: untouched).
HOST_KILL_AFTER_S = 5.0
HOST_SLACK_S = 5.0


def host_bounded(cmd: Cmd, timeout: float) -> Cmd:
    """CMD under the host's `timeout -k HOST_KILL_AFTER_S TIMEOUT` (argv, never a shell string).
    A bound under a millisecond is a millisecond: `timeout 0` means no limit at all."""
    return Cmd(argv=("timeout", "-k", f"{HOST_KILL_AFTER_S:g}s", f"{max(timeout, 0.001):.3f}s", *cmd.full_argv()))


_LINGER_S = 1.0  # how long output may stay open after the program's exit status arrived
DEFAULT_CONNECT_TIMEOUT_S = 10.0


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's `SHA256:<base64, no padding>` of the key blob (what `ssh-keygen -lf` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


# -- where and how to connect (pure) -----------------------------------------------------------


@dataclass(frozen=True)
class SshTarget:
    """Everything needed to connect to one inventory host, resolved before connecting."""

    name: str
    hostname: str
    port: int
    user: str
    key_filename: str | None
    known_hosts: tuple[str, ...]
    allow_agent: bool = False
    look_for_keys: bool = False
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.hostname, self.port)

    def where(self) -> str:
        return f"{self.name} ({self.user}@{self.hostname}:{self.port})"


def resolve_target(
    inventory: Inventory,
    host_name: str,
    ssh_config: paramiko.SSHConfig | None = None,
    *,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> SshTarget:
    """Inventory fields win; with `use_ssh_config`, user, port, HostName, IdentityFile,
    UserKnownHostsFile and ConnectTimeout left out come from ssh_config (checking stays strict)."""
    spec = inventory.host(host_name)
    hostname, port, user, key = spec.address, spec.port, spec.user, spec.key
    known = [inventory.known_hosts]
    allow_agent = look_for_keys = False
    if inventory.use_ssh_config and ssh_config is not None:
        cfg = ssh_config.lookup(spec.address)
        hostname = cfg.get("hostname", spec.address)
        if "port" not in spec.model_fields_set and cfg.get("port"):
            port = int(cfg["port"])
        if user is None:
            user = cfg.get("user")
        if key is None and cfg.get("identityfile"):
            key = os.path.expanduser(cfg["identityfile"][0])
        for f in (cfg.get("userknownhostsfile") or "").split():
            f = os.path.expanduser(f)
            if f not in known:
                known.append(f)
        if key is None:  # defer to the agent and default keys, as ssh(1) would
            allow_agent = look_for_keys = True
        if cfg.get("connecttimeout"):
            connect_timeout_s = float(cfg["connecttimeout"])
    if user is None:
        user = getpass.getuser()
    if key is None and not allow_agent:
        raise HostError(
            f"host {host_name}: no key to log in with",
            hint="set `key:` for the host in the inventory, or `use_ssh_config: true` to use ~/.ssh/config",
        )
    if key is not None:
        warn_if_readable_by_others(key, what=f"host {host_name}: operator key")
    return SshTarget(
        name=host_name,
        hostname=hostname,
        port=port,
        user=user,
        key_filename=key,
        known_hosts=tuple(known),
        allow_agent=allow_agent,
        look_for_keys=look_for_keys,
        connect_timeout_s=connect_timeout_s,
    )


def load_ssh_config(path: str | Path | None = None) -> paramiko.SSHConfig | None:
    p = Path(path) if path else Path("~/.ssh/config").expanduser()
    if not p.is_file():
        return None
    return paramiko.SSHConfig.from_path(str(p))


# -- host keys ---------------------------------------------------------------------------------


class _FabricConnection(Protocol):
    """What is used of a fabric.Connection (fabric ships no type information)."""

    client: paramiko.SSHClient

    def open(self) -> object: ...

    def close(self) -> None: ...

    def sftp(self) -> paramiko.SFTPClient: ...


def _transport_of(conn: _FabricConnection, host: str) -> paramiko.Transport:
    t = conn.client.get_transport()
    if t is None:  # paramiko: only before connect() or after close()
        raise ConnectionLost(f"{host}: the SSH connection closed as it opened")
    return t


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(f"{name} not in known_hosts")
        self.key = key


class _RevokedHostKey(_UnknownHostKey):
    pass


class _RejectAndRecord(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key (for its fingerprint) and tells `@revoked` apart."""

    def __init__(self, revoked: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        if (key.get_name(), key.get_base64()) in self.revoked:
            raise _RevokedHostKey(hostname, key)
        raise _UnknownHostKey(hostname, key)


def _load_host_keys(files: tuple[str, ...]) -> tuple[paramiko.HostKeys, list[str], frozenset[tuple[str, str]]]:
    """The accepted keys, the files missing, and the revoked keys, read as OpenSSH reads them: an
    `@revoked`, `@cert-authority` or unparsable line refuses no other host (paramiko's loader does)."""
    keys = paramiko.HostKeys()
    missing: list[str] = []
    revoked: set[tuple[str, str]] = set()
    lines: list[tuple[int, str]] = []
    for f in files:
        if not os.path.isfile(f):
            missing.append(f)
            continue
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                parsed = read_known_hosts(fh.read(HOST_FILE_MAX))
        except OSError as exc:
            raise HostKeyError(f"cannot read known_hosts file {f}: {exc}") from None
        revoked |= parsed.revoked
        lines += parsed.entries
    for n, line in lines:
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, n)
        except Exception:  # noqa: BLE001 - a line ssh cannot read is skipped, as ssh skips it
            entry = None
        if entry is None or entry.key is None:
            continue
        if (entry.key.get_name(), entry.key.get_base64()) in revoked:
            continue  # a revoked key is never accepted, whatever else names it
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)
    return keys, missing, frozenset(revoked)


_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EHOSTDOWN,
    errno.ENETDOWN,
}


def _connect_transient(exc: BaseException) -> bool:
    """Connect errors worth retrying: refused, timed out, unreachable, reset, no banner; never a
    host-key, authentication or key-file failure (retrying only delays the same answer)."""
    if isinstance(exc, (PairctlError, paramiko.AuthenticationException, paramiko.BadHostKeyException)):
        return False  # our own verdicts (host key, auth) are final; HostError is also a ConnectionError
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return True
    if isinstance(exc, (socket.timeout, TimeoutError, EOFError, ConnectionError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno in _TRANSIENT_ERRNOS
    if isinstance(exc, paramiko.SSHException):
        s = str(exc).lower()
        return "banner" in s or "reset" in s or "eof" in s
    return False


# -- the transport -----------------------------------------------------------------------------


@dataclass
class SshTransport(Retrying):
    """`Transport` over SSH. Connects lazily on first use and reuses the connection."""

    target: SshTarget
    retry: RetryPolicy = DEFAULT_RETRY
    # a host this transport reached before and lost: waited for longer (transport.RECONNECT_BUDGET_S)
    reconnect: RetryPolicy = RECONNECT_RETRY
    stats: TransportStats = field(default_factory=TransportStats)

    def __post_init__(self) -> None:
        self.name = self.target.name
        self._conn: _FabricConnection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()
        # one SFTP conversation at a time: paramiko drops an answer another thread's wait reads
        # first, and that thread then waits forever (a batch's requests are still pipelined)
        self._sftp_io = threading.RLock()
        self._log = get_logger(host=self.name)
        self._reached = False  # once connected, a lost connection is reconnected with RECONNECT_RETRY

    @classmethod
    def from_inventory(
        cls,
        inventory: Inventory,
        host_name: str,
        *,
        retry: RetryPolicy | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        ssh_config_path: str | Path | None = None,
    ) -> SshTransport:
        cfg = load_ssh_config(ssh_config_path) if inventory.use_ssh_config else None
        target = resolve_target(inventory, host_name, cfg, connect_timeout_s=connect_timeout_s)
        return cls(target=target, retry=retry or DEFAULT_RETRY)

    # -- connecting --

    def connect(self) -> None:
        """Open the connection now (otherwise the first command does); idempotent."""
        self._connect_or_raise()

    @property
    def connected(self) -> bool:
        t = self._conn.client.get_transport() if self._conn is not None else None
        return bool(t and t.is_active())

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._conn is not None:
                t = self._conn.client.get_transport()
                if t is not None and t.is_active():
                    return t
                self._drop()
            t0 = time.monotonic()
            policy = self.reconnect if self._reached else self.retry
            self._conn = conn = policy.call(
                self._connect_once,
                retry_on=_connect_transient,
                what="ssh reconnect" if self._reached else "ssh connect",
                host=self.name,
                on_retry=lambda: self.stats.add(retries=1),
            )
            self._reached = True
            self.stats.add(connects=1, connect_s=time.monotonic() - t0)
            self._log.debug(
                "connected",
                address=self.target.hostname,
                port=self.target.port,
                seconds=round(time.monotonic() - t0, 4),
            )
            return _transport_of(conn, self.name)

    def _connect_once(self) -> _FabricConnection:
        import fabric  # start-up time (fabric pulls in invoke): loaded by the first connect only

        tg = self.target
        keys, missing, revoked = _load_host_keys(tg.known_hosts)
        config = fabric.Config(overrides={"load_ssh_configs": False})
        connect_kwargs: dict[str, Any] = {
            "allow_agent": tg.allow_agent,
            "look_for_keys": tg.look_for_keys,
            "banner_timeout": tg.connect_timeout_s,
            "auth_timeout": tg.connect_timeout_s,
        }
        if tg.key_filename:
            connect_kwargs["key_filename"] = tg.key_filename
        conn: _FabricConnection = fabric.Connection(  # fabric ships no types: its surface used here
            host=tg.hostname,
            user=tg.user,
            port=tg.port,
            config=config,
            connect_timeout=max(1, int(round(tg.connect_timeout_s))),
            connect_kwargs=connect_kwargs,
        )
        client = paramiko.SSHClient()  # replaces fabric's AutoAddPolicy client
        client.set_missing_host_key_policy(_RejectAndRecord(revoked))
        for hostname, entry in keys.items():
            for ktype, key in entry.items():
                client.get_host_keys().add(hostname, ktype, key)
        conn.client = client
        try:
            conn.open()
        except _RevokedHostKey as exc:
            conn.close()
            raise HostKeyError(
                f"host key of {tg.name} ({tg.hostname} port {tg.port}) is REVOKED: {exc.key.get_name()} "
                f"{fingerprint(exc.key)} is marked @revoked in known_hosts {', '.join(tg.known_hosts)}. "
                "Nothing was run.",
                hint="the host still offers a key its operators revoked: find out why before using it",
            ) from None
        except _UnknownHostKey as exc:
            conn.close()
            where = f"{tg.name} ({tg.hostname} port {tg.port})"
            files = ", ".join(tg.known_hosts)
            note = f" (missing: {', '.join(missing)})" if missing else ""
            raise HostKeyError(
                f"host key of {where} is UNKNOWN: not in known_hosts {files}{note}; "
                f"it offered {exc.key.get_name()} {fingerprint(exc.key)}. Nothing was run.",
                hint=f"verify that fingerprint out of band, then add the host's key for "
                f"{tg.known_hosts_name} to {tg.known_hosts[0]} (pairctl never adds keys itself)",
            ) from None
        except paramiko.BadHostKeyException as exc:
            conn.close()
            where = f"{tg.name} ({tg.hostname} port {tg.port})"
            raise HostKeyError(
                f"host key CHANGED for {where}: known_hosts has {exc.expected_key.get_name()} "
                f"{fingerprint(exc.expected_key)}, the host offered {exc.key.get_name()} "
                f"{fingerprint(exc.key)}. Nothing was run.",
                hint="someone may be impersonating the host, or it was reinstalled; find out which before "
                f"changing the entry for {tg.known_hosts_name} in {tg.known_hosts[0]}",
            ) from None
        except paramiko.AuthenticationException as exc:
            conn.close()
            raise HostError(
                f"authentication failed for {tg.where()} with key {tg.key_filename or '(agent/default keys)'}: {exc}",
                hint="is the operator's public key in the host's authorized_keys?",
            ) from None
        except BaseException:
            conn.close()
            raise
        _no_delay(conn.client.get_transport())
        return conn

    def _drop(self) -> None:
        conn, self._conn, sftp, self._sftp = self._conn, None, self._sftp, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connect_or_raise(self) -> paramiko.Transport:
        try:
            return self._transport()
        except (HostError, HostKeyError):
            raise
        except Exception as exc:
            tg = self.target
            raise Unreachable(
                f"cannot connect to {tg.where()}: {type(exc).__name__}: {exc}",
                hint="is the host up and its sshd listening on that address and port?",
            ) from None

    # -- commands --

    def run(self, cmd: Cmd, *, check: bool = True, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        """Run once; never retried (the command may change state). With `timeout`, the host's own
        `timeout` bounds it (host_bounded): it is killed there before this call gives up."""
        if not isinstance(cmd, Cmd):
            raise TypeError("SshTransport.run takes a Cmd, never a string")
        t = self._connect_or_raise()
        t0 = time.monotonic()
        wire, wait = (
            (host_bounded(cmd, timeout), timeout + HOST_KILL_AFTER_S + HOST_SLACK_S) if timeout else (cmd, None)
        )
        try:
            try:
                result = self._exec(t, wire, wait, stdin, shown=cmd, host_bound=timeout)
            except NotStarted:  # the connection died unnoticed; the command never started: once more
                result = self._exec(self._connect_or_raise(), wire, wait, stdin, shown=cmd, host_bound=timeout)
        finally:
            self.stats.add(commands=1, command_s=time.monotonic() - t0)
        if timeout and result.exit_status in (124, 137) and result.duration_s >= timeout:
            raise command_timed_out(self.name, cmd, timeout, result.stdout, result.stderr, killed_on_host=True)
        self._log.debug("ran", cmd=cmd.display(), exit_status=result.exit_status, seconds=round(result.duration_s, 4))
        if check and result.exit_status != 0:
            raise command_failed(self.name, cmd, result)
        return result

    def _exec(
        self,
        t: paramiko.Transport,
        cmd: Cmd,
        timeout: float | None,
        stdin: bytes | None,
        *,
        shown: Cmd | None = None,
        host_bound: float | None = None,
    ) -> Result:
        shown = shown or cmd
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        out, err = bytearray(), bytearray()
        try:
            chan = t.open_session(timeout=self.target.connect_timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.close()
            raise NotStarted(f"{self.name}: cannot open a session channel: {exc}") from None
        writer: threading.Thread | None = None
        try:
            chan.exec_command(cmd.render())
            writer = self._feed(chan, stdin)
            self._drain(t, chan, out, err, deadline, shown)
            status = chan.recv_exit_status()
        except _TooMuch:
            chan.close()
            raise HostError(
                f"{self.name}: {shown.display()[:200]} wrote more than {HOST_OUTPUT_MAX} bytes of output; "
                "stopped reading it (nothing pairctl runs there writes that much)",
                hint=f"look at what the login shell and pairctl-svc print on {self.name}",
            ) from None
        except _Timeout:
            chan.close()
            raise command_timed_out(
                self.name,
                shown,
                host_bound or timeout or 0.0,
                out.decode("utf-8", "replace"),
                err.decode("utf-8", "replace"),
                killed_on_host=None if host_bound else False,
            ) from None
        except ConnectionLost:
            self.close()
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.close()
            raise ConnectionLost(f"{self.name}: connection failed while running {shown.display()}: {exc}") from None
        finally:
            chan.close()
        if writer is not None:
            writer.join(timeout=1.0)
        return Result(
            exit_status=status,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_s=time.monotonic() - t0,
            stdout_bytes=bytes(out),
        )

    def _feed(self, chan: paramiko.Channel, stdin: bytes | None) -> threading.Thread | None:
        """Send stdin and close our side. Large input goes from a writer thread (returned, to be
        joined), so a program that answers while it reads cannot deadlock us on a full window."""
        if not stdin or len(stdin) <= 32768:
            if stdin:
                _send_all(chan, stdin)
            chan.shutdown_write()
            return None

        def feed() -> None:
            with contextlib.suppress(Exception):
                _send_all(chan, stdin)
            with contextlib.suppress(Exception):
                chan.shutdown_write()

        writer = threading.Thread(target=feed, daemon=True, name=f"stdin-{self.name}")
        writer.start()
        return writer

    def _drain(
        self,
        t: paramiko.Transport,
        chan: paramiko.Channel,
        out: bytearray,
        err: bytearray,
        deadline: float | None,
        shown: Cmd,
    ) -> None:
        """Read stdout and stderr into `out` and `err` until the program exits and both close,
        bounded by the deadline (_Timeout), the output cap (_TooMuch) and the connection's life."""
        fd = chan.fileno()
        exited_at: float | None = None
        while True:
            progressed = False
            while chan.recv_ready():
                out += chan.recv(_READ)
                progressed = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(_READ)
                progressed = True
            if len(out) > HOST_OUTPUT_MAX or len(err) > HOST_OUTPUT_MAX:
                raise _TooMuch()
            if (
                chan.eof_received
                and chan.exit_status_ready()
                and not chan.recv_ready()
                and not chan.recv_stderr_ready()
            ):
                break
            if progressed:
                continue
            if chan.exit_status_ready() and not chan.eof_received:
                # the program exited but something it started still holds stdout/stderr
                # (a daemon that did not redirect): do not hang on it, like `ssh -f` would
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > _LINGER_S:
                    self._log.warning("output left open after exit", cmd=shown.display())
                    break
            wait = 1.0 if exited_at is None else 0.05
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise _Timeout()
                wait = min(wait, 1.0 if exited_at is None else 0.05)
            if chan.eof_received:
                chan.status_event.wait(wait)
            else:
                select.select([fd], [], [], wait)
            if not t.is_active():
                raise ConnectionLost(f"{self.name}: connection lost while running {shown.display()}")

    # -- tcp through the host --

    def open_tcp(self, host: str, port: int, timeout: float | None) -> paramiko.Channel:
        """A `direct-tcpip` channel (what `ssh -L` opens) to HOST:PORT as the host sees it."""
        t = self._connect_or_raise()
        return t.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)

    # -- files --

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            self._connect_or_raise()
            if self._sftp is None:
                assert self._conn is not None  # _connect_or_raise connected, or raised
                self._sftp = self._conn.sftp()
            return self._sftp

    @contextlib.contextmanager
    def _transfer(self, op: Literal["put", "get"], src: str, dst: str, size: int = 0) -> Iterator[paramiko.SFTPClient]:
        """The SFTP session for one transfer of `size` bytes (a get: the local file's), held alone;
        its failure judged by `_transfer_error`, its time and bytes counted (`stats`)."""
        t0 = time.monotonic()
        try:
            with self._sftp_io:
                yield self._sftp_client()
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise self._transfer_error(op, src, dst, exc) from None
        size = Path(dst).stat().st_size if op == "get" else size
        self.stats.add(**{f"{op}s": 1, f"{op}_bytes": size, f"{op}_s": time.monotonic() - t0})

    def put(self, local_path: str | Path, remote_path: str) -> None:
        """Copy a file (content + permission bits minus group/other write) via SFTP."""
        local_path = Path(local_path)
        st = local_path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise HostError(f"put {local_path}: not a regular file")
        with self._transfer("put", str(local_path), remote_path, st.st_size) as sftp:
            sftp.put(str(local_path), remote_path, confirm=True)
            sftp.chmod(remote_path, stat.S_IMODE(st.st_mode) & 0o755)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None:
        with self._transfer("put", "<bytes>", remote_path, len(data)) as sftp:
            if not self._put_pipelined(sftp, data, remote_path, mode & 0o7755):
                # refused somewhere: again the long way, for its error (a full disk: DiskFull)
                sftp.putfo(io.BytesIO(data), remote_path, file_size=len(data), confirm=True)
                sftp.chmod(remote_path, mode & 0o7755)

    @staticmethod
    def _put_pipelined(sftp_client: paramiko.SFTPClient, data: bytes, path: str, mode: int) -> bool:
        """A small file in two round trips: OPEN (create, truncate), then every WRITE, FSETSTAT
        (the mode), FSTAT (the size, what putfo's confirm checks) and CLOSE sent at once. False
        when the host refused any of them (the caller then does it the long way)."""
        from paramiko import sftp as S
        from paramiko.sftp_attr import SFTPAttributes

        sftp = _requests(sftp_client)
        if len(data) > 1 << 20:
            return False  # big files keep paramiko's own windowed writes
        flags = S.SFTP_FLAG_WRITE | S.SFTP_FLAG_CREATE | S.SFTP_FLAG_TRUNC
        try:
            _, msg = sftp._request(S.CMD_OPEN, sftp._adjust_cwd(path), flags, SFTPAttributes())
        except OSError:
            return False
        handle = msg.get_binary()
        send = sftp._async_request
        attrs = SFTPAttributes()
        attrs.st_mode = mode
        nums = [
            send(type(None), S.CMD_WRITE, handle, S.int64(off), data[off : off + 32768])
            for off in range(0, len(data), 32768)
        ]
        nums.append(send(type(None), S.CMD_FSETSTAT, handle, attrs))
        fstat = send(type(None), S.CMD_FSTAT, handle)
        close = send(type(None), S.CMD_CLOSE, handle)
        ok = True
        size = -1
        for num in (*nums, fstat, close):
            try:
                t, msg = sftp._read_response(num)
            except OSError:
                ok = False
                continue
            if num == fstat and t == S.CMD_ATTRS:
                size = _attrs_of(msg).st_size or 0
        return ok and size == len(data)

    def put_private(self, data: bytes, remote_path: str) -> None:
        def do(sftp: paramiko.SFTPClient) -> None:
            # SFTPClient.open sends no attributes; OPEN with permissions 0600 and EXCL makes the
            # server create the file with that mode (sftp-server: open(2) with it; umask only clears)
            attrs = paramiko.SFTPAttributes()
            attrs.st_mode = 0o600
            flags = paramiko.sftp.SFTP_FLAG_WRITE | paramiko.sftp.SFTP_FLAG_CREATE | paramiko.sftp.SFTP_FLAG_EXCL
            t, msg = _requests(sftp)._request(paramiko.sftp.CMD_OPEN, remote_path, flags, attrs)
            if t != paramiko.sftp.CMD_HANDLE:
                raise paramiko.SFTPError("expected a handle")
            with paramiko.SFTPFile(sftp, msg.get_binary(), "wb") as f:
                f.write(data)
            st = sftp.lstat(remote_path)
            if (st.st_mode or 0) & 0o077 or st.st_size != len(data):
                sftp.remove(remote_path)
                raise OSError(f"{remote_path} came out mode {(st.st_mode or 0) & 0o777:o}, size {st.st_size}")

        with self._transfer("put", "<bytes>", remote_path, len(data)):
            self._fs_locked("put", remote_path, do)

    def chmod(self, path: str, mode: int) -> None:
        self._fs("chmod", path, lambda sftp: sftp.chmod(path, mode))

    def get(self, remote_path: str, local_path: str | Path) -> None:
        with self._transfer("get", remote_path, str(local_path)) as sftp:
            sftp.get(remote_path, str(local_path))

    # -- file operations (SFTP requests: no login shell, ~ms each) --

    def _fs(self, op: str, path: str, fn: Callable[[paramiko.SFTPClient], T]) -> T:
        with self._sftp_io:
            return self._fs_locked(op, path, fn)

    def _fs_locked(self, op: str, path: str, fn: Callable[[paramiko.SFTPClient], T]) -> T:
        sftp = self._sftp_client()
        t0 = time.monotonic()
        try:
            return fn(sftp)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            if isinstance(exc, (paramiko.SSHException, EOFError)) or not self.connected:
                self.close()
                raise ConnectionLost(f"{self.name}: {op} {path} failed: {exc}") from None
            if isinstance(exc, HostError):
                raise
            raise host_file_error(self.name, op, path, exc) from None
        finally:
            self.stats.add(commands=1, command_s=time.monotonic() - t0)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        def do(sftp: paramiko.SFTPClient) -> None:
            try:
                sftp.mkdir(path, mode)
            except OSError as exc:
                # sftp v3 has no "exists" status: OpenSSH answers a generic failure
                if exc.errno in (None, errno.EEXIST, errno.EIO) and _exists(sftp, path):
                    raise FileExistsError(errno.EEXIST, f"{self.name}: {path} exists") from None
                raise
            sftp.chmod(path, mode)

        self._fs("mkdir", path, do)

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        missing: list[str] = []
        cur = path.rstrip("/") or "/"
        while cur not in ("", "/") and self.stat(cur) is None:
            missing.append(cur)
            cur = cur.rsplit("/", 1)[0] or "/"
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                self.mkdir(d, mode)

    def stat(self, path: str) -> FileStat | None:
        def do(sftp: paramiko.SFTPClient) -> FileStat | None:
            try:
                return _file_stat(sftp.lstat(path))
            except FileNotFoundError:
                return None

        return self._fs("stat", path, do)

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None and max_bytes <= HOST_FILE_MAX:
            # a small state file: OPEN, READ and CLOSE pipelined (fs_batch), not open/stat/read/close
            got = self.fs_batch([ReadFile(path, max_bytes)])[0]
            if isinstance(got, bytes):
                return got
            if isinstance(got, FileNotFoundError) or not isinstance(got, OSError):
                raise got if isinstance(got, BaseException) else HostError(f"{self.name}: read {path}: {got!r}")
            raise host_file_error(self.name, "read", path, got)

        def do(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as f:
                if max_bytes is None:
                    f.prefetch()
                    whole: bytes = f.read()
                    return whole
                # prefetch what is there, up to the bound (/dev/zero says 0, a sparse file TBs)
                f.prefetch(min(f.stat().st_size or 0, max_bytes + 1))
                head: bytes = f.read(max_bytes + 1)
                return head

        data = self._fs("read", path, do)
        self.stats.add(get_bytes=len(data))
        return data

    def fs_batch(self, ops: list[FsRead]) -> list[FsResult]:
        """`transport.fs_batch` pipelined: every first request (LSTAT, READLINK, OPEN) is sent before
        the first answer is read (sftp-server answers in order), then every READ and CLOSE, and a
        clock file's CLOSE, LSTAT and REMOVE; a file not at its end reads on."""
        if not ops:
            return []
        rounds = 0

        def do(sftp_client: paramiko.SFTPClient) -> list[FsResult]:
            nonlocal rounds
            from paramiko import sftp as S

            sftp = _requests(sftp_client)
            send = sftp._async_request
            first = [_send_first(sftp, op) for op in ops]
            rounds += 1
            out: list[FsResult] = [None] * len(ops)
            handles = _first_answers(sftp, ops, first, out)
            data: dict[int, bytes] = {}
            pending: dict[int, list[int]] = {}
            for i, h in handles.items():
                op = ops[i]
                if isinstance(op, ReadFile):
                    data[i] = b""
                    pending[i] = [send(type(None), S.CMD_READ, h, S.int64(0), op.max_bytes + 1)]
                else:
                    path = sftp._adjust_cwd(op.path)
                    pending[i] = [
                        send(type(None), S.CMD_CLOSE, h),
                        send(type(None), S.CMD_LSTAT, path),
                        send(type(None), S.CMD_REMOVE, path),
                    ]
            while pending:
                rounds += 1
                nxt: dict[int, list[int]] = {}
                for i, nums in pending.items():
                    op = ops[i]
                    if isinstance(op, HostClock):
                        close_stat_remove = [_stat_answer(sftp, num) for num in nums]  # every answer read, in order
                        out[i] = close_stat_remove[1] or FileNotFoundError(2, f"{op.path} vanished")
                        continue
                    assert isinstance(op, ReadFile)
                    try:
                        t, msg = sftp._read_response(nums[0])
                        chunk = msg.get_string() if t == S.CMD_DATA else b""
                    except EOFError:
                        chunk = b""
                    except OSError as exc:  # the host refused the read itself
                        out[i] = exc
                        send(type(None), S.CMD_CLOSE, handles[i])
                        continue
                    data[i] += chunk
                    if chunk and len(data[i]) <= op.max_bytes:  # not at its end yet: read on
                        h = handles[i]
                        left = op.max_bytes + 1 - len(data[i])
                        nxt[i] = [send(type(None), S.CMD_READ, h, S.int64(len(data[i])), left)]
                    else:
                        out[i] = data[i]
                        send(type(None), S.CMD_CLOSE, handles[i])  # its answer is drained later
                pending = nxt
            return out

        got = self._fs("read", ops[0].path, do)
        self.stats.add(commands=max(0, rounds - 1), get_bytes=sum(len(r) for r in got if isinstance(r, bytes)))
        return got

    def login_uid(self) -> int:
        """The login user's uid: the owner of the SFTP session's start directory (its home)."""
        uid: int | None = getattr(self, "_login_uid", None)
        if uid is None:
            uid = self._login_uid = self._fs("stat", ".", lambda sftp: sftp.stat(".").st_uid)
        if uid is None:  # a server that names no owner: root_trust then trusts root only
            raise TypeError(f"{self.name}: the SFTP server names no owner of its start directory")
        return uid

    def rename(self, src: str, dst: str) -> None:
        self._fs("rename", src, lambda sftp: sftp.posix_rename(src, dst))

    def remove(self, path: str) -> None:
        self._fs("remove", path, lambda sftp: sftp.remove(path))

    def rmdir(self, path: str) -> None:
        self._fs("rmdir", path, lambda sftp: sftp.rmdir(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(self._fs("listdir", path, lambda sftp: sftp.listdir(path)))

    def symlink(self, target: str, path: str) -> None:
        self._fs("symlink", path, lambda sftp: sftp.symlink(target, path))

    def readlink(self, path: str) -> str | None:
        def do(sftp: paramiko.SFTPClient) -> str | None:
            try:
                return sftp.readlink(path)
            except OSError:
                return None

        return self._fs("readlink", path, do)

    def _transfer_error(self, op: str, src: str, dst: str, exc: BaseException) -> HostError:
        if isinstance(exc, HostError):  # already judged (by _fs)
            return exc
        if isinstance(exc, (paramiko.SSHException, EOFError)) or not self.connected:
            self.close()
            return ConnectionLost(f"{self.name}: {op} {src} -> {dst} failed: {exc}")
        if op == "put" and ("size mismatch" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC):
            # sftp-server reports a full disk as a short file (paramiko: "size mismatch in put! 0 != N")
            with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                self._sftp_client().remove(dst)  # no partial file left behind
            return DiskFull(
                f"no space left on {self.name}:{posixpath.dirname(dst) or dst} "
                f"(writing {posixpath.basename(dst)}: {exc})",
                hint=f"free space under {posixpath.dirname(dst)} on {self.name}, then run the command again",
            )
        if isinstance(exc, OSError) and not isinstance(exc, HostError):
            return host_file_error(self.name, op, dst, exc)
        return HostError(f"{self.name}: {op} {src} -> {dst} failed: {type(exc).__name__}: {exc}")


def host_file_error(host: str, op: str, path: str, exc: OSError) -> HostError:
    """An SFTP operation the host refused, as one line naming host, operation and path (OpenSSH's
    sftp-server answers a read-only or full filesystem with a bare SSH_FX_FAILURE, no errno)."""
    why = exc.strerror or str(exc) or type(exc).__name__
    d = posixpath.dirname(path.rstrip("/")) or "/"
    if exc.errno == errno.ENOSPC:
        return DiskFull(f"no space left on {host}:{d} ({op} {path})", hint=f"free space under {d} on {host}")
    said = why.strip().lower()
    refused = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or said in ("failure", "permission denied")
    if said == "failure":
        why = "the host's SFTP server says only 'Failure' (a read-only or full filesystem?)"
    err = HostError(
        f"{host}: {op} {path} failed: {why}",
        hint=f"on {host}, check that {d} is writable and has room (`df {d}`, `mount`), then run the command again",
    )
    err.write_refused = refused or "read-only" in said  # a read-only filesystem in the host's own words
    return err


class _Timeout(Exception):
    pass


class _TooMuch(Exception):
    pass


def _no_delay(t: paramiko.Transport | None) -> None:
    """TCP_NODELAY, as OpenSSH's client sets it: otherwise Nagle holds each small packet of an
    SFTP batch back until the host's delayed ACK of the one before (40 ms apiece)."""
    sock = getattr(t, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@runtime_checkable
class _SftpRequests(Protocol):
    """paramiko.SFTPClient's private request layer, which the pipelined transfers drive directly
    (types-paramiko leaves it out; `_requests` checks that the installed paramiko has it)."""

    def _request(self, t: int, *args: object) -> tuple[int, paramiko.Message]: ...

    def _async_request(self, fileobj: object, t: int, *args: object) -> int: ...

    def _read_response(self, waitfor: int | None = None) -> tuple[int, paramiko.Message]: ...

    def _adjust_cwd(self, path: str) -> str: ...


@runtime_checkable
class _AttrsFromMsg(Protocol):
    """paramiko.SFTPAttributes' private constructor from an ATTRS answer."""

    def _from_msg(self, msg: paramiko.Message) -> paramiko.SFTPAttributes: ...


def _send_first(sftp: _SftpRequests, op: FsRead) -> int:
    """The first request of one batch operation (LSTAT, READLINK, statvfs or OPEN), not awaited."""
    from paramiko import sftp as S
    from paramiko.sftp_attr import SFTPAttributes

    send, path = sftp._async_request, sftp._adjust_cwd(op.path)
    if isinstance(op, Lstat):
        return send(type(None), S.CMD_LSTAT, path)
    if isinstance(op, Readlink):
        return send(type(None), S.CMD_READLINK, path)
    if isinstance(op, ReadFile):
        return send(type(None), S.CMD_OPEN, path, S.SFTP_FLAG_READ, SFTPAttributes())
    if isinstance(op, FreeBytes):  # a server without it answers "unsupported": df then
        return send(type(None), S.CMD_EXTENDED, "statvfs@openssh.com", path)
    attrs = SFTPAttributes()
    attrs.st_mode = op.mode
    return send(type(None), S.CMD_OPEN, path, S.SFTP_FLAG_WRITE | S.SFTP_FLAG_CREATE | S.SFTP_FLAG_EXCL, attrs)


def _first_answers(sftp: _SftpRequests, ops: list[FsRead], first: list[int], out: list[FsResult]) -> dict[int, bytes]:
    """Read the first answers in order into `out`; returns the open handles by op index. An error
    a caller must see (a clock file that cannot be created) is raised once every answer is read,
    after closing the handles, so the channel stays in step."""
    from paramiko import sftp as S

    handles: dict[int, bytes] = {}
    failed: BaseException | None = None
    for i, (op, num) in enumerate(zip(ops, first, strict=True)):
        try:
            _, msg = sftp._read_response(num)
        except OSError as exc:  # the answer was an error status
            if isinstance(op, Readlink) or (isinstance(op, Lstat) and isinstance(exc, FileNotFoundError)):
                out[i] = None
            elif isinstance(op, (HostClock, ReadFile, FreeBytes)) or (isinstance(op, Lstat) and op.refused_ok):
                out[i] = exc
            else:
                failed = failed or exc  # raised once every answer is read
            continue
        if isinstance(op, Lstat):
            out[i] = _file_stat(_attrs_of(msg))
        elif isinstance(op, Readlink):
            out[i] = msg.get_text() if msg.get_int() == 1 else None
        elif isinstance(op, FreeBytes):
            # struct statvfs as OpenSSH's PROTOCOL says: bsize, frsize, blocks, bfree, bavail, ...
            _bsize, frsize, _blocks, _bfree, bavail = (msg.get_int64() for _ in range(5))
            out[i] = (bavail * frsize // 1024) * 1024  # df -Pk's Available, in bytes
        else:
            handles[i] = msg.get_binary()
    if failed is not None:
        for h in handles.values():
            sftp._async_request(type(None), S.CMD_CLOSE, h)  # answers are drained by the next request
        raise failed
    return handles


def _stat_answer(sftp: _SftpRequests, num: int) -> FileStat | None:
    """Read the answer to request NUM: the FileStat of an ATTRS answer, else (an error too) None."""
    from paramiko import sftp as S

    try:
        t, msg = sftp._read_response(num)
    except OSError:
        return None
    return _file_stat(_attrs_of(msg)) if t == S.CMD_ATTRS else None


def _requests(sftp: paramiko.SFTPClient) -> _SftpRequests:
    if not isinstance(sftp, _SftpRequests):
        raise HostError(f"paramiko {paramiko.__version__}: SFTPClient has no request layer to pipeline over")
    return sftp


def _attrs_of(msg: paramiko.Message) -> paramiko.SFTPAttributes:
    factory: object = paramiko.SFTPAttributes
    if not isinstance(factory, _AttrsFromMsg):
        raise HostError(f"paramiko {paramiko.__version__}: SFTPAttributes cannot be read from an answer")
    return factory._from_msg(msg)


def _file_stat(a: paramiko.SFTPAttributes) -> FileStat:
    return FileStat(mode=a.st_mode or 0, size=a.st_size or 0, mtime=float(a.st_mtime or 0), uid=a.st_uid or 0)


def _send_all(chan: paramiko.Channel, data: bytes) -> None:
    """Channel.sendall re-slices the whole remaining buffer per packet (quadratic); a memoryview
    keeps it linear."""
    view = memoryview(data)
    off, n = 0, len(data)
    while off < n:
        # Channel.send takes any bytes-like object (it slices it into packets); types-paramiko says bytes
        off += chan.send(view[off : off + 262144])  # type: ignore[arg-type]


def _exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.lstat(path)
        return True
    except OSError:
        return False
