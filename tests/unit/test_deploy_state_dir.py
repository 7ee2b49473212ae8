"""The deploy's refusal of a default state dir that cannot be made (engine/deploy._refuse_unmade_state):
both hosts judged, one error naming each refused host (a single one's in the real mkdir refusal's
own words), recorded as prepare's failure with its problems beside route_trust's."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.engine import deploy as D
from orchestrator.engine.route_trust import Judgement, Problem
from orchestrator.engine.runner import StepFailed
from orchestrator.errors import HostStateError
from orchestrator.hosts import layout as LY
from orchestrator.remote.local import LocalTransport

STATUS = b"Uid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nGroups:\t1000\n"


class _Journal:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> None:
        self.fields[key] = value


def _ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writable: set[str]) -> Any:
    """Two hosts on this machine, each a root whose run/ is a directory and whose ROOT.state is
    missing; the login user 1000, whose own parent the writable roles' is (root's 0755 else)."""
    hosts = {"native": "n1", "rpc": "r1"}
    ts, layouts = {}, {}
    for role, name in hosts.items():
        parent = tmp_path / name
        (parent / "root" / "run").mkdir(parents=True)
        os.chown(parent, 1000 if role in writable else 0, 0)
        t = LocalTransport(name)
        real = t.read_bytes

        def read(path: str, max_bytes: int | None = None, real: Any = real) -> bytes:
            return STATUS if path == "/proc/self/status" else bytes(real(path, max_bytes))

        monkeypatch.setattr(t, "read_bytes", read)
        ts[role], layouts[role] = t, LY.HostLayout(str(parent / "root"), state=str(parent / "root.state"))
    return SimpleNamespace(
        t=ts.__getitem__,
        layout=layouts.__getitem__,
        host=hosts.__getitem__,
        hosts=SimpleNamespace(facts={}),
        journal=_Journal(),
    )


def test_both_hosts_are_judged_and_one_error_names_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(tmp_path, monkeypatch, writable=set())
    step = SimpleNamespace(name="prepare", action="prepare")
    route = Judgement(None, [Problem("switched", "r1: current left switched", "run deploy")])
    with pytest.raises(StepFailed) as got:
        D._refuse_unmade_state(ctx, route, step)
    err = got.value.cause
    assert isinstance(err, HostStateError) and err.exit_code == 6 and "\n" not in err.message
    assert list(got.value.errors) == ["n1", "r1"] and got.value.step is step
    assert err.message.startswith("n1: ") and "; r1: " in err.message and err.message.count("cannot be made") == 2
    assert "hosts.n1.state_dir" in (err.hint or "") and "hosts.r1.state_dir" in (err.hint or "")
    assert "step 'prepare' failed" in got.value.message  # what the journal's abort note says
    rows = ctx.journal.fields["host_state_problems"]
    assert [r["kind"] for r in rows] == ["switched", "state-dir", "state-dir"]


def test_one_refused_host_says_the_real_refusals_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(tmp_path, monkeypatch, writable={"native"})
    with pytest.raises(StepFailed) as got:
        D._refuse_unmade_state(ctx, Judgement(None), SimpleNamespace(name="prepare"))
    with pytest.raises(HostStateError) as alone:
        LY.check_state_dir(ctx.t("rpc"), ctx.layout("rpc"))
    assert got.value.cause is got.value.errors["r1"] and str(got.value.cause) == str(alone.value)
    ok = _ctx(tmp_path / "w", monkeypatch, writable={"native", "rpc"})
    D._refuse_unmade_state(ok, Judgement(None), SimpleNamespace(name="prepare"))
    assert ok.journal.fields == {}
