"""The local transport: for a host that is the machine pairctl runs on (e.g. the GPU box).

Same interface as SSH; commands are exec'd straight from argv (no shell at all), files are
copied. It runs as pairctl's own user, whatever the inventory says about `user`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import DiskFull, HostError
from orchestrator.log import get_logger
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import Result, command_failed, command_timed_out
from orchestrator.remote.transport import DEFAULT_RETRY, FileStat, Retrying, RetryPolicy, TransportStats


def _run_group(argv: list[str], stdin: bytes, timeout: float | None) -> subprocess.CompletedProcess[bytes]:
    """ARGV in a session of its own (a Ctrl-C to the operator's terminal must not kill an exec
    mid-write); at `timeout` its whole process group is killed before this returns, as the SSH
    transport's host-side bound does (services it started under setsid are not in it)."""
    p = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        out, err = p.communicate()
        raise subprocess.TimeoutExpired(argv, timeout or 0.0, out, err) from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


@dataclass
class LocalTransport(Retrying):
    name: str = "local"
    retry: RetryPolicy = DEFAULT_RETRY
    stats: TransportStats = field(default_factory=TransportStats)

    def __post_init__(self) -> None:
        self._log = get_logger(host=self.name)

    def run(self, cmd: Cmd, *, check: bool = True, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        if not isinstance(cmd, Cmd):
            raise TypeError("LocalTransport.run takes a Cmd, never a string")
        t0 = time.monotonic()
        try:
            p = _run_group(cmd.real_argv(), stdin if stdin is not None else b"", timeout)
        except subprocess.TimeoutExpired as exc:
            self.stats.add(commands=1, command_s=time.monotonic() - t0)
            raise command_timed_out(
                self.name, cmd, timeout or 0.0, _dec(exc.stdout), _dec(exc.stderr), killed_on_host=True
            ) from None
        except FileNotFoundError:
            # the same outcome a shell gives for a missing program: status 127
            p = subprocess.CompletedProcess(
                cmd.real_argv(), 127, b"", f"{cmd.argv_display()[0]}: command not found\n".encode()
            )
        except PermissionError:
            p = subprocess.CompletedProcess(
                cmd.real_argv(), 126, b"", f"{cmd.argv_display()[0]}: permission denied\n".encode()
            )
        dt = time.monotonic() - t0
        self.stats.add(commands=1, command_s=dt)
        # a signal shows as a negative returncode locally; report it the way a shell would
        status = p.returncode if p.returncode >= 0 else 128 - p.returncode
        result = Result(status, _dec(p.stdout), _dec(p.stderr), dt, stdout_bytes=p.stdout or b"")
        self._log.debug("ran", cmd=cmd.display(), exit_status=status, seconds=round(dt, 4))
        if check and status != 0:
            raise command_failed(self.name, cmd, result)
        return result

    def put(self, local_path: str | Path, remote_path: str) -> None:
        src = Path(local_path)
        t0 = time.monotonic()
        try:
            st = src.stat()
            if not stat.S_ISREG(st.st_mode):
                raise HostError(f"put {src}: not a regular file")
            shutil.copyfile(src, remote_path)
            os.chmod(remote_path, stat.S_IMODE(st.st_mode) & 0o755)
        except OSError as exc:
            raise HostError(f"{self.name}: put {src} -> {remote_path} failed: {exc}") from None
        self.stats.add(puts=1, put_bytes=st.st_size, put_s=time.monotonic() - t0)

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None:
        t0 = time.monotonic()
        try:
            with open(remote_path, "wb") as f:
                f.write(data)
            os.chmod(remote_path, mode & 0o7755)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                with contextlib.suppress(OSError):
                    os.remove(remote_path)  # no partial file left behind
                raise DiskFull(
                    f"no space left on {self.name}:{os.path.dirname(remote_path)} "
                    f"(writing {os.path.basename(remote_path)})"
                ) from None
            raise HostError(f"{self.name}: put <bytes> -> {remote_path} failed: {exc}") from None
        self.stats.add(puts=1, put_bytes=len(data), put_s=time.monotonic() - t0)

    def put_private(self, data: bytes, remote_path: str) -> None:
        t0 = time.monotonic()
        try:
            fd = os.open(remote_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise HostError(f"{self.name}: put <bytes> -> {remote_path} failed: {exc}") from None
        self.stats.add(puts=1, put_bytes=len(data), put_s=time.monotonic() - t0)

    def chmod(self, path: str, mode: int) -> None:
        self.stats.add(commands=1)
        os.chmod(path, mode)

    def get(self, remote_path: str, local_path: str | Path) -> None:
        t0 = time.monotonic()
        try:
            shutil.copyfile(remote_path, local_path)
            n = Path(local_path).stat().st_size
        except OSError as exc:
            raise HostError(f"{self.name}: get {remote_path} -> {local_path} failed: {exc}") from None
        self.stats.add(gets=1, get_bytes=n, get_s=time.monotonic() - t0)

    def connect(self) -> None:
        """Nothing to reach: the host is this machine."""

    def close(self) -> None:
        pass

    # -- file operations --

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.mkdir(path, mode)
        os.chmod(path, mode)
        self.stats.add(commands=1)

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        missing = []
        p = Path(path)
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                self.mkdir(str(d), mode)

    def stat(self, path: str) -> FileStat | None:
        self.stats.add(commands=1)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        return FileStat(mode=st.st_mode, size=st.st_size, mtime=st.st_mtime, uid=st.st_uid)

    def mount_flags(self, path: str) -> int:
        """statvfs(PATH)'s f_flag (transport.MountFlags)."""
        self.stats.add(commands=1)
        return os.statvfs(path).f_flag

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        self.stats.add(commands=1)
        with open(path, "rb") as f:
            if max_bytes is None:
                return f.read()
            chunks: list[bytes] = []  # in pieces: read(n) allocates n up front; /proc files say size 0
            n = 0
            while n <= max_bytes and (b := f.read(min(1 << 20, max_bytes + 1 - n))):
                chunks.append(b)
                n += len(b)
            return b"".join(chunks)

    def login_uid(self) -> int:
        """This process's effective uid (hosts/root_trust judges install roots against it)."""
        return os.geteuid()

    def rename(self, src: str, dst: str) -> None:
        self.stats.add(commands=1)
        os.rename(src, dst)

    def remove(self, path: str) -> None:
        self.stats.add(commands=1)
        os.remove(path)

    def rmdir(self, path: str) -> None:
        self.stats.add(commands=1)
        os.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        self.stats.add(commands=1)
        return sorted(os.listdir(path))

    def symlink(self, target: str, path: str) -> None:
        self.stats.add(commands=1)
        os.symlink(target, path)

    def readlink(self, path: str) -> str | None:
        self.stats.add(commands=1)
        try:
            return os.readlink(path)
        except (FileNotFoundError, OSError):
            return None


def _dec(b: bytes | None) -> str:
    return (b or b"").decode("utf-8", "replace")
