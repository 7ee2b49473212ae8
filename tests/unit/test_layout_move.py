"""An older layout (current/previous, route.json and leases/ in the install root itself) moved
into run/ (hosts/layout.py move_layout): under every leased command, with a host that is
untrusted input. LocalTransport on a temporary root: real mkdir/rename/symlink, no mocks."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.checks.live import read_route
from orchestrator.errors import HostStateError
from orchestrator.hosts import layout as LY
from orchestrator.hosts import leases as L
from orchestrator.hosts.probes import ProbeError, read_facts, release_of_link
from orchestrator.hosts.prune import link_protected
from orchestrator.remote.command import Cmd
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.ssh import host_file_error

ROUTE = b'{"not": "parsed here"}\n'


def _old_root(tmp_path: Path) -> tuple[LocalTransport, Path, str]:
    """A root as pairctl wrote it before run/: links relative, in the root, beside route.json."""
    root = tmp_path / "root"
    for rid in ("A", "B"):
        (root / "releases" / rid).mkdir(parents=True)
    os.symlink("releases/B", root / "current")
    os.symlink("releases/A", root / "previous")
    (root / "route.json").write_bytes(ROUTE)
    (root / "leases").mkdir(mode=0o700)
    return LocalTransport("h"), root, str(tmp_path / "root.state")


def test_every_leased_command_finds_an_older_layout_in_run(tmp_path: Path) -> None:
    """Bug 1: releases prune, receipts prune and accept read run/ only; under hold_pair_leases
    the older layout is moved there first, so prune protects ROOT/current's release."""
    t, root, state = _old_root(tmp_path)
    with L.hold_pair_leases([L.LeaseTarget(t, str(root), state)], owner="op@t", purpose="releases prune"):
        layout = LY.HostLayout(str(root))
        assert link_protected(t, layout) == {"B": "current", "A": "previous"}
        assert t.read_bytes(layout.route) == ROUTE
        with pytest.raises(HostStateError, match="does not parse"):  # found, not "never deployed"
            read_route(t, str(root))
        assert os.readlink(root / "run") == state and os.readlink(root / "leases") == "run/leases"
        assert os.readlink(root / "run" / "current") == str(root / "releases" / "B")
        assert L.lease_state(t, str(root)).state == "held"
    assert L.lease_state(t, str(root)).free
    assert sorted(os.listdir(root)) == ["leases", "releases", "run"]


def test_a_service_users_link_in_the_aside_dir_is_never_followed(tmp_path: Path) -> None:
    """Bug 2: run/home/SERVICE (the service user's) is swapped for a link to a directory outside
    between pairctl's look at it and its delete: what it points at is never touched."""
    t, root, state = _old_root(tmp_path)
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_text("keep me")
    (root / "run" / "home" / "svc").mkdir(parents=True)
    (real_stat, real_run) = (t.stat, t.run)

    def swap() -> None:  # the service user's move, racing pairctl
        for home in Path(root).glob(".run.old.tmp-*/home/svc"):
            if not home.is_symlink():
                home.rmdir()
                os.symlink(outside, home)

    def stat(path: str) -> object:
        st = real_stat(path)
        if path.endswith("/home/svc"):  # right after pairctl saw a directory there
            swap()
        return st

    def run(cmd: Cmd, **kw: object) -> object:
        swap()
        return real_run(cmd, **kw)

    t.stat, t.run = stat, run  # type: ignore[method-assign,assignment]
    with L.hold_pair_leases([L.LeaseTarget(t, str(root), state)], owner="op@t", purpose="x"):
        pass
    assert (outside / "passwd").read_text() == "keep me"
    assert not [n for n in os.listdir(root) if n.startswith(".")]  # the aside dir is gone


def test_a_leftover_that_cannot_be_removed_does_not_fail_the_move(tmp_path: Path) -> None:
    """Bug 2: cleanup is best-effort: an aside dir the host's rm fails on is left, the lease step
    goes on (and the next move retries it)."""
    t, root, state = _old_root(tmp_path)
    real = t.run

    def failing_rm(cmd: Cmd, **kw: object) -> object:
        if cmd.argv[0] == "rm":
            return real(Cmd(("sh", "-c", "echo 'rm: cannot remove: Operation not permitted' >&2; exit 1")), **kw)
        return real(cmd, **kw)

    t.run = failing_rm  # type: ignore[method-assign,assignment]
    with L.hold_pair_leases([L.LeaseTarget(t, str(root), state)], owner="op@t", purpose="x"):
        assert os.readlink(root / "leases") == "run/leases"
    assert [n for n in os.listdir(root) if n.startswith(".leases.old.tmp-")]
    t.run = real  # type: ignore[method-assign]
    layout = LY.HostLayout(str(root), state=state)
    assert not LY.move_layout(t, layout)  # the layout is new: two readlinks, nothing judged or listed
    LY.install_helper(t, layout)  # a deploy's: the leftover tried again
    assert not [n for n in os.listdir(root) if n.startswith(".")]


@pytest.mark.parametrize("where", ["run", "root"])
def test_a_bad_link_is_the_hosts_state_not_an_internal_error(tmp_path: Path, where: str) -> None:
    """Bug 3: a planted ROOT/current (or one in an older run/ directory) is HostStateError (exit 6)
    with the repair hint; nothing but the links current/previous is copied out of run/."""
    t, root, state = _old_root(tmp_path)
    (root / "run").mkdir()
    if where == "root":
        (root / "current").unlink()
        os.symlink("/etc", root / "current")
    else:
        os.symlink("/etc", root / "run" / "current")
    with pytest.raises(HostStateError, match="not a release pairctl installed") as err:
        LY.move_layout(t, LY.HostLayout(str(root), state=state))
    assert "run/current" in (err.value.hint or "")


def test_only_current_and_previous_links_are_carried_out_of_run(tmp_path: Path) -> None:
    t, root, state = _old_root(tmp_path)
    (root / "run").mkdir()
    os.symlink("/etc/shadow", root / "run" / "evil")
    os.symlink(str(root / "releases" / "A"), root / "run" / "previous")
    LY.move_layout(t, LY.HostLayout(str(root), state=state))
    assert not os.path.lexists(Path(state) / "evil")
    assert os.readlink(Path(state) / "previous") == str(root / "releases" / "A")


def test_another_runs_lease_in_run_leases_is_never_overwritten(tmp_path: Path) -> None:
    """Bug 4: run/leases/host.lock holding another nonce: LeaseLost, their lease.json untouched."""
    t, root, state = _old_root(tmp_path)
    L.take_lease(t, str(root), "op@t", "ours", 600)
    other = L.make_lease("h", "other@t", "theirs", 600).to_json()
    (Path(state) / "leases" / "host.lock").mkdir(parents=True)
    (Path(state) / "leases" / "host.lock" / "lease.json").write_bytes(other)
    os.symlink(state, root / "run")
    with pytest.raises(L.LeaseLost):
        LY.move_layout(t, LY.HostLayout(str(root), state=state))
    assert (Path(state) / "leases" / "host.lock" / "lease.json").read_bytes() == other


def test_a_lease_made_during_the_swap_is_lease_lost(tmp_path: Path) -> None:
    """Bug 4: ROOT/leases is missing between the rename aside and the rename in; another run's
    take_lease that makes a directory there wins, and this run learns it (LeaseLost)."""
    t, root, state = _old_root(tmp_path)
    L.take_lease(t, str(root), "op@t", "ours", 600)
    real = t.rename

    def racing(src: str, dst: str) -> None:
        real(src, dst)
        if ".leases.old.tmp-" in dst:
            L.take_lease(LocalTransport("h"), str(root), "other@t", "theirs", 600)

    t.rename = racing  # type: ignore[method-assign]
    with pytest.raises(L.LeaseLost):
        LY.move_layout(t, LY.HostLayout(str(root), state=state))
    assert L.read_lease(t, str(root)).owner == "other@t"  # theirs untouched


def test_run_links_are_absolute_only(tmp_path: Path) -> None:
    """Bug 6: a relative link in run/ (which may be a state dir elsewhere) names no release; the
    root's own (an older layout) still may be relative."""
    with pytest.raises(ProbeError):
        release_of_link("releases/A", "/r", absolute=True)
    assert release_of_link("/r/releases/A", "/r", absolute=True) == "A"
    assert release_of_link("releases/A", "/r") == "A"
    t, root, state = _old_root(tmp_path)
    (root / "run").mkdir()
    os.symlink("releases/A", root / "run" / "current")
    with pytest.raises(HostStateError, match="run/current") as err:
        read_facts(t, LY.HostLayout(str(root)), [])
    assert f"{root}/releases/ID {root}/run/current" in (err.value.hint or "")


def test_a_state_dir_on_tmpfs_is_warned_of(tmp_path: Path) -> None:
    """Bug 7: the state dir holds the links, the route record and the leases: on tmpfs a reboot
    loses them. The host's /proc/self/mounts (read over SFTP) names its file system."""
    assert LY.fs_type(LocalTransport("h"), "/dev/shm/pairctl") == "tmpfs"
    t, root, state = _old_root(tmp_path)
    real = t.read_bytes

    def mounts(path: str, max_bytes: int | None = None) -> bytes:  # the host says: tmp_path is a tmpfs
        if path == "/proc/self/mounts":
            return f"/dev/sda1 / ext4 rw 0 0\nnone {tmp_path} tmpfs rw 0 0\n".encode()
        return real(path, max_bytes)

    t.read_bytes = mounts  # type: ignore[method-assign]
    (root / "run").mkdir()
    with capture_logs() as logs:
        LY.move_layout(t, LY.HostLayout(str(root), state=state))
    assert [e for e in logs if "state_dir is on tmpfs" in e["event"] and e["log_level"] == "warning"], logs


_REFUSALS: dict[str, Callable[[str], OSError]] = {  # each in the shape its transport really raises it
    "local-permission": lambda p: PermissionError(errno.EACCES, "Permission denied", p),
    "local-read-only": lambda p: OSError(errno.EROFS, "Read-only file system", p),
    "ssh-permission": lambda p: host_file_error("h", "mkdir", p, PermissionError(errno.EACCES, "Permission denied")),
    "ssh-bare-failure": lambda p: host_file_error("h", "mkdir", p, OSError("Failure")),
}


@pytest.mark.parametrize("refusal", sorted(_REFUSALS))
def test_a_root_whose_state_dir_cannot_be_made_is_refused_by_a_deploy_only(tmp_path: Path, refusal: str) -> None:
    """Issue 49: where ROOT.state cannot be made (the root's parent is not the login user's),
    run/ stayed inside the root and a root turning read-only ended exit 8 with the lease held. A
    leased command that uploads nothing still runs there; a deploy's install_helper is refused
    before any change (exit 6), naming the path and state_dir as the fix. Over SSH the refusal is
    a HostError whose words say it (remote/ssh.py host_file_error); locally a raw OSError, where a
    read-only parent (EROFS) once ended a rollback in an internal error."""
    t, root, state = _old_root(tmp_path)
    real = t.makedirs

    def no_parent(path: str, mode: int = 0o755) -> None:  # the root's parent: not ours to write
        if path == state:
            raise _REFUSALS[refusal](path)
        real(path, mode)

    t.makedirs = no_parent  # type: ignore[method-assign]
    layout = LY.HostLayout(str(root), state=state)
    with L.hold_pair_leases([L.LeaseTarget(t, str(root), state)], owner="op@t", purpose="rollback"):
        assert os.path.isdir(root / "run") and not os.path.islink(root / "run")  # moved, in the root
        before = sorted(os.listdir(root))
        with pytest.raises(HostStateError, match=f"{state} cannot be made") as err:
            LY.install_helper(t, layout, strict=True)  # a deploy's prepare
        assert "hosts.h.state_dir" in (err.value.hint or "") and sorted(os.listdir(root)) == before
        LY.install_helper(t, layout)  # a rollback's, a stop's lease step: runs with run/ in the root
        assert os.path.isfile(layout.svc) and not os.path.islink(root / "run")
    assert L.lease_state(t, str(root)).free
