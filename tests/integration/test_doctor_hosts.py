"""Issue 42 item 4: `doctor --hosts` asks a real lab host (sshd on loopback) for every program
pairctl runs there, and names one that is missing with its package and use. The host lacks the
tool by its PATH: the check's own exec runs with PATH set to a folder holding every other tool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from orchestrator.hosts import tools
from orchestrator.ops.doctor import check_host_tools
from orchestrator.remote.command import Cmd
from orchestrator.remote.pool import TransportPool

pytestmark = pytest.mark.integration


class _OnPath:
    """The host's real SSH transport, each command run with PATH set to `path`."""

    def __init__(self, inner: Any, path: Path) -> None:
        self.inner, self.path = inner, path

    def run(self, cmd: Cmd, **kw: Any) -> Any:
        return self.inner.run(Cmd(cmd.argv, env=(("PATH", str(self.path)),)), **kw)


def test_doctor_names_a_tool_missing_on_a_lab_host(lab, tmp_path):
    inv = lab.inventory
    host = inv.pair("lab").native
    without = tmp_path / "bin"
    without.mkdir()
    for t in {t for g in tools.TOOL_GROUPS for t in g.tools} - {"setsid"}:
        if found := shutil.which(t):
            (without / t).symlink_to(found)
    tmp_path.chmod(0o755)
    with TransportPool(inv) as pool:
        t = pool.get(host)
        whole = check_host_tools(inv, {host: t})  # type: ignore[dict-item]
        cut = check_host_tools(inv, {host: _OnPath(t, without)})  # type: ignore[dict-item]
    assert whole[0].ok, whole
    f = cut[0]
    assert not f.ok and f.check == f"host_tools:{host}", f
    assert "missing setsid (util-linux: start each supervisor in its own session" in f.detail, f.detail
    assert f.fix == "apt-get install util-linux on the host"


def test_doctor_hosts_reports_each_lab_host(lab, cli):
    r = cli("--json", "doctor", "--hosts", "--no-inventory")  # --no-inventory: nothing to connect to
    assert not any(d["check"].startswith("host_tools:") for d in json.loads(r.stdout)), r.stdout[-2000:]
    r = cli("--json", "doctor", "--hosts")
    found = {d["check"]: d for d in json.loads(r.stdout) if d["check"].startswith("host_tools:")}
    assert set(found) == {f"host_tools:{h}" for h in lab.inventory.hosts}, r.stdout[-2000:]
    assert all(d["ok"] for d in found.values()), found
