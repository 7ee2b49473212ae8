"""Issue 16, second adversarial pass, over the lab's REAL sshd: what a hostile host writes is read
only up to a bound (a command's output, a file that is a link to /dev/zero)."""

from __future__ import annotations

import os

import pytest

from orchestrator.errors import HostError
from orchestrator.remote.command import Cmd
from orchestrator.remote.transport import HOST_FILE_MAX, HOST_OUTPUT_MAX

pytestmark = pytest.mark.integration

HOST = "lab-native"


def test_a_command_that_floods_its_output_is_stopped_at_the_bound(t) -> None:
    """A login shell or helper printing without end was collected until pairctl ran out of memory."""
    with pytest.raises(HostError, match="more than") as exc:
        t.run(Cmd.of("head", "-c", str(HOST_OUTPUT_MAX + (4 << 20)), "/dev/zero"), timeout=120)
    assert HOST in str(exc.value)
    assert t.run(Cmd.of("true")).exit_status == 0  # the connection is still usable


def test_a_file_linked_to_dev_zero_is_read_only_up_to_the_bound(t, lab) -> None:
    root = lab.inventory.host(HOST).install_root
    link = f"{root}/.zero-{os.getpid()}"
    t.symlink("/dev/zero", link)
    try:
        assert len(t.read_bytes(link, max_bytes=HOST_FILE_MAX)) == HOST_FILE_MAX + 1
        assert (
            t.read_bytes(f"/proc/{os.getpid()}/cmdline", max_bytes=HOST_FILE_MAX)
            == open(f"/proc/{os.getpid()}/cmdline", "rb").read()
        )  # /proc files say size 0: read to their end all the same
    finally:
        t.remove(link)
