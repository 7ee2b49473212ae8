"""Kept numbers (issue 45): every test's wall and CPU time, written as JSON at the end of a run.

Set PAIRCTL_TEST_RECORD=DIR (the Makefile's `check` and `test` do) and the session writes
`DIR/durations.json` (the previous one becomes `durations.prev.json`): one row per test id with
its tier, outcome, wall seconds (setup + call + teardown, as pytest's `--durations` counts them)
and CPU seconds (this process and the children it waited for, over the same phases); and the
run's wall time, start, end, load averages and host.
`python -m benchmarks suite` reads it with the junit XML beside it (`--junitxml`, also set by the
Makefile). Unset, the plugin records nothing.

CPU time is kept beside wall time because the machine is shared: a test that got slower shows in
its CPU seconds whatever the load was; wall time alone moves with the neighbours.
`cpu_s` misses what no pytest process waits for: the lab's sshd, the pairctl steps it runs, and
the llama-server and rpc-server under it (most of a real-model test). So where the cgroup file
system lets it (root on this machine), the process moves itself into a cpuacct cgroup of its own
at start; everything it starts afterwards, daemons included, stays there, and `tree_cpu_s` is the
whole tree's CPU over the test's phases (and the session's over the run). Not writable, or a
hierarchy that also holds the cpu controller (joining would change the run's scheduling): no field.

Under pytest-xdist the CPU seconds are measured in the worker and travel on the report
(`pairctl_cpu_s`); the controller writes the file, with each test's worker (tried 2026-12-06:
`pytest tests/unit -m "not unit_slow" -n 2`, 1,199 passed, rows from gw0 and gw1). A failure to
write is reported and never turns a green run red.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lab.sshd import pid_alive
from tests.plugins.workers import without_group

RECORD_ENV = "PAIRCTL_TEST_RECORD"
SCHEMA = "pairctl-test-durations/1"

# Tier of a test: the first of these markers it carries, else its folder under tests/ ("unit",
# "install", ...): `make check` runs tier "unit"; `make test` runs them all.
TIER_MARKERS = ("faults", "mutants", "real_model", "e2e", "integration", "unit_slow")


def tier_of(item: pytest.Item) -> str:
    names = {m.name for m in item.iter_markers()}
    for marker in TIER_MARKERS:
        if marker in names:
            return marker
    parts = item.nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# cgroup v1's cpuacct hierarchy (nanoseconds in cpuacct.usage), else v2's (usage_usec in cpu.stat)
_CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
_tree: Path | None = None


def _tree_cpu() -> float | None:
    if _tree is None:
        return None
    try:
        if (_tree / "cpuacct.usage").is_file():
            return int((_tree / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (_tree / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6
    except (OSError, ValueError, KeyError):
        return None


def own_group(root: Path, proc_cgroup: str) -> Path | None:
    """This process's own cgroup folder in the hierarchy mounted at `root`, from the text of
    /proc/self/cgroup: cgroup v1's cpuacct line for the cpuacct mount, else v2's "0::" line."""
    want = "cpuacct" if root.name == "cpuacct" else ""
    for line in proc_cgroup.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (controllers == "" and num == "0" and not want) or (want and want in controllers.split(",")):
            return root / path.lstrip("/") if path.startswith("/") else None
    return None


def _join_tree() -> None:
    """Move this process into a new cgroup (`pairctl-test-PID`) under its OWN cgroup, so its
    whole tree's CPU can be read and it (with every daemon it starts) stays inside the limits and
    the kill-by-cgroup of the CI job or container that started it. Anything refused: no tree."""
    global _tree
    try:
        proc = Path("/proc/self/cgroup").read_text()
    except OSError:
        proc = ""
    for root in _CGROUP_ROOTS:
        own = own_group(root, proc)
        if own is None or not (own / "cgroup.procs").is_file() or not os.access(own, os.W_OK):
            continue
        name = f"pairctl-test-{os.getpid()}"
        if own.name == name:  # joined already (a second session in this process: pytester)
            _tree = own
            if _tree_cpu() is not None:
                return
            continue
        for old in own.glob("pairctl-test-*"):  # of earlier runs whose pytest ended (never a live sibling's)
            pid = old.name.removeprefix("pairctl-test-")
            if not pid.isdigit() or pid_alive(int(pid)):
                continue
            try:
                old.rmdir()
            except OSError:
                pass  # a daemon of that run still in it
        group = own / name
        try:
            group.mkdir(exist_ok=True)
            if (group / "cpu.shares").exists() or (group / "cpu.weight").exists():
                group.rmdir()  # a CPU controller here too: joining would change how the run is scheduled
                continue
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            continue
        _tree = group
        if _tree_cpu() is not None:
            return
    _tree = None


_STARTS: dict[str, tuple[float, float | None]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, Any]:
    rep = yield
    rep.pairctl_tier = tier_of(item)
    start = _STARTS.get(item.nodeid)  # absent when a skip mark stopped the setup before it
    if start is not None:
        rep.pairctl_cpu_s = round(_cpu() - start[0], 3)  # cumulative since this test's setup began
        tree = _tree_cpu()
        if tree is not None and start[1] is not None:
            rep.pairctl_tree_cpu_s = round(tree - start[1], 3)
    if call.when == "teardown":
        _STARTS.pop(item.nodeid, None)
    return rep


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _STARTS[item.nodeid] = (_cpu(), _tree_cpu())


class _Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows: dict[str, dict[str, Any]] = {}
        self.started = time.time()
        self.tree_start = _tree_cpu()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self.rows.setdefault(
            without_group(report.nodeid), {"wall_s": 0.0, "cpu_s": 0.0, "outcome": "passed", "tier": "other"}
        )
        row["wall_s"] = round(row["wall_s"] + report.duration, 4)
        cpu = getattr(report, "pairctl_cpu_s", None)
        if cpu is not None:
            row["cpu_s"] = max(row["cpu_s"], cpu)
        tree = getattr(report, "pairctl_tree_cpu_s", None)
        if tree is not None:
            row["tree_cpu_s"] = max(row.get("tree_cpu_s", 0.0), tree)
        tier = getattr(report, "pairctl_tier", None)
        if tier:
            row["tier"] = tier
        if report.when == "call" or report.outcome != "passed":
            # a failed setup or teardown is the test's outcome; a skip in setup too
            if not (report.when == "teardown" and report.outcome == "passed"):
                row["outcome"] = "error" if report.failed and report.when != "call" else report.outcome
        worker = getattr(getattr(report, "node", None), "workerinput", {}).get("workerid")  # xdist controller
        if worker:
            row["worker"] = worker

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        ended = time.time()
        doc = {
            "schema": SCHEMA,
            "started_at": _iso(self.started),
            "ended_at": _iso(ended),
            "wall_s": round(ended - self.started, 2),
            "exitstatus": int(exitstatus),
            "args": list(session.config.invocation_params.args),
            "markexpr": session.config.getoption("markexpr", "") or "",
            "host": socket.gethostname(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            **_tree_total(self.tree_start),
            "tests": dict(sorted(self.rows.items())),
        }
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            last = self.out / "durations.json"
            if last.is_file():  # the run before stays beside it, so a test that got slower shows
                last.replace(self.out / "durations.prev.json")
            tmp = self.out / f".durations.json.{os.getpid()}"
            tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            tmp.replace(self.out / "durations.json")
        except OSError as exc:  # the numbers are kept for people; a full disk must not fail the suite
            session.config.get_terminal_writer().line(f"pairctl durations: not written: {exc}", yellow=True)


def _tree_total(start: float | None) -> dict[str, float]:
    """The whole tree's CPU over the run (this process's; under xdist the rows carry the workers')."""
    now = _tree_cpu()
    return {"tree_cpu_s": round(now - start, 2)} if now is not None and start is not None else {}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get(RECORD_ENV)
    if out:
        _join_tree()
    # the xdist controller writes; workers only measure (they have `workerinput`)
    if out and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(Path(out)), "pairctl-durations-recorder")
