"""The engine's failure rules, with the real journal (EvidenceStore in a temp dir) and plain
functions as step handlers: one journal step per playbook step, `continue` goes on, a failure
in a step that changes what runs marks the run changed (so deploy rolls back), and a failure
that reports it changed nothing (a release check before a stop) does not."""

from __future__ import annotations

import threading

import pytest

from orchestrator.engine.context import RunRecorder
from orchestrator.engine.plan import Step
from orchestrator.engine.runner import StepFailed, run_steps
from orchestrator.errors import CheckFailed
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.release import ReleaseMismatch


class Ctx:
    def __init__(self) -> None:
        self.recorder = RunRecorder()
        self.calls: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()


def step(name: str, action: str, role: str = "both", on_failure: str = "abort", changes: bool = False) -> Step:
    hosts = ("n", "r") if role == "both" else ("local",) if role == "local" else (role,)
    return Step(
        name=name, action=action, role=role, hosts=hosts, on_failure=on_failure, changes=changes, description=""
    )


def ok(ctx, role, step):
    with ctx.lock:
        ctx.calls.append(("ok", role))
    return {"role": role}


def boom(ctx, role, step):
    if role in (None, "rpc"):
        raise CheckFailed(f"{role}: broke")
    return {}


def mismatch(ctx, role, step):
    raise ReleaseMismatch("n: releases/x does not match its manifest")


@pytest.fixture
def journal(tmp_path):
    j = EvidenceStore(tmp_path / "ev").begin("test", argv=["t"], pair="p")
    yield j
    if not j.finished:
        j.finish("passed", "done")


HANDLERS = {"ok": ok, "boom": boom, "mismatch": mismatch}


def test_both_runs_each_host_and_journals_one_step(journal):
    ctx = Ctx()
    outs = run_steps([step("a", "ok"), step("b", "ok", "native", changes=True)], ctx, HANDLERS, journal=journal)
    assert [o.ok for o in outs] == [True, True] and sorted(ctx.calls) == [
        ("ok", "native"),
        ("ok", "native"),
        ("ok", "rpc"),
    ]
    assert ctx.recorder.changed
    names = [s.name for s in journal.state.steps.values()]
    assert names == ["a", "b"]
    first = next(iter(journal.state.steps.values()))
    assert first.data["n"] == {"role": "native"} and first.data["r"] == {"role": "rpc"} and first.host == "n,r"


def test_failure_raises_with_each_hosts_error_and_continue_goes_on(journal):
    ctx = Ctx()
    with pytest.raises(StepFailed) as ei:
        run_steps(
            [
                step("a", "boom", "both", "continue"),
                step("b", "boom", "both", "rollback", changes=True),
                step("c", "ok"),
            ],
            ctx,
            HANDLERS,
            journal=journal,
        )
    assert ei.value.step.name == "b" and list(ei.value.errors) == ["r"] and "rpc: broke" in ei.value.message
    assert ctx.recorder.changed  # b changes what runs: its failure means the pair may be half-changed
    outcomes = {s.name: s.outcome for s in journal.state.steps.values()}
    assert outcomes == {"a": "failed", "b": "failed"}  # c never ran


def test_a_check_that_changed_nothing_keeps_the_run_unchanged(journal):
    ctx = Ctx()
    with pytest.raises(StepFailed):
        run_steps([step("stop-native", "mismatch", "native", "rollback", changes=True)], ctx, HANDLERS, journal=journal)
    assert not ctx.recorder.changed  # deploy aborts (releases leases) instead of rolling back a pair it never touched
