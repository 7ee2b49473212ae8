"""Issue 48 item 3: a bisect killed with SIGKILL restores, on resume, the pair that ran before the
bisect began, whatever step it died in. One bisect over an 8-commit lab history (the `cache-off`
mutant at commit 5, judged by `cached_continuation`), killed four times, each time at the next
step kind as it starts: a build, a deploy (the candidate's switch), a judgement (the acceptance
check), the final restore. After each kill: `bisect --resume` refuses at once (exit 5, it does
not wait on its own dead run's lease) and names the documented release; `pairctl lease release
lab --dead-run RUN` frees the pair; the next `--resume` goes on. The last resume ends with the
pre-bisect pair active and verified (route record, services, status without problems), the
first bad commit named, every exit's JSON naming its sealed receipt, the bisect receipts listed
under the pair, and progress lines on stderr (no TTY here) naming each commit and its verdict.

Real builds (ccache warm: configure, cache hits, links), real deploys, real SIGKILLs of the
whole process group (the run and the compiler or ssh it started)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.bisect import state as bisect_state
from orchestrator.lab.source import BASELINE_TAG
from orchestrator.paths import Home
from tests.e2e.test_bisect import _route_as_found
from tests.plugins.pairs import PAIR, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]


def _pairctl(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "--home", str(home), *args]


def _journal_events(home: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(header, events) of every unsealed journal in the home (running or killed runs)."""
    out = []
    for p in sorted((Home.resolve(home).evidence / "journal").glob("*.jsonl")):
        try:
            lines = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        except (OSError, ValueError):
            continue  # being written
        if lines:
            out.append((lines[0], lines[1:]))
    return out


def _started(home: Path, kind: str) -> bool:
    """Whether the running bisect has just started a step of `kind`."""
    for header, events in _journal_events(home):
        argv = " ".join(header.get("argv") or [])
        names = [e.get("name") for e in events if e.get("ev") == "step_start"]
        ended = {e.get("name") for e in events if e.get("ev") == "step_end"}
        cmd = header.get("command")
        if kind == "build" and cmd == "bisect step" and "build" in names and "build" not in ended:
            return True
        if kind == "deploy" and cmd == "deploy" and "bisect step" in argv and "switch-native" in names:
            return True
        if (
            kind == "judge"
            and cmd == "deploy"
            and "bisect step" in argv
            and any(str(n).startswith("check:") for n in names)
        ):
            return True
        if kind == "restore" and cmd == "deploy" and "restore" in argv and "switch-native" in names:
            return True
    return False


def _run_until(home: Path, env: dict[str, str], args: list[str], kind: str) -> str:
    """Run the bisect until a step of `kind` starts, SIGKILL its process group; its stderr."""
    child = subprocess.Popen(
        _pairctl(home, *args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 1500
    while child.poll() is None and time.monotonic() < deadline and not _started(home, kind):
        time.sleep(0.05)
    if child.poll() is not None:
        out, err = child.communicate()
        pytest.fail(f"the bisect ended (exit {child.returncode}) before a {kind} step: {err[-3000:]}")
    assert _started(home, kind), f"no {kind} step within the bound"
    os.killpg(child.pid, signal.SIGKILL)
    _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    return err


def test_a_bisect_killed_at_each_step_kind_resumes_to_the_pair_it_found(deployed_lab, lab_history, cli):
    hist = lab_history("killed-8", n=8, breaking_at=5, patch="cache-off")
    home = deployed_lab.home
    env = dict(os.environ, PAIRCTL_HOME=str(home))
    before = _route_as_found(lab_status(cli))
    assert not before["problems"], before["problems"]
    cli("bisect", "--pair", PAIR, "--reset")
    start = [
        "--json",
        "bisect",
        "--pair",
        PAIR,
        "--good",
        BASELINE_TAG,
        "--bad",
        hist.tip,
        "--checks",
        "cached_continuation",
    ]
    resume = ["--json", "bisect", "--pair", PAIR, "--resume"]
    progress = ""
    for i, kind in enumerate(("build", "deploy", "judge", "restore")):
        progress += _run_until(home, env, start if i == 0 else resume, kind)
        st = bisect_state.load(Home.resolve(home), PAIR)
        assert st is not None and st.snapshot is not None and st.finished is None
        assert st.snapshot["active"]["native"] == deployed_lab.package_id  # taken once, before the first step
        dead = st.runs[-1]
        t0 = time.monotonic()
        refused = subprocess.run(_pairctl(home, *resume), env=env, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 5 and time.monotonic() - t0 < 120, (refused.returncode, refused.stderr[-2000:])
        assert f"--dead-run {dead}" in refused.stderr, refused.stderr[-2000:]
        assert json.loads(refused.stdout)["error"]["receipt"], refused.stdout  # its sealed receipt named
        rel = subprocess.run(
            _pairctl(home, "lease", "release", PAIR, "--dead-run", dead), env=env, capture_output=True, text=True
        )
        assert rel.returncode == 0, rel.stderr[-2000:]
    done = subprocess.run(_pairctl(home, *resume), env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout)
    assert out["first_bad"]["commit"] == hist.breaking, out
    assert out["receipt"] and out["restored"]["native"] == deployed_lab.package_id
    after = lab_status(cli)
    assert _route_as_found(after) == before, "the resumed bisect did not restore the pair it found"
    assert is_active(after, deployed_lab.package_id) and not after["problems"]
    # progress without a TTY: the restore, and (over the runs) each commit and its verdict
    assert f"bisect {PAIR}: restored and verified" in done.stderr, done.stderr[-3000:]
    progress += done.stderr
    for s in out["steps"]:  # each printed by the run that judged it, as it went
        c = s["commit"][:10]
        assert f"judging {c}" in progress and f"{c} is {s['verdict']}:" in progress, (s, progress[-3000:])
    listed = cli("--json", "receipts", "list", "--pair", PAIR, "--command", "bisect")
    rows = json.loads(listed.stdout)
    assert out["receipt"] in {r["hash"] for r in rows} and len(rows) >= 5, rows  # every run of the bisect
