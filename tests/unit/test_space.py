"""Issue 21 item 4: free space is measured before a change needs it (pure parser; a real `df`
on a local directory; leftovers of killed uploads found and removed)."""

from __future__ import annotations

import os

import pytest

from orchestrator.errors import HostError
from orchestrator.hosts import space
from orchestrator.hosts.layout import HostLayout, install_helper
from orchestrator.hosts.release import discard_leftovers, leftovers
from orchestrator.remote.local import LocalTransport

DF = """Filesystem     1024-blocks  Used Available Capacity Mounted on
pairctl-faults       81920 81908        12     100% /work/.state/x/faults/native-root
"""


def test_parse_df_and_refusal_names_host_path_free_and_needed() -> None:
    s = space.parse_df(DF, "faults-native", "/r/releases")
    assert s.free_bytes == 12 * 1024
    with pytest.raises(space.NoSpace) as ei:
        s.require(20 * space.MIB, "the upload of pkg-a")
    msg = str(ei.value)
    assert msg.startswith("no space left on faults-native:/r/releases for the upload of pkg-a")
    assert "0.0 MiB free, 20.0 MiB needed; nothing was changed" in msg
    assert ei.value.nothing_changed and ei.value.exit_code == 6  # README: host state, not an unreachable host
    s.require(1024, "a tiny file")  # enough: no error
    with pytest.raises(HostError, match="cannot read free space"):
        space.parse_df("garbage", "h", "/p")


def test_free_space_of_a_real_directory(tmp_path) -> None:
    s = space.free_space(LocalTransport("h"), str(tmp_path))
    st = os.statvfs(tmp_path)
    assert abs(s.free_bytes - st.f_bavail * st.f_frsize) < 64 * space.MIB


def test_leftover_uploads_are_listed_and_discarded(tmp_path) -> None:
    t = LocalTransport("h")
    layout = HostLayout(str(tmp_path))
    install_helper(t, layout)
    for name in (".pkg-a.tmp-0badc0de", ".pkg-b.tmp-12345678", "pkg-c"):
        os.makedirs(os.path.join(layout.releases, name, "bin"))
    assert leftovers(t, layout) == [".pkg-a.tmp-0badc0de", ".pkg-b.tmp-12345678"]
    assert discard_leftovers(t, layout) == [".pkg-a.tmp-0badc0de", ".pkg-b.tmp-12345678"]
    assert sorted(os.listdir(layout.releases)) == ["pkg-c"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only bind: needs root")
def test_an_upload_into_a_read_only_root_names_the_path_not_tar(tmp_path) -> None:
    """Issue 49 item 1: the RPC root remounted read-only at upload ended in exit 4 with only
    `tar: Exiting with failure status`. A real read-only bind mount over releases/: the upload is
    refused (exit 6, nothing changed) naming host and path."""
    import hashlib
    import subprocess
    from types import SimpleNamespace

    from orchestrator.hosts.release import ensure_release

    t = LocalTransport("rpc-host")
    layout = HostLayout(str(tmp_path / "root"))
    install_helper(t, layout)
    pkg = tmp_path / "pkg"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "bin" / "ggml-rpc-server").write_bytes(b"\x7fELF")
    files = {"bin/ggml-rpc-server": {"sha256": hashlib.sha256(b"\x7fELF").hexdigest()}}
    package = SimpleNamespace(manifest=SimpleNamespace(id="pkg-ro", files=files), path=pkg)
    subprocess.run(["mount", "--bind", layout.releases, layout.releases], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", layout.releases], check=True)
        with pytest.raises(space.NotWritable) as ei:
            ensure_release(t, layout, package, False, "rpc-host")
    finally:
        subprocess.run(["umount", "-l", layout.releases], check=True)
    msg = ei.value.message
    assert ei.value.exit_code == 6 and f"{layout.releases} does not take a new file" in msg, msg
    assert "rpc-host" in msg and "nothing was changed" in msg and "Exiting with failure" not in msg
    assert os.listdir(layout.releases) == []
