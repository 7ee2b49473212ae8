"""orchestrator/interrupt.py: a signal is recorded, stops a run only at `check` (never inside
`shielded`), relabels a receipt that did not pass, and maps the exit code (cli._after_signal)."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from orchestrator import interrupt
from orchestrator.cli import _after_signal
from orchestrator.engine.context import RunRecorder
from orchestrator.engine.plan import Step
from orchestrator.engine.runner import StepFailed, _stop_if_interrupted
from orchestrator.errors import ExitCode, Interrupted
from orchestrator.evidence import EvidenceStore


@pytest.fixture(autouse=True)
def _clean():
    interrupt.reset()
    yield
    interrupt.reset()


def _signal(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs in the main thread at the next bytecode


def test_guarded_signal_is_recorded_not_fatal_and_stops_at_check(capfd):
    interrupt.check("before anything")  # no signal: nothing happens
    interrupt.guard()
    _signal(signal.SIGTERM)
    assert interrupt.received() == "SIGTERM"
    assert "SIGTERM received: stopping at the next safe point" in capfd.readouterr().err
    with pytest.raises(Interrupted) as exc:
        interrupt.check("before step upload")
    assert exc.value.exit_code == ExitCode.INTERRUPTED and exc.value.signal_name == "SIGTERM"
    assert "interrupted by SIGTERM before step upload" in str(exc.value)


def test_shielded_cleanup_is_not_interrupted_and_a_second_signal_is_said(capfd):
    interrupt.guard()
    _signal(signal.SIGINT)
    with interrupt.shielded():
        interrupt.check("inside the rollback")  # does not raise
        _signal(signal.SIGHUP)
        interrupt.check("still inside")
    assert interrupt.count() == 2 and interrupt.received() == "SIGINT"
    assert "received again (2 signals): still cleaning up" in capfd.readouterr().err
    with pytest.raises(Interrupted):
        interrupt.check("after the cleanup")


def _ctx(changed: bool) -> SimpleNamespace:
    rec = RunRecorder()
    rec.set_changed(changed)
    return SimpleNamespace(recorder=rec)


def _step(name: str, action: str, restores: bool = False) -> Step:
    return Step(
        name=name, action=action, role="both", hosts=("h1", "h2"), on_failure="rollback", changes=True,
        description="", may=frozenset({"restore"} if restores else ()),
    )  # fmt: skip


class _Journal:
    def __init__(self) -> None:
        self.steps: list[tuple[str, str]] = []

    def record_step(self, name: str, outcome: str, **_: object) -> None:
        self.steps.append((name, outcome))


def test_runner_stops_before_a_step_but_never_in_cleanup():
    interrupt.guard()
    _signal(signal.SIGTERM)
    j = _Journal()
    upload = _step("upload", "upload")
    with pytest.raises(StepFailed) as exc:
        _stop_if_interrupted(upload, _ctx(False), j, "h1,h2")  # type: ignore[arg-type]
    assert isinstance(exc.value.cause, Interrupted) and j.steps == [("upload", "skipped")]
    release = _step("release-lease", "release-lease")
    _stop_if_interrupted(release, _ctx(True), j, "h1,h2")  # type: ignore[arg-type]
    start = _step("start-server", "start-server", restores=True)  # a rollback's (its plan restores)
    _stop_if_interrupted(start, _ctx(True), j, "h1")  # type: ignore[arg-type]  # a rollback under way
    with pytest.raises(StepFailed):  # a manual rollback before its first change stops
        _stop_if_interrupted(start, _ctx(False), j, "h1")  # type: ignore[arg-type]


def test_receipt_of_a_signalled_run_is_interrupted_naming_the_signal(tmp_path):
    store = EvidenceStore(tmp_path / "evidence")
    interrupt.guard()
    _signal(signal.SIGTERM)
    j = store.begin("deploy", ["deploy"], pair="lab", inputs={})
    rec = store.load(j.finish("failed", "deploy failed at step 'accept' and was rolled back"))
    assert rec.outcome == "interrupted" and rec.reason.startswith("interrupted by SIGTERM: deploy failed")
    j2 = store.begin("deploy", ["deploy"], pair="lab", inputs={})
    assert store.load(j2.finish("passed", "deployed")).outcome == "passed"  # past its last stop point


def test_exit_code_after_a_signal():
    assert _after_signal(7, None) == (7, None)  # no signal: unchanged
    interrupt.guard()
    _signal(signal.SIGTERM)
    code, err = _after_signal(7, {"exit_code": 7, "message": "rolled back", "meaning": "x", "kind": "RolledBack"})
    assert code == 130 and err is not None and err["exit_code"] == 130
    assert err["message"] == "interrupted by SIGTERM: rolled back" and err["meaning"] == "interrupted"
    assert _after_signal(8, None)[0] == 8  # a failed rollback keeps its code: leases are kept
    assert _after_signal(0, None)[0] == 0


def test_local_exec_runs_in_its_own_session():
    """A terminal's Ctrl-C / hangup goes to its foreground group: a local exec must not be in it."""
    from orchestrator.remote.command import Cmd
    from orchestrator.remote.local import LocalTransport

    r = LocalTransport().run(Cmd.of("sh", "-c", "ps -o sid= -p $$"))
    assert int(r.stdout.strip()) != os.getsid(0)
