"""Issue 29 item 4 over the lab's REAL sshd: a host's small reads pipelined in one SFTP batch
(`fs_batch`) give what the one-request methods give, path by path, in a few round trips; the
two-round-trip `put_bytes` writes content and mode as before; statvfs agrees with `df`."""

from __future__ import annotations

import os
import stat
import time

import pytest

from orchestrator.errors import HostError
from orchestrator.hosts import space
from orchestrator.remote.transport import (
    HOST_FILE_MAX,
    FileStat,
    FreeBytes,
    HostClock,
    Lstat,
    ReadFile,
    Readlink,
    fs_batch,
    one_fs_read,
)

pytestmark = pytest.mark.integration

HOST = "lab-native"


@pytest.fixture()
def tree(lab, tmp_path):
    """A directory on the host (the lab's hosts share this machine's filesystem) with a file, a
    link, a link to /dev/zero, a 300 KiB file (longer than one SFTP read) and an unreadable one."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "small").write_bytes(b"route\n")
    (d / "big").write_bytes(os.urandom(300 << 10))
    os.symlink("small", d / "link")
    os.symlink("/dev/zero", d / "zero")
    return d


def test_a_batch_reads_what_the_single_requests_read(t, tree) -> None:
    pid = os.getpid()
    ops = [
        Lstat("/"),
        Lstat(str(tree / "link")),  # lstat: the link itself
        Lstat(str(tree / "missing")),
        Readlink(str(tree / "link")),
        Readlink(str(tree / "small")),  # not a link: None
        Readlink(str(tree / "missing")),
        ReadFile(str(tree / "small")),
        ReadFile(str(tree / "missing")),
        ReadFile(str(tree / "big")),
        ReadFile(str(tree / "big"), 1000),  # bounded: max_bytes + 1, as read_bytes
        ReadFile(str(tree / "zero"), HOST_FILE_MAX),  # a hostile link: stopped at the bound
        ReadFile(f"/proc/{pid}/cmdline"),  # size 0 by stat, read to its end all the same
        ReadFile(str(tree)),  # a directory: the host's error, not a crash
    ]
    got = fs_batch(t, ops)
    one = [one_fs_read(t, op) for op in ops]
    for op, a, b in zip(ops, got, one, strict=True):
        if isinstance(b, BaseException):
            assert isinstance(a, OSError) and isinstance(a, FileNotFoundError) == isinstance(b, FileNotFoundError), op
        else:
            assert a == b, op
    assert got[8] == (tree / "big").read_bytes()
    assert len(got[9]) == 1001 and len(got[10]) == HOST_FILE_MAX + 1
    assert got[11] == open(f"/proc/{pid}/cmdline", "rb").read()
    # without the /dev/zero link (read on, 4 MiB, for a dozen rounds): three waits for the lot
    small = [op for op in ops if op.path != str(tree / "zero")]
    before = t.stats.commands
    fs_batch(t, small)
    assert t.stats.commands - before <= 4, t.stats.commands - before


def test_host_clock_and_free_bytes(t, tree) -> None:
    probe = str(tree / ".clock.test")
    clock, free = fs_batch(t, [HostClock(probe), FreeBytes(str(tree))])
    assert isinstance(clock, FileStat) and abs(clock.mtime - time.time()) < 5 and not os.path.exists(probe)
    assert isinstance(free, int) and free > 0
    # what `df -Pk` says, to within what others wrote meanwhile
    res = t.run(space.df_cmd(str(tree)))
    df = space.parse_df(res.stdout if isinstance(res.stdout, str) else res.stdout.decode(), HOST, str(tree))
    assert abs(free - df.free_bytes) < 256 << 20
    # a clock file that cannot be made (no such directory): its error, not a raise
    (bad,) = fs_batch(t, [HostClock(str(tree / "no-dir" / "c"))])
    assert isinstance(bad, OSError)


def test_put_bytes_writes_content_and_mode_and_names_a_refusal(t, tree) -> None:
    f = str(tree / "put")
    for data, mode in ((b"", 0o600), (b"x" * 100, 0o644), (os.urandom(70000), 0o755), (b"abc", 0o4755)):
        t.put_bytes(data, f, mode=mode)
        assert (tree / "put").read_bytes() == data and stat.S_IMODE(os.stat(f).st_mode) == mode & 0o7755
    t.put_bytes(b"ab", f)  # truncated, not appended
    assert (tree / "put").read_bytes() == b"ab"
    with pytest.raises(HostError, match=f"{HOST}: put .*no-dir"):
        t.put_bytes(b"x", str(tree / "no-dir" / "f"))
