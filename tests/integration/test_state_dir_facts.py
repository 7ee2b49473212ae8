"""The deploy's prediction of a state dir that cannot be made (layout.check_state_dir, from SFTP
facts only) against what the real mkdir answers (layout._link_run, strict), over the lab's REAL
sshd: a writable parent (no refusal, and the mkdir works) and a read-only bind-mounted parent (both
refuse, naming the state dir and state_dir in the inventory, in the same words but for the why:
sftp-server says no errno). The unit tests build the "real"
refusal from os.strerror, the local transport's shape; here sftp-server answers it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import HostStateError
from orchestrator.hosts import layout as LY
from orchestrator.hosts.writable import ST_RDONLY
from orchestrator.remote.transport import MountFlags, fs_batch

pytestmark = pytest.mark.integration

HOST = "lab-native"


def _host(tmp_path: Path) -> tuple[Path, LY.HostLayout]:
    """A root whose run/ is a directory in it, ROOT.state not there (the lab's hosts share this
    machine's filesystem, and log in as root)."""
    parent = tmp_path / "h"
    (parent / "root" / "run").mkdir(parents=True)
    return parent, LY.HostLayout(str(parent / "root"), state=str(parent / "root.state"))


def test_a_writable_parent_is_not_refused_and_its_mkdir_works(t, tmp_path) -> None:
    parent, layout = _host(tmp_path)
    assert layout.state is not None
    (flags,) = fs_batch(t, [MountFlags(str(parent))])
    assert isinstance(flags, int) and not flags & ST_RDONLY  # the lab's sshd has statvfs@openssh.com
    LY.check_state_dir(t, layout)
    LY._link_run(t, layout, layout.state, strict=True)
    assert os.readlink(layout.run) == layout.state and Path(layout.state).is_dir()
    LY.check_state_dir(t, layout)  # linked: nothing to judge


def test_a_read_only_parent_is_refused_as_its_mkdir_is(t, tmp_path) -> None:
    parent, layout = _host(tmp_path)
    assert layout.state is not None
    try:
        subprocess.run(["mount", "--bind", str(parent), str(parent)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no bind mount here: {exc}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(parent)], check=True)
        (flags,) = fs_batch(t, [MountFlags(str(parent))])
        with pytest.raises(HostStateError) as predicted:
            LY.check_state_dir(t, layout)
        with pytest.raises(HostStateError) as made:
            LY._link_run(t, layout, layout.state, strict=True)
    finally:
        subprocess.run(["umount", "-l", str(parent)], check=True)
    assert isinstance(flags, int) and flags & ST_RDONLY
    said, real = predicted.value, made.value
    assert said.exit_code == real.exit_code == 6 and said.hint == real.hint
    assert said.message.startswith(f"{HOST}: {layout.state} cannot be made (Read-only file system)"), said.message
    # the same refusal but for the why: OpenSSH's sftp-server answers EROFS with a bare "Failure"
    # (no errno), which the real refusal quotes whole; the prediction says what the kernel's flag says
    head, tail = said.message.split(" (Read-only file system)")
    assert real.message.startswith(head + " (") and real.message.endswith(tail), real.message
    assert "says only 'Failure'" in real.message
    assert not Path(layout.state).exists() and (parent / "root" / "run").is_dir()
