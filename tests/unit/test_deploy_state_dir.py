"""The deploy's refusal of a default state dir that cannot be made (engine/deploy._judge_before_prepare):
the route's judgement first (its refusal wins), then both hosts judged, one error naming each refused
host (a single one's in the real mkdir refusal's own words), recorded as prepare's failure with its
problems beside route_trust's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.engine import deploy as D
from orchestrator.engine import route_trust
from orchestrator.engine.route_trust import Judgement, Problem
from orchestrator.engine.runner import StepFailed
from orchestrator.errors import HostStateError
from orchestrator.hosts import layout as LY
from orchestrator.hosts.writable import ST_RDONLY
from orchestrator.remote.local import LocalTransport


class _Journal:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}

    def set(self, key: str, value: Any) -> None:
        self.fields[key] = value


def _ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writable: set[str], route: Judgement) -> Any:
    """Two hosts on this machine, each a root whose run/ is a directory and whose ROOT.state is
    missing; the parent's file system read-only (statvfs's flag) but for the WRITABLE roles'. The
    route's judgement: ROUTE."""
    hosts = {"native": "n1", "rpc": "r1"}
    ts, layouts = {}, {}
    for role, name in hosts.items():
        parent = tmp_path / name
        (parent / "root" / "run").mkdir(parents=True)
        t = LocalTransport(name)
        if role not in writable:
            real = t.mount_flags
            ro = str(parent)
            monkeypatch.setattr(t, "mount_flags", lambda p, real=real, ro=ro: ST_RDONLY if p == ro else real(p))
        ts[role], layouts[role] = t, LY.HostLayout(str(parent / "root"), state=str(parent / "root.state"))
    monkeypatch.setattr(route_trust, "judge", lambda *a, **k: route)
    return SimpleNamespace(
        t=ts.__getitem__,
        layout=layouts.__getitem__,
        host=hosts.__getitem__,
        hosts=SimpleNamespace(facts={}),
        journal=_Journal(),
        evidence=None,
        view=None,
        inputs=SimpleNamespace(route_key=b"k"),
        run_id="r",
    )


def test_both_hosts_are_judged_and_one_error_names_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    route = Judgement(None, [Problem("switched", "r1: current left switched", "run deploy")])  # allowed
    ctx = _ctx(tmp_path, monkeypatch, writable=set(), route=route)
    step = SimpleNamespace(name="prepare", action="prepare")
    with pytest.raises(StepFailed) as got:
        D._judge_before_prepare(ctx, step)
    err = got.value.cause
    assert isinstance(err, HostStateError) and err.exit_code == 6 and "\n" not in err.message
    assert list(got.value.errors) == ["n1", "r1"] and got.value.step is step
    assert err.message.startswith("n1: ") and "; r1: " in err.message and err.message.count("cannot be made") == 2
    assert "hosts.n1.state_dir" in (err.hint or "") and "hosts.r1.state_dir" in (err.hint or "")
    assert "step 'prepare' failed" in got.value.message  # what the journal's abort note says
    rows = ctx.journal.fields["host_state_problems"]
    assert [r["kind"] for r in rows] == ["switched", "state-dir", "state-dir"]


def test_one_refused_host_says_the_real_refusals_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _ctx(tmp_path, monkeypatch, writable={"native"}, route=Judgement(None))
    with pytest.raises(StepFailed) as got:
        D._judge_before_prepare(ctx, SimpleNamespace(name="prepare"))
    with pytest.raises(HostStateError) as alone:
        LY.check_state_dir(ctx.t("rpc"), ctx.layout("rpc"))
    assert got.value.cause is got.value.errors["r1"] and str(got.value.cause) == str(alone.value)
    ok = _ctx(tmp_path / "w", monkeypatch, writable={"native", "rpc"}, route=Judgement(None))
    assert D._judge_before_prepare(ok, SimpleNamespace(name="prepare")) == Judgement(None)
    assert ok.journal.fields == {}


def test_a_route_trust_refusal_wins_over_the_state_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both refuse: the route's refusal (a security signal) is the one raised, as deploy() calls it,
    and the state dirs are not judged (only route_trust's rows are recorded)."""
    route = Judgement(None, [Problem(route_trust.FORGED, "n1: route.json is forged", "run repair")])
    ctx = _ctx(tmp_path, monkeypatch, writable=set(), route=route)
    with pytest.raises(HostStateError) as got:
        D._judge_before_prepare(ctx, SimpleNamespace(name="prepare"))
    assert got.value.message.startswith("deploy refused, nothing was changed: n1: route.json is forged")
    assert [r["kind"] for r in ctx.journal.fields["host_state_problems"]] == [route_trust.FORGED]
    with pytest.raises(HostStateError, match="cannot be made"):  # the state dirs alone would refuse
        LY.check_state_dir(ctx.t("native"), ctx.layout("native"))
