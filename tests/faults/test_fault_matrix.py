"""Issue 10: the fault matrix. Every fault x every step boundary of playbooks/deploy.yaml, and
(issue 21) the boundaries of the acceptance checks the matrix's deploys run.

For each cell the `faults` pair starts on a verified pair (OLD); a real `pairctl deploy NEW`
child stops just before the step (engine fault hook), the fault is injected, pairctl is resumed
(or SIGKILLed), the outside world is repaired (sshd back, disk freed, process continued), and
then the operator's next commands run: `status`, then the same `deploy` again (even steps) or
`rollback` (odd steps; followed by the deploy if it leaves no verified pair). The promise,
checked for every cell:
  - the pair ends on NEW-and-verified or OLD-and-verified (status: route record, both services
    running from current and matching their manifests, health ok, no problems), and NEW only
    when a deploy accepted it (its acceptance suite passed) after the fault;
  - receipts exist for both deploys (a killed one sealed `aborted`) and `receipts verify` passes;
  - a lease left on a host is reported by `status` (ground truth: the lock directory), which
    names the finished run holding it, and `lease release PAIR --dead-run RUN_ID` frees it; none
    is held at the end;
  - the processes under each install root are exactly those in its pid files;
  - no traceback reaches the user.
The matrix prints as a table (fault x step -> first exit -> retried exit, final pair) and is
written to <home>/faults/matrix.txt.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from orchestrator.engine.playbook import load_playbook
from tests.faults.harness import CHECK_STEPS, FAULTS, Cell, establish, render_matrix, run_cell

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.timeout(40 * 60)]


def _selected(var: str, all_: list[str]) -> list[str]:
    want = [x for x in os.environ.get(var, "").split(",") if x]
    return [x for x in all_ if not want or x in want]


# Cells known to fail, left open on an issue: printed every run, failing no other cell; remove an
# entry once its cell holds again. (The two cut-ssh-native cells of 2026-12-03 hold again: the
# native host lost at stop-native is refused with exit 4, and a rollback that cannot reach the
# native host puts the RPC host's links back as found, so no mixed pair is recorded.)
KNOWN_OPEN: set[tuple[str, str]] = set()


def test_fault_matrix(fault_pair, tmp_path, capsys):
    steps = _selected("PAIRCTL_FAULTS_STEPS", [s.name for s in load_playbook("deploy").steps] + CHECK_STEPS)
    faults = [f for f in FAULTS if f.name in _selected("PAIRCTL_FAULTS_ONLY", [f.name for f in FAULTS])]
    t0 = time.monotonic()
    establish(fault_pair, fault_pair.packages[0])
    planned = fault_pair.planned_steps(fault_pair.packages[1])
    cells = []
    for fault in faults:
        for i, step in enumerate(steps):
            if step not in planned:  # e.g. kernel-check, only with --kernel-check: no such boundary here
                cells.append(Cell(fault.name, step, first="n/a", recovery="not in the plan"))
                continue
            operator = "rollback" if i % 2 else "deploy"  # both of the operator's ways out, at alternate steps
            cell = run_cell(fault_pair, fault, step, tmp_path / f"{fault.name}-{step}", operator=operator)
            cells.append(cell)
            with capsys.disabled():
                print(
                    f"[faults] {fault.name:18} @ {step:14} {cell.text():40} {cell.seconds:5.1f}s  {cell.injected}"
                    + ("" if cell.holds else f"\n   PROBLEMS: {cell.problems}\n   said: {cell.first_said[-400:]}"),
                    flush=True,
                )
    table = render_matrix(cells, [f.name for f in faults], steps)
    took = time.monotonic() - t0
    ran = [c for c in cells if c.first != "n/a"]
    report = (
        f"{table}\n\n{len(ran)} cells run, {sum(c.holds for c in ran)} hold; {len(cells) - len(ran)} n/a; {took:.0f} s"
    )
    out = fault_pair.home.root / "faults"
    (out / "matrix.txt").write_text(report + "\n")
    (out / "matrix.json").write_text(json.dumps([c.__dict__ for c in cells], indent=1, default=str))
    with capsys.disabled():
        print("\n" + report, flush=True)
    v = fault_pair.cli("receipts", "verify")
    assert v.returncode == 0, f"receipts verify after the matrix: {v.stdout[-2000:]} {v.stderr[-2000:]}"
    failed = [c for c in cells if not c.holds and (c.fault, c.step) not in KNOWN_OPEN]
    open_now = sorted((c.fault, c.step) for c in cells if not c.holds and (c.fault, c.step) in KNOWN_OPEN)
    with capsys.disabled():
        print(f"[faults] known open cells (issue 21), still failing: {open_now}", flush=True)
    assert not failed, "\n".join(f"{c.fault} @ {c.step}: {c.problems}" for c in failed)
    if not os.environ.get("PAIRCTL_FAULTS_ONLY") and not os.environ.get("PAIRCTL_FAULTS_STEPS"):
        assert len(faults) >= 6 and len(cells) == len(faults) * len(steps)
        assert len(set(steps) - set(planned)) <= 1, f"steps missing from the plan: {set(steps) - set(planned)}"
