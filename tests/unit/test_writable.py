"""What SFTP says of a path's file system (hosts/writable.py) and the deploy's check built on it
(layout.check_state_dir), which must say what the real run's mkdir refusal says (issue 49: a dry
run printed a plan the real run refused) and predict only what the kernel states: statvfs's
read-only flag of the nearest existing directory. Mode bits and the mounts table are not used.

Mounts are in the shape the kernel writes them (/proc/self/mounts with its octal escapes, in attach
order); the check runs on a LocalTransport over a real temporary root, its statvfs flag given."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import HostStateError
from orchestrator.hosts import layout as LY
from orchestrator.hosts import services
from orchestrator.hosts.probes import read_facts
from orchestrator.hosts.writable import READ_ONLY, ST_RDONLY, Mount, ancestors, mount_of, parse_mounts, why_not_made
from orchestrator.remote import ssh
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.transport import FileStat, FreeBytes, FsResult, Lstat, MountFlags, fs_batch

MOUNTS = rb"""/dev/vda / ext4 rw,relatime,discard 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/vdb /srv/my\040disk ext4 rw,relatime 0 0
/dev/vdb /srv/my\040disk xfs ro,relatime 0 0
/dev/vdb /srv/my\040disk/root btrfs rw,relatime 0 0
/dev/vdd /mnt/tab\011back\134slash\012nl xfs ro 0 0
/dev/vde /mnt/caf\303\251 btrfs rw 0 0
"""

# a real Ubuntu host's table, in the kernel's (attach) order: what the initramfs mounted is moved
# under / and listed before it
UBUNTU = b"""sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
udev /dev devtmpfs rw,nosuid,relatime,size=4011316k,nr_inodes=1002829,mode=755,inode64 0 0
devpts /dev/pts devpts rw,nosuid,noexec,relatime,gid=5,mode=620,ptmxmode=000 0 0
tmpfs /run tmpfs rw,nosuid,nodev,noexec,relatime,size=810104k,mode=755,inode64 0 0
/dev/vda1 / ext4 rw,relatime,discard,errors=remount-ro 0 0
"""


def _on(mounts: list[Mount], path: str) -> Mount:
    m = mount_of(mounts, path)
    assert m is not None
    return m


def test_mounts_are_read_with_their_octal_escapes() -> None:
    points = [m.point for m in parse_mounts(MOUNTS)]
    assert "/srv/my disk" in points and "/mnt/tab\tback\\slash\nnl" in points and "/mnt/café" in points
    assert parse_mounts(b"short line\nnot a mount line\n\n") == []


def test_the_mount_of_a_path_is_the_longest_point_holding_it_of_equals_the_last_listed() -> None:
    mounts = parse_mounts(MOUNTS)
    assert _on(mounts, "/srv/my disk/root.state").fstype == "xfs"  # the one listed after the other at that point
    assert _on(mounts, "/srv/my disk/root/run").fstype == "btrfs"  # the longest point
    assert _on(mounts, "/mnt/ca").point == "/" and _on(mounts, "/mnt/café/x").fstype == "btrfs"
    assert _on(mounts, "/").point == "/" and mount_of([], "/x") is None


def _reads(monkeypatch: pytest.MonkeyPatch, t: LocalTransport, mounts: bytes) -> None:
    monkeypatch.setattr(t, "read_bytes", lambda path, max_bytes=None: mounts if path == "/proc/self/mounts" else b"")


def test_fs_type_on_a_real_ubuntu_table_in_attach_order(monkeypatch: pytest.MonkeyPatch) -> None:
    t = LocalTransport("h")
    _reads(monkeypatch, t, UBUNTU)
    assert LY.fs_type(t, "/run/x.state") == "tmpfs"  # the tmpfs warning's fact
    assert LY.fs_type(t, "/proc/self") == "proc" and LY.fs_type(t, "/srv/root.state") == "ext4"


def test_a_mount_point_holding_a_byte_that_str_splits_at_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """'ą' is UTF-8 c4 85, and 0x85 is a line break to str.splitlines on latin-1 text (0xa0, 0x0b
    are whitespace to str.split): the point was cut and the path judged by its parent's mount."""
    mounts = parse_mounts(b"/dev/vda / ext4 ro 0 0\n/dev/vdb /srv/\xc4\x85\xc2\xa0x\x0by tmpfs rw 0 0\n")
    assert [m.point for m in mounts] == ["/", "/srv/\u0105\u00a0x\x0by"]
    assert _on(mounts, "/srv/\u0105\u00a0x\x0by/root.state").fstype == "tmpfs"
    t = LocalTransport("h")
    _reads(monkeypatch, t, "/dev/vda / ext4 rw 0 0\ntmpfs /srv/\u0105 tmpfs rw 0 0\n".encode())
    assert LY.fs_type(t, "/srv/\u0105/root.state") == "tmpfs"


def test_an_escape_past_one_byte_is_no_escape_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """\\400-\\777 is no byte: it stays as written (it raised UnicodeEncodeError, mid-prepare from fs_type)."""
    mounts = parse_mounts(b"/dev/a / ext4 rw 0 0\n/dev/b /mnt/x\\777y\\101 xfs rw 0 0\n")
    assert mounts[1].point == "/mnt/x\\777yA"
    t = LocalTransport("h")
    _reads(monkeypatch, t, b"/dev/b /mnt/\\400 xfs rw 0 0\n/dev/a / ext4 rw 0 0\n")
    assert LY.fs_type(t, "/mnt/x") == "ext4"

    def unreadable(path: str, max_bytes: int | None = None) -> bytes:
        raise _refused(path)

    monkeypatch.setattr(t, "read_bytes", unreadable)
    assert LY.fs_type(t, "/mnt/x") is None


def _dir(mode: int = 0o755) -> FileStat:
    return FileStat(mode=stat.S_IFDIR | mode, size=4096, mtime=0.0, uid=0)


LINK = FileStat(stat.S_IFLNK | 0o777, 8, 0.0, 0)
FILE = FileStat(stat.S_IFREG | 0o644, 8, 0.0, 0)
UNSUPPORTED = NotImplementedError("statvfs")


@pytest.mark.parametrize(
    ("lstats", "flags", "why"),
    [
        ([None, _dir(), _dir(), _dir()], [ST_RDONLY, 0, 0], READ_ONLY),  # the parent's file system is read-only
        ([None, _dir(), _dir(), _dir()], [0x1000, ST_RDONLY, 0], None),  # ST_RELATIME only: the parent decides
        ([None, None, _dir(), _dir()], [FileNotFoundError(2, "x"), ST_RDONLY, 0], READ_ONLY),  # /srv is nearest
        ([None, _dir(0o555), _dir(), _dir()], [0, 0, 0], None),  # mode bits are not judged
        ([None, _dir(), LINK, _dir()], [ST_RDONLY, 0, 0], READ_ONLY),  # a link above: followed by both
        ([None, LINK, _dir(), _dir()], [ST_RDONLY, ST_RDONLY, 0], None),  # the nearest a link: cannot tell
        ([None, FILE, _dir(), _dir()], [ST_RDONLY, ST_RDONLY, 0], None),  # a file
        ([None, PermissionError(13, "x"), _dir(), _dir()], [ST_RDONLY] * 3, None),  # an unreadable answer
        ([None, _dir(), _dir(), _dir()], [UNSUPPORTED, ST_RDONLY, ST_RDONLY], None),  # no statvfs: no prediction
        ([None, _dir(), _dir(), _dir()], [PermissionError(13, "x"), 0, 0], None),  # statvfs refused
        ([_dir(0o555), _dir(), _dir(), _dir()], [ST_RDONLY] * 3, None),  # it exists: as it is today
        ([None, None, None, None], [UNSUPPORTED] * 3, None),  # nothing at all
    ],
)
def test_why_a_directory_cannot_be_made(lstats: list[FsResult], flags: list[FsResult], why: str | None) -> None:
    assert why_not_made(lstats, flags) == why


def test_ancestors_end_at_the_top() -> None:
    assert ancestors("/srv/h/root.state/") == ["/srv/h/root.state", "/srv/h", "/srv", "/"]
    assert ancestors("//x") == ["//x", "//"] and ancestors("a/b") == ["a/b", "a", ""]


def _host(tmp_path: Path) -> tuple[LocalTransport, LY.HostLayout]:
    """A root whose run/ is a directory in it and whose ROOT.state is not there (the lab's shape of
    a parent that was not writable when run/ was made)."""
    parent = tmp_path / "h"
    (parent / "root" / "run").mkdir(parents=True)
    return LocalTransport("h"), LY.HostLayout(str(parent / "root"), state=str(parent / "root.state"))


def _read_only(monkeypatch: pytest.MonkeyPatch, t: LocalTransport, at: set[str]) -> list[str]:
    """The host's statvfs f_flag: ST_RDONLY at AT, else the real one. Any read of a host file
    (/proc/self/mounts, /proc/self/status) fails the test. The paths statvfs was asked of."""
    asked: list[str] = []
    real = t.mount_flags

    def mount_flags(path: str) -> int:
        asked.append(path)
        return ST_RDONLY if path in at else real(path)

    def no_read(path: str, max_bytes: int | None = None) -> bytes:
        raise AssertionError(f"read {path}")

    monkeypatch.setattr(t, "mount_flags", mount_flags)
    monkeypatch.setattr(t, "read_bytes", no_read)
    return asked


def test_the_deploys_check_says_what_the_real_mkdir_refusal_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_state_dir (a dry run, and a deploy before prepare) refuses with the very message the
    real run's failed mkdir gives (_link_run, strict): one function makes both. No host file is read
    (no /proc): statvfs alone, in one batch."""
    t, layout = _host(tmp_path)
    asked = _read_only(monkeypatch, t, {str(tmp_path / "h")})
    before = t.stats.commands
    with pytest.raises(HostStateError) as predicted:
        LY.check_state_dir(t, layout)
    assert asked == ancestors(str(tmp_path / "h")) and t.stats.commands - before == 1 + 2 * len(asked)
    real = t.makedirs

    def refused(path: str, mode: int = 0o755) -> None:  # what the mkdir on a read-only file system answers
        if path == layout.state:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        real(path, mode)

    monkeypatch.setattr(t, "makedirs", refused)
    with pytest.raises(HostStateError) as made:
        LY.install_helper(t, layout, strict=True)
    assert str(predicted.value) == str(made.value)
    assert predicted.value.exit_code == 6 and "\n" not in predicted.value.message
    assert f"h: {layout.state} cannot be made (Read-only file system)" in predicted.value.message
    assert "hosts.h.state_dir" in (predicted.value.hint or "")


def test_mode_bits_refuse_nothing_the_real_mkdir_still_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent of root's, 0555, and one owned by 'nobody' (what NFS id-mapping shows): the kernel
    says rw, so no refusal; and where statvfs is unsupported nothing is predicted."""
    t, layout = _host(tmp_path)
    os.chmod(tmp_path / "h", 0o555)
    os.chown(tmp_path / "h", 65534, 65534)
    try:
        _read_only(monkeypatch, t, set())
        LY.check_state_dir(t, layout)

        def unsupported(path: str) -> int:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), path)

        monkeypatch.setattr(t, "mount_flags", unsupported)
        LY.check_state_dir(t, layout)
    finally:
        os.chmod(tmp_path / "h", 0o755)
    assert sorted(os.listdir(tmp_path / "h")) == ["root"]  # nothing written


def test_a_state_dir_that_exists_or_is_linked_or_named_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, layout = _host(tmp_path)
    assert layout.state is not None
    _read_only(monkeypatch, t, set(ancestors(str(tmp_path / "h"))))  # would refuse anything to make
    os.mkdir(layout.state)
    LY.check_state_dir(t, layout)  # there: as today
    os.rmdir(layout.state)
    os.rmdir(Path(layout.root) / "run")
    os.symlink(layout.state, Path(layout.root) / "run")
    LY.check_state_dir(t, layout)  # run/ is the link already: prepare makes nothing
    os.remove(Path(layout.root) / "run")
    LY.check_state_dir(t, LY.HostLayout(layout.root, state=str(tmp_path / "elsewhere")))  # named: its mkdir says
    LY.check_state_dir(t, LY.HostLayout(layout.root))  # no state dir at all
    with pytest.raises(HostStateError):
        LY.check_state_dir(t, layout)


def test_the_facts_batch_carries_run_and_the_state_dir_so_the_usual_host_pays_no_more(tmp_path: Path) -> None:
    """read_facts reads run/'s link and the state dir in its own batch; check_state_dir given those
    facts reads nothing more where the state dir is there or run/ is its link."""
    t, layout = _host(tmp_path)
    assert layout.state is not None
    facts = read_facts(t, layout, ())
    assert (facts.run_link, facts.state_there) == (None, False)
    os.mkdir(layout.state)
    facts = read_facts(t, layout, ())
    assert facts.state_there and facts.to_dict() == read_facts(t, LY.HostLayout(layout.root), ()).to_dict()
    before = t.stats.commands
    LY.check_state_dir(t, layout, facts)
    assert t.stats.commands == before  # no read: the facts said
    assert read_facts(t, LY.HostLayout(layout.root), ()).state_there is None


def _refused(path: str) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


def test_an_unreadable_state_dir_is_not_known_and_the_services_are_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state dir's lstat, in the facts' first batch, answers an error (under a directory the
    login user cannot search): read_facts reads it as not known, never raising where main did not,
    and reads the services' pid files past it; check_state_dir then reads for itself and cannot tell."""
    t = LocalTransport("h")
    root = tmp_path / "h" / "root"
    LY.install_helper(t, LY.HostLayout(str(root)))  # run/ a directory in the root, as where ROOT.state was not made
    layout = LY.HostLayout(str(root), state=f"{root}.state")
    exe = Path(layout.release("pkg-a")) / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_bytes(Path("/bin/sleep").read_bytes())
    exe.chmod(0o755)
    pid, _ = services.start(t, layout, "llama-server", [str(exe), "30"])
    real = t.stat

    def lstat(path: str) -> FileStat | None:
        if path == layout.state:
            raise _refused(path)
        return real(path)

    try:
        assert read_facts(t, layout, ("llama-server", "ggml-rpc-server")).state_there is False
        monkeypatch.setattr(t, "stat", lstat)
        facts = read_facts(t, layout, ("llama-server", "ggml-rpc-server"))
        assert facts.running == {"llama-server": pid} and (facts.state_there, facts.run_link) == (None, None)
    finally:
        services.stop(t, layout, "llama-server")
    monkeypatch.setattr(t, "mount_flags", lambda path: ST_RDONLY)
    LY.check_state_dir(t, layout, facts)  # its own lstat of the state dir is refused too: cannot tell
    with pytest.raises(PermissionError):
        fs_batch(t, [Lstat(layout.state)])  # not soft: raised, as every other lstat of a batch


class _Answers:
    """paramiko's SFTP request layer answering each request number with a given (type, message)."""

    def __init__(self, answers: list[tuple[int, paramiko.Message]]) -> None:
        self.answers = answers

    def _read_response(self, waitfor: int | None = None) -> tuple[int, paramiko.Message]:
        assert waitfor is not None
        return self.answers[waitfor]


def _statvfs(*fields: int) -> paramiko.Message:
    m = paramiko.Message()
    for f in fields:
        m.add_int64(f)
    return paramiko.Message(m.asbytes())


def test_a_statvfs_answer_is_read_field_by_field() -> None:
    """OpenSSH's struct statvfs: 11 uint64 (bsize, frsize, blocks, bfree, bavail, files, ffree,
    favail, fsid, flag, namemax); the flag is the tenth. An answer of another type (a STATUS OK
    that paramiko passes through) reads as unsupported, not as zeros."""
    from paramiko import sftp as S

    fields = (4096, 1024, 10**6, 5 * 10**5, 4 * 10**5 + 1, 7, 8, 9, 0xDEAD, ST_RDONLY | 0x1000, 255)
    ok = paramiko.Message()
    ok.add_int(S.SFTP_OK)
    sftp = _Answers(
        [(S.CMD_EXTENDED_REPLY, _statvfs(*fields)), (S.CMD_EXTENDED_REPLY, _statvfs(*fields)), (S.CMD_STATUS, ok)]
    )
    ops: list[FreeBytes | MountFlags] = [MountFlags("/x"), FreeBytes("/x"), MountFlags("/y")]
    out: list[FsResult] = [None] * 3
    ssh._first_answers(sftp, list(ops), [0, 1, 2], out)
    assert out[0] == ST_RDONLY | 0x1000 and out[1] == (4 * 10**5 + 1) * 1024
    assert isinstance(out[2], NotImplementedError)
