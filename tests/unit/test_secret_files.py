"""Issue 16 item 10: the API key's file on a host is 0600 from its first byte, secrets/ is 0700
after every deploy, and a symlinked secrets/ is refused. Through the real LocalTransport (the
GPU inventory's transport); the SSH transport's put_private is exercised by the lab e2e tests."""

from __future__ import annotations

import os
import stat

import pytest

from orchestrator.errors import HostError
from orchestrator.hosts.layout import HostLayout, put_secret
from orchestrator.remote.local import LocalTransport


class Watching(LocalTransport):
    """Records the mode of the temporary file the moment it exists (before any chmod could run)."""

    seen: list[int]

    def rename(self, src: str, dst: str) -> None:
        self.seen.append(stat.S_IMODE(os.lstat(src).st_mode))
        super().rename(src, dst)


@pytest.fixture
def open_umask():
    old = os.umask(0)  # the worst case: nothing masks a careless mode
    yield
    os.umask(old)


def test_key_file_created_0600_and_secrets_tightened(tmp_path, open_umask, monkeypatch):
    chmodded: list[str] = []
    real_chmod = os.chmod

    def chmod(path, mode, **kw):
        chmodded.append(str(path))
        real_chmod(path, mode, **kw)

    monkeypatch.setattr(os, "chmod", chmod)
    layout = HostLayout(str(tmp_path / "root"))
    os.makedirs(layout.secrets, mode=0o755)
    os.chmod(layout.secrets, 0o755)
    t = Watching()
    t.seen = []
    dest = put_secret(t, layout, b"sk-123\n")
    assert t.seen == [0o600]
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600 and open(dest, "rb").read() == b"sk-123\n"
    assert stat.S_IMODE(os.stat(layout.secrets).st_mode) == 0o700
    assert not [p for p in chmodded if "api-key" in p], "the key file was chmodded after it was created"
    # a temporary file left by an interrupted deploy (0644, holding an old key) does not survive
    with open(os.path.join(layout.secrets, ".api-key.tmp"), "wb") as f:
        f.write(b"old")
    os.chmod(layout.secrets, 0o777)
    put_secret(t, layout, b"sk-456\n")
    assert t.seen[-1] == 0o600 and stat.S_IMODE(os.stat(layout.secrets).st_mode) == 0o700


def test_put_private_is_exclusive(tmp_path):
    t = LocalTransport()
    p = tmp_path / "f"
    p.write_bytes(b"x")
    with pytest.raises(HostError):
        t.put_private(b"secret", str(p))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HostError):
        t.put_private(b"secret", str(link))
    assert not (tmp_path / "elsewhere").exists()


def test_symlinked_secrets_dir_refused(tmp_path):
    layout = HostLayout(str(tmp_path / "root"))
    os.makedirs(layout.root)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", layout.secrets)
    with pytest.raises(HostError, match="not a directory"):
        put_secret(LocalTransport(), layout, b"k\n")
    assert list((tmp_path / "elsewhere").iterdir()) == []
