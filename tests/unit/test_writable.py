"""Whether the login user can make a state dir, decided from SFTP facts alone (hosts/writable.py),
and the deploy's check built on it (layout.check_state_dir), which must say what the real run's
mkdir refusal says (issue 49: a dry run printed a plan the real run refused).

Mounts and credentials are in the shape the kernel writes them (/proc/self/mounts with its octal
escapes, /proc/self/status); the check runs on a LocalTransport over a real temporary root."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from orchestrator.errors import HostStateError
from orchestrator.hosts import layout as LY
from orchestrator.hosts.writable import (
    DENIED,
    READ_ONLY,
    Creds,
    Mount,
    ancestors,
    mount_of,
    parse_creds,
    parse_mounts,
    why_not_made,
)
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.transport import FileStat, FsResult

MOUNTS = rb"""/dev/vda / ext4 rw,relatime,discard 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/vdb /srv/my\040disk ext4 rw,relatime 0 0
/dev/vdb /srv/my\040disk ext4 ro,relatime 0 0
/dev/vdb /srv/my\040disk/root ext4 rw,relatime 0 0
/dev/vdc /mnt/a ext4 ro,relatime 0 0
/dev/vdd /mnt/tab\011back\134slash\012nl xfs ro 0 0
/dev/vde /mnt/caf\303\251 btrfs rw 0 0
"""

# /proc/self/status of an sftp-server run by uid 1000 (real, effective, saved, filesystem)
STATUS = b"""Name:\tsftp-server
Umask:\t0022
State:\tR (running)
Tgid:\t4242
Uid:\t1000\t1000\t1000\t1000
Gid:\t1000\t1000\t1000\t1000
FDSize:\t64
Groups:\t4 27 1000 1001
NStgid:\t4242
"""


def test_mounts_are_read_with_their_octal_escapes() -> None:
    mounts = parse_mounts(MOUNTS)
    points = [m.point for m in mounts]
    assert "/srv/my disk" in points and "/mnt/tab\tback\\slash\nnl" in points and "/mnt/café" in points
    assert [m.read_only for m in mounts if m.point == "/srv/my disk"] == [False, True]
    assert parse_mounts(b"short line\nnot a mount line\n\n") == []


def _on(mounts: list[Mount], path: str) -> Mount:
    m = mount_of(mounts, path)
    assert m is not None
    return m


def test_the_mount_of_a_path_is_the_longest_point_holding_it_and_the_last_listed() -> None:
    mounts = parse_mounts(MOUNTS)
    assert _on(mounts, "/srv/my disk/root.state").read_only  # the ro bind listed after the rw one
    assert not _on(mounts, "/srv/my disk/root/run").read_only  # re-bound rw beneath it
    assert _on(mounts, "/srv/my disk/").options[0] == "ro"
    assert _on(mounts, "/mnt/ab").point == "/"  # /mnt/a does not hold it
    assert _on(mounts, "/mnt/a/x").read_only and _on(mounts, "/mnt/café/x").fstype == "btrfs"
    assert _on(mounts, "/").point == "/" and mount_of([], "/x") is None


def test_credentials_are_the_filesystem_ids_and_every_group() -> None:
    assert parse_creds(STATUS) == Creds(1000, frozenset({4, 27, 1000, 1001}))
    fs_uid = STATUS.replace(b"Uid:\t1000\t1000\t1000\t1000", b"Uid:\t1000\t1000\t1000\t0")
    assert parse_creds(fs_uid) == Creds(0, frozenset({4, 27, 1000, 1001}))
    no_groups = STATUS.replace(b"Groups:\t4 27 1000 1001", b"Groups:\t")
    assert parse_creds(no_groups) == Creds(1000, frozenset({1000}))
    assert parse_creds(b"Name:\tx\nUid:\t1000\n") is None and parse_creds(b"") is None


def _dir(mode: int, uid: int = 0, gid: int | None = 0) -> FileStat:
    return FileStat(mode=stat.S_IFDIR | mode, size=4096, mtime=0.0, uid=uid, gid=gid)


def _chain(parent: FsResult, *above: FsResult) -> list[tuple[str, FsResult]]:
    """/srv/h/root.state (missing), /srv/h (PARENT), then /srv and / (ABOVE, else root's 0755)."""
    rest = above or (_dir(0o755), _dir(0o755))
    return list(zip(ancestors("/srv/h/root.state"), (None, parent, *rest), strict=True))


USER = Creds(1000, frozenset({1000, 27}))
ROOT = Creds(0, frozenset({0}))
RW = parse_mounts(b"/dev/vda / ext4 rw 0 0\n")
RO = parse_mounts(b"/dev/vda / ext4 rw 0 0\n/dev/vda /srv/h ext4 ro 0 0\n")


@pytest.mark.parametrize(
    ("parent", "creds", "mounts", "why"),
    [
        (_dir(0o755, uid=1000), USER, RW, None),  # the user's own
        (_dir(0o555, uid=1000), USER, RW, DENIED),  # the user's, not writable by its owner
        (_dir(0o755), USER, RW, DENIED),  # root's 0755: the user is "other"
        (_dir(0o775, gid=27), USER, RW, None),  # a group the user is in, group-writable
        (_dir(0o755, gid=27), USER, RW, DENIED),  # that group, not group-writable
        (_dir(0o775, gid=50), USER, RW, DENIED),  # group-writable by a group the user is not in
        (_dir(0o077, uid=1000, gid=27), USER, RW, DENIED),  # the owner's bits decide for the owner
        (_dir(0o1777), USER, RW, None),  # world-writable (sticky: the new dir is the user's)
        (_dir(0o733), USER, RW, None),  # write and search, no read: mkdir needs no more
        (_dir(0o766), USER, RW, DENIED),  # write without search
        (_dir(0o755, uid=1000), USER, RO, READ_ONLY),  # a read-only mount, whoever writes
        (_dir(0o555), ROOT, RW, None),  # root writes anywhere by mode
        (_dir(0o755), ROOT, RO, READ_ONLY),  # but not on a read-only mount
        (_dir(0o755, gid=None), USER, RW, None),  # no group said: cannot tell
        (_dir(0o755), None, RW, None),  # no credentials: cannot tell by mode
        (_dir(0o755), None, RO, READ_ONLY),  # the mount still says
        (_dir(0o755), USER, None, DENIED),  # no mounts: the mode still says
        (FileStat(stat.S_IFLNK | 0o777, 8, 0.0, 0, 0), USER, RW, None),  # a link: its target not stat'ed
        (PermissionError(errno.EACCES, "denied"), USER, RW, None),  # an unreadable answer
    ],
)
def test_why_a_directory_cannot_be_made(
    parent: FsResult, creds: Creds | None, mounts: list[Mount] | None, why: str | None
) -> None:
    assert why_not_made(_chain(parent), creds, mounts) == why


def test_the_nearest_existing_directory_decides_and_an_existing_one_is_never_refused() -> None:
    missing_parent = _chain(None, _dir(0o755), _dir(0o755))  # /srv/h missing too: /srv is where mkdir starts
    assert why_not_made(missing_parent, USER, RW) == DENIED
    assert why_not_made(_chain(None, _dir(0o755, uid=1000), _dir(0o755)), USER, RW) is None
    there = [(p, _dir(0o555)) for p in ancestors("/srv/h/root.state")]
    assert why_not_made(there, USER, RO) is None  # it exists: as it is today
    assert why_not_made([(p, None) for p in ancestors("/srv/h/root.state")], USER, RW) is None
    assert ancestors("/srv/h/root.state/") == ["/srv/h/root.state", "/srv/h", "/srv", "/"]


def _host_says(
    monkeypatch: pytest.MonkeyPatch, t: LocalTransport, status: bytes, mounts: bytes, flags: int | None = None
) -> None:
    """The host's /proc/self files as T reads them (the test runs as root: the host's user need not),
    and its statvfs f_flag: FLAGS, or (None) an SFTP server without statvfs@openssh.com, which
    answers "unsupported" (the mounts then decide)."""
    real = t.read_bytes

    def read(path: str, max_bytes: int | None = None) -> bytes:
        return {"/proc/self/status": status, "/proc/self/mounts": mounts}.get(path) or real(path, max_bytes)

    def mount_flags(path: str) -> int:
        if flags is None:
            raise OSError(errno.EOPNOTSUPP, "Operation unsupported")
        os.stat(path)  # a missing path: its error, as the server answers
        return flags

    monkeypatch.setattr(t, "read_bytes", read)
    monkeypatch.setattr(t, "mount_flags", mount_flags)


def _host(tmp_path: Path) -> tuple[LocalTransport, LY.HostLayout]:
    """A root whose run/ is a directory in it and whose ROOT.state is not there (the lab's shape of
    a parent that was not writable when run/ was made); the parent root's own, 0755."""
    parent = tmp_path / "h"
    (parent / "root" / "run").mkdir(parents=True)
    os.chmod(parent, 0o755)
    return LocalTransport("h"), LY.HostLayout(str(parent / "root"), state=str(parent / "root.state"))


RW_HOST = b"/dev/vda / ext4 rw 0 0\n"
NO_UID = STATUS.replace(b"Uid:\t1000\t1000\t1000\t1000\n", b"")
AS_ROOT = STATUS.replace(b"Uid:\t1000\t1000\t1000\t1000", b"Uid:\t0\t0\t0\t0")


def test_the_deploys_check_says_what_the_real_mkdir_refusal_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_state_dir (a dry run, and a deploy before its first change) refuses with the very
    message the real run's failed mkdir gives (_link_run, strict): one function makes both."""
    t, layout = _host(tmp_path)  # root's 0755: the login user 1000 is "other"
    _host_says(monkeypatch, t, STATUS, RW_HOST)
    with pytest.raises(HostStateError) as predicted:
        LY.check_state_dir(t, layout)
    real = t.makedirs

    def refused(path: str, mode: int = 0o755) -> None:  # what that user's mkdir answers
        if path == layout.state:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        real(path, mode)

    monkeypatch.setattr(t, "makedirs", refused)
    with pytest.raises(HostStateError) as made:
        LY.install_helper(t, layout, strict=True)
    assert str(predicted.value) == str(made.value)
    assert predicted.value.exit_code == 6 and "\n" not in predicted.value.message
    assert f"h: {layout.state} cannot be made (Permission denied)" in predicted.value.message
    assert "hosts.h.state_dir" in (predicted.value.hint or "")


def test_a_read_only_mount_is_refused_even_to_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t, layout = _host(tmp_path)
    ro = f"/dev/vda / ext4 rw 0 0\n/dev/vda {tmp_path}/h ext4 ro 0 0\n/dev/vda {layout.root} ext4 rw 0 0\n"
    _host_says(monkeypatch, t, AS_ROOT, ro.encode())
    with pytest.raises(HostStateError, match=r"cannot be made \(Read-only file system\)"):
        LY.check_state_dir(t, layout)
    assert sorted(os.listdir(tmp_path / "h")) == ["root"]  # nothing written


@pytest.mark.parametrize(("status", "mounts"), [(AS_ROOT, RW_HOST), (b"unreadable", b""), (NO_UID, b"")])
def test_root_a_writable_parent_or_facts_not_read_refuse_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: bytes, mounts: bytes
) -> None:
    """Root by mode; and where the host's credentials cannot be read, the real mkdir decides."""
    t, layout = _host(tmp_path)
    os.chmod(tmp_path / "h", 0o555)
    try:
        _host_says(monkeypatch, t, status, mounts)
        LY.check_state_dir(t, layout)
    finally:
        os.chmod(tmp_path / "h", 0o755)
    t2, layout2 = _host(tmp_path / "w")
    os.chown(tmp_path / "w" / "h", 1000, 1000)
    _host_says(monkeypatch, t2, STATUS, RW_HOST)
    LY.check_state_dir(t2, layout2)  # the login user's own parent
    assert sorted(os.listdir(tmp_path / "h")) == ["root"]


def test_a_state_dir_that_exists_or_is_linked_or_named_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, layout = _host(tmp_path)
    _host_says(monkeypatch, t, STATUS, b"/dev/vda / ext4 ro 0 0\n")  # would refuse anything to make
    assert layout.state is not None
    os.mkdir(layout.state)
    LY.check_state_dir(t, layout)  # there: as today
    os.rmdir(layout.state)
    os.rmdir(Path(layout.root) / "run")
    os.symlink(layout.state, Path(layout.root) / "run")
    LY.check_state_dir(t, layout)  # run/ is the link already: prepare makes nothing
    os.remove(Path(layout.root) / "run")
    LY.check_state_dir(t, LY.HostLayout(layout.root, state=str(tmp_path / "elsewhere")))  # named: its mkdir says
    LY.check_state_dir(t, LY.HostLayout(layout.root))  # no state dir at all


# -- the reviewer's cases: each a false refusal, or an internal error, before the fix -------------------


def test_a_mount_point_holding_a_byte_that_str_splits_at_is_read_whole() -> None:
    """'ą' is UTF-8 c4 85, and 0x85 is a line break to str.splitlines on latin-1 text (0xa0, 0x0b
    are whitespace to str.split): the point was cut and the path judged by its parent's mount."""
    mounts = parse_mounts(b"/dev/vda / ext4 ro 0 0\n/dev/vdb /srv/\xc4\x85\xc2\xa0x\x0by tmpfs rw 0 0\n")
    assert [m.point for m in mounts] == ["/", "/srv/\u0105\u00a0x\x0by"]
    on = _on(mounts, "/srv/\u0105\u00a0x\x0by/root.state")
    assert on.fstype == "tmpfs" and not on.read_only


def test_fs_type_reads_a_point_holding_0x85(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = LocalTransport("h")
    _host_says(monkeypatch, t, STATUS, "/dev/vda / ext4 rw 0 0\ntmpfs /srv/\u0105 tmpfs rw 0 0\n".encode())
    assert LY.fs_type(t, "/srv/\u0105/root.state") == "tmpfs"  # the tmpfs warning's fact


def test_a_later_mount_over_a_path_hides_the_mounts_beneath_it() -> None:
    """`/srv` mounted after `/srv/data` hides it: the path is on /srv's mount, not the longest point."""
    mounts = parse_mounts(b"/dev/a / ext4 rw 0 0\n/dev/b /srv/data ext4 ro 0 0\n/dev/c /srv ext4 rw 0 0\n")
    assert _on(mounts, "/srv/data/root.state").point == "/srv" and not _on(mounts, "/srv/data/x").read_only
    again = parse_mounts(b"/dev/a / ext4 rw 0 0\n/dev/c /srv ext4 rw 0 0\n/dev/b /srv/data ext4 ro 0 0\n")
    assert _on(again, "/srv/data/x").read_only  # mounted after /srv: seen
    assert not _on(again, "/srv/database").read_only  # /srv/data does not hold /srv/database
    assert why_not_made(_chain(_dir(0o755, uid=1000)), USER, RO) == READ_ONLY
    over = parse_mounts(b"/dev/a / ext4 rw 0 0\n/dev/b /srv/h ext4 ro 0 0\n/dev/c /srv ext4 rw 0 0\n")
    assert why_not_made(_chain(_dir(0o755, uid=1000)), USER, over) is None


def test_an_escape_past_one_byte_is_no_escape_and_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """\\400-\\777 is no byte: it stays as written (it raised UnicodeEncodeError, mid-prepare from fs_type)."""
    mounts = parse_mounts(b"/dev/a / ext4 rw 0 0\n/dev/b /mnt/x\\777y\\101 xfs rw 0 0\n")
    assert mounts[1].point == "/mnt/x\\777yA"
    t = LocalTransport("h")
    _host_says(monkeypatch, t, STATUS, b"/dev/b /mnt/\\400 xfs rw 0 0\n/dev/a / ext4 rw 0 0\n")
    assert LY.fs_type(t, "/mnt/x") == "ext4"


@pytest.mark.parametrize("at", [1, 2])
def test_a_link_or_a_file_at_or_above_the_nearest_directory_is_not_judged(at: int) -> None:
    """lstat of what lies below a link follows it: a chain with a link at /srv/h (the nearest) or
    /srv above it says nothing of where mkdir lands (no refusal); so for a file."""
    link = FileStat(stat.S_IFLNK | 0o777, 8, 0.0, 0, 0)
    plain = FileStat(stat.S_IFREG | 0o644, 8, 0.0, 0, 0)
    for odd in (link, plain):
        rest: list[FsResult] = [_dir(0o555), _dir(0o555), _dir(0o555)]
        rest[at - 1] = odd
        assert why_not_made(_chain(*rest), USER, RO) is None
    missing_under_a_link = _chain(None, link, _dir(0o755))  # /srv/h missing, /srv a link
    assert why_not_made(missing_under_a_link, USER, RO) is None


def test_cap_dac_override_passes_the_mode_bits_not_a_read_only_mount() -> None:
    cap = STATUS + b"CapEff:\t0000000000000002\n"
    assert parse_creds(cap) == Creds(1000, frozenset({4, 27, 1000, 1001}), dac_override=True)
    assert parse_creds(STATUS + b"CapEff:\t000001ffffffffff\n") == parse_creds(cap)
    assert parse_creds(STATUS + b"CapEff:\t0000000000000001\n") == parse_creds(STATUS)  # CAP_CHOWN only
    assert parse_creds(STATUS + b"CapEff:\tzz\n") is None
    dac = Creds(1000, frozenset({1000}), dac_override=True)
    assert why_not_made(_chain(_dir(0o555)), dac, RW) is None
    assert why_not_made(_chain(_dir(0o755)), dac, RO) == READ_ONLY


def test_the_kernels_statvfs_flag_decides_read_only_before_the_mounts_table() -> None:
    assert why_not_made(_chain(_dir(0o755, uid=1000)), USER, RW, flags=1) == READ_ONLY
    assert why_not_made(_chain(_dir(0o755, uid=1000)), USER, RO, flags=0x1000) is None  # ST_RELATIME only
    unsupported = OSError(errno.EOPNOTSUPP, "Operation unsupported")
    assert why_not_made(_chain(_dir(0o755, uid=1000)), USER, RO, flags=unsupported) == READ_ONLY


def test_statvfs_of_the_nearest_directory_refuses_without_reading_the_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, layout = _host(tmp_path)
    _host_says(monkeypatch, t, AS_ROOT, b"", flags=1)  # no mounts table to read: the kernel said
    with pytest.raises(HostStateError, match=r"cannot be made \(Read-only file system\)"):
        LY.check_state_dir(t, layout)
    _host_says(monkeypatch, t, AS_ROOT, b"/dev/vda / ext4 ro 0 0\n", flags=0)
    LY.check_state_dir(t, layout)  # the kernel's rw wins over a table that says ro


def test_the_facts_batch_carries_run_and_the_state_dir_so_the_usual_host_pays_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_facts reads run/'s link and the state dir in its own batch; check_state_dir given those
    facts reads nothing more where the state dir is there or run/ is its link."""
    from orchestrator.hosts.probes import read_facts

    t, layout = _host(tmp_path)
    assert layout.state is not None
    _host_says(monkeypatch, t, STATUS, b"/dev/vda / ext4 ro 0 0\n")
    facts = read_facts(t, layout, ())
    assert (facts.run_link, facts.state_there) == (None, False)
    os.mkdir(layout.state)
    facts = read_facts(t, layout, ())
    assert facts.state_there and facts.to_dict() == read_facts(t, LY.HostLayout(layout.root), ()).to_dict()
    before = t.stats.commands
    LY.check_state_dir(t, layout, facts)
    assert t.stats.commands == before  # no read: the facts said
    os.rmdir(layout.state)
    with pytest.raises(HostStateError):  # missing again: the facts say so, and its parent is root's 0755
        LY.check_state_dir(t, layout, read_facts(t, layout, ()))
    assert read_facts(t, LY.HostLayout(layout.root), ()).state_there is None
