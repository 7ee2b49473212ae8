"""Issue 34 against the real lab pair, run as an operator runs pairctl: a child process with a
real pseudo-terminal (the live display), with pipes (CI logs), with `--json`, and the JSON log
read back afterwards.

- On a terminal each step and check is shown once, no spinner is left behind, the result
  line comes after the steps (items 3 and 10: checks numbered from 1).
- Through a pipe: one plain line per finished step on stderr, nothing of it on stdout.
- The JSON log: one info event per step and check and one for the outcome, naming the run
  id, pair and receipt; a rollback, its final state and a refusal are events too; no debug
  line without -v (item 5).
- A deploy that fails after activation prints its steps, final state and rollback in its
  `--json` (item 9).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.pairs import PAIR, deploy_baseline, is_active, lab_status
from tests.plugins.tty import SPINNER_GLYPHS, run_in_pty, screen

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _argv(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "--home", str(home), *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PAIRCTL_FAULT_HOOK", None)
    return env


def _log_lines_after(log: Path, offset: int) -> list[dict[str, Any]]:
    with log.open("rb") as f:
        f.seek(offset)
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def _deploy_args(pid: str) -> list[str]:
    return ["deploy", "--pair", PAIR, "--native", pid, "--rpc", pid, "--checks", "identity,cached_continuation"]


def test_deploy_on_a_terminal_shows_each_step_once_and_clears_its_spinner(deployed_lab):
    home, pid = deployed_lab.home, deployed_lab.package_id
    code, raw = run_in_pty(_argv(home, *_deploy_args(pid)), env=_env(), timeout_s=600)
    shown = screen(raw)
    text = "\n".join(shown)
    assert code == 0, text[-3000:]
    assert not SPINNER_GLYPHS & set(text), text  # no stale spinner
    steps = [s for s in shown if re.match(r"step \S+ +(ok|FAILED) ", s)]
    names = [s.split()[1] for s in steps]
    assert len(names) >= 8 and len(names) == len(set(names)), text  # every step once
    assert not any(s.rstrip().endswith("...") for s in shown), text  # no start line left behind
    assert sum(1 for s in shown if s.startswith("check cached_continuation (1/1): pass")) == 1, text  # from 1
    assert sum(1 for s in shown if s.startswith("check identity (before and after): pass")) == 1, text
    result = [i for i, s in enumerate(shown) if s.startswith(f"deploy {PAIR}: passed")]
    assert len(result) == 1 and result[0] > shown.index(steps[-1]), text
    assert re.search(r"package bytes sent: [\d.]+ (B|kB|MB|GB)", text), text  # human-readable


def test_deploy_through_a_pipe_and_its_log_events(deployed_lab):
    home, pid = deployed_lab.home, deployed_lab.package_id
    log = home / "logs" / "pairctl.jsonl"
    offset = log.stat().st_size
    r = subprocess.run(
        _argv(home, *_deploy_args(pid)), env=_env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    err = r.stderr.splitlines()
    assert err and all(line.startswith("pairctl: [") for line in err), err
    steps = [line.split("] ", 1)[1].split()[1] for line in err if re.search(r"\] step \S+ +ok ", line)]
    assert len(steps) >= 8 and len(steps) == len(set(steps)), err  # one plain line per step
    assert not re.search(r"^\s*step ", r.stdout, re.M), r.stdout  # steps are progress: stderr only
    receipt = re.search(r"receipt ([0-9a-f]{64})", r.stdout)
    assert receipt, r.stdout

    events = _log_lines_after(log, offset)
    assert events and not [e for e in events if e["level"] == "debug"], "debug lines without -v"
    step_events = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in step_events if e["step"] in steps] == steps, step_events
    run_ids = {e["run_id"] for e in step_events}
    assert len(run_ids) == 1 and all(e["pair"] == PAIR and e["command"] == "deploy" for e in step_events)
    checks = [e for e in events if e["event"] == "check"]
    assert sorted(c["check"] for c in checks) == ["cached_continuation", "identity"], checks
    assert all(c["outcome"] == "passed" and c["run_id"] in run_ids for c in checks), checks
    outcome = [e for e in events if e["event"] == "outcome"]
    assert len(outcome) == 1 and outcome[0]["receipt"] == receipt.group(1), outcome
    assert outcome[0]["run_id"] in run_ids and outcome[0]["outcome"] == "passed"
    end = [e for e in events if e["event"] == "command finished"]
    assert len(end) == 1 and end[0]["exit_code"] == 0 and end[0]["pair"] == PAIR, end


def test_failed_deploy_json_has_steps_final_state_rollback_and_log_events(deployed_lab, cli):
    home, pid = deployed_lab.home, deployed_lab.package_id
    log = home / "logs" / "pairctl.jsonl"
    offset = log.stat().st_size
    try:
        # manifests/profiles/lab-unloadable.yaml: llama-server cannot load -> start-server fails, rolled back
        r = subprocess.run(
            _argv(
                home,
                "deploy",
                "--pair",
                PAIR,
                "--native",
                pid,
                "--rpc",
                pid,
                "--profile",
                "lab-unloadable",
                "--skip-accept",
                "--json",
            ),  # fmt: skip
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert r.returncode == 7, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        assert doc["error"]["exit_code"] == 7 and doc["receipt"] == doc["error"]["receipt"], doc
        failed_steps = [s for s in doc["steps"] if not s["ok"]]
        assert any(s["name"] == "start-server" and s["error"] for s in failed_steps), doc["steps"]
        assert any(s["name"].startswith("rollback") or s["seconds"] for s in doc["steps"]), doc["steps"]
        assert doc["final_state"]["state"].startswith("restored"), doc["final_state"]
        assert doc["rollback"]["restored"], doc["rollback"]

        # a refusal before any change: a package that is not in the store
        bad = subprocess.run(
            _argv(home, "deploy", "--pair", PAIR, "--native", "no-such-package", "--rpc", "no-such-package"),
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert bad.returncode not in (0, 1, 7, 8), bad.stderr
    finally:
        deploy_baseline(cli, pid)
    assert is_active(lab_status(cli), pid)

    events = _log_lines_after(log, offset)
    failed = [e for e in events if e["event"] == "step" and e.get("outcome") == "failed"]
    assert any(e["step"] == "start-server" and e["error"] for e in failed), failed
    assert any(e["event"] == "rollback" and e["pair"] == PAIR and e["run_id"] for e in events), events
    assert any(e["event"] == "final state" and e["final_state"]["state"].startswith("restored") for e in events)
    out = [e for e in events if e["event"] == "outcome" and e["receipt"] == doc["receipt"]]
    assert len(out) == 1 and out[0]["outcome"] == "failed", out
    refused = [e for e in events if e["event"] == "refused"]
    assert refused and refused[0]["pair"] == PAIR and refused[0]["exit_code"] == bad.returncode, refused
    assert refused[0]["error"], refused


def test_manual_rollback_fires_its_hook(deployed_lab, lab, lab_packages_b, cli, tmp_path):
    """Item 1: `pairctl rollback` fires rollback.passed (with its receipt) like a deploy fires its own."""
    base = deployed_lab.package_id
    got = tmp_path / "events.jsonl"
    hook = f"import sys; open({str(got)!r}, 'a').write(sys.stdin.read() + '\\n')"
    inv = tmp_path / "lab-hooks.yaml"
    inv.write_text(
        lab.inventory_path.read_text()
        + f"\nhooks:\n  - on: [rollback.passed, rollback.failed]\n    argv: [{json.dumps(sys.executable)}, -c, "
        + json.dumps(hook)
        + "]\n"
    )
    b = lab_packages_b.id
    try:
        r = cli("--json", "deploy", "--pair", PAIR, "--native", b, "--rpc", b, "--skip-accept", inventory=str(inv))
        assert r.exit_code == 0, r.stderr[-3000:]
        r = cli("--json", "rollback", "--pair", PAIR, inventory=str(inv))
        assert r.exit_code == 0, r.stderr[-3000:]
        receipt = json.loads(r.stdout)["receipt"]
        events = [json.loads(line) for line in got.read_text().splitlines() if line.strip()]
        assert [(e["event"], e["pair"], e["receipt"], e["exit_code"]) for e in events] == [
            ("rollback.passed", PAIR, receipt, 0)
        ], events
    finally:
        deploy_baseline(cli, base)
    assert is_active(lab_status(cli), base)
