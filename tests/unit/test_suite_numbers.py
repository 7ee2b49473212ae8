"""Kept numbers (issue 45): the durations file a run writes, and `python -m benchmarks suite` reading it.

The file comes from a real pytest session (pytester, in this process) with the real plugin
(tests/plugins/durations.py) and the real `--junitxml`, as `make check` and `make test` run them;
the benchmark reads exactly those two files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import suite
from tests.plugins import durations

pytest_plugins = ["pytester"]

TESTS = """
import subprocess
import time
import pytest

def test_burns_cpu():
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass

def test_waits():
    time.sleep(0.2)

def test_a_daemon_burns(tmp_path):
    # a grandchild nobody waits for (as the lab's sshd and servers are): only the cgroup sees its CPU
    done = tmp_path / "done"
    burn = "import time,sys\\nt=time.process_time()\\nwhile time.process_time()-t<0.3: pass\\nopen(sys.argv[1],'w')"
    subprocess.run(["sh", "-c", 'python3 -c "$0" "$1" >/dev/null 2>&1 &', burn, str(done)], check=True)
    t = time.monotonic()
    while not done.exists() and time.monotonic() - t < 20:
        time.sleep(0.01)
    time.sleep(0.05)

def test_fails():
    assert 1 == 2

@pytest.mark.unit_slow
@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

@pytest.mark.unit_slow
def test_marked_slow():
    pass
"""


def _session(pytester: pytest.Pytester, out: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    monkeypatch.setenv("PAIRCTL_TEST_RECORD", str(out))
    pytester.makeini("[pytest]\nmarkers =\n  unit_slow: x\n")
    pytester.makepyfile(test_tiny=TESTS)
    return pytester.runpytest_inprocess("-p", "tests.plugins.durations", f"--junitxml={out / 'junit.xml'}")


def test_a_run_keeps_every_tests_wall_cpu_tier_and_outcome(pytester, tmp_path, monkeypatch):
    out = tmp_path / "runs" / "check"
    proc = Path("/proc/self/cgroup").read_text() if Path("/proc/self/cgroup").is_file() else ""
    owns = [o for o in (durations.own_group(root, proc) for root in durations._CGROUP_ROOTS) if o is not None]
    r = _session(pytester, out, monkeypatch)
    if durations._tree is not None:  # under this process's own cgroup (or it, joined already), never the root's
        assert any(durations._tree in (o, o / f"pairctl-test-{os.getpid()}") for o in owns), (durations._tree, owns)
    r.assert_outcomes(passed=4, failed=1, skipped=1)
    doc = json.loads((out / "durations.json").read_text())
    rows = {k.split("::")[1]: v for k, v in doc["tests"].items()}
    assert {k: v["outcome"] for k, v in rows.items()} == {
        "test_burns_cpu": "passed", "test_waits": "passed", "test_a_daemon_burns": "passed", "test_fails": "failed",
        "test_skipped": "skipped", "test_marked_slow": "passed",
    }  # fmt: skip
    assert rows["test_burns_cpu"]["cpu_s"] >= 0.25 and rows["test_burns_cpu"]["wall_s"] >= 0.25
    assert rows["test_waits"]["wall_s"] >= 0.2 and rows["test_waits"]["cpu_s"] < 0.15  # waiting is not CPU
    daemon = rows["test_a_daemon_burns"]
    assert daemon["cpu_s"] < 0.2  # pytest never waited for it
    if durations._tree is not None:  # the cgroup file system is writable here (root): the tree saw it
        assert daemon["tree_cpu_s"] >= 0.25 and rows["test_burns_cpu"]["tree_cpu_s"] >= 0.25, daemon
        assert doc["tree_cpu_s"] >= 0.5
    assert rows["test_marked_slow"]["tier"] == "unit_slow" and rows["test_waits"]["tier"] == "other"
    assert rows["test_skipped"]["tier"] == "unit_slow"  # a skip mark ends the setup early: the tier stays
    assert doc["exitstatus"] == 1 and doc["cpus"] and len(doc["loadavg_end"]) == 3 and doc["wall_s"] > 0.5

    # the next run moves this one beside it, so the benchmark can say which test got slower
    first = (out / "durations.json").read_text()
    _session(pytester, out, monkeypatch)
    assert (out / "durations.prev.json").read_text() == first

    monkeypatch.setenv("SUITE_RUNS", str(tmp_path / "runs"))
    got = suite.run()
    run = got["runs"]["check"]
    assert run["junit"] == {"tests": 6, "failures": 1, "errors": 0, "skipped": 1, "passed": 4,
                            "time_s": run["junit"]["time_s"]}  # fmt: skip
    assert run["slowest"][0]["test"].rsplit("::")[-1] in {"test_burns_cpu", "test_waits", "test_a_daemon_burns"}
    assert set(run["tiers"]) == {"other", "unit_slow"} and run["tiers"]["other"]["tests"] == 4
    if durations._tree is not None:  # the daemon's and the burner's CPU reach the tier's tree column
        assert run["tiers"]["other"]["tree_cpu_s"] >= 0.5, run["tiers"]
    assert got["line"].startswith("suite: check ") and "6 tests" in got["line"]


def test_a_test_whose_cpu_grew_is_named():
    before = {"a": {"cpu_s": 1.0, "wall_s": 2.0, "outcome": "passed"},
              "b": {"cpu_s": 1.0, "wall_s": 2.0, "outcome": "passed"},
              "c": {"cpu_s": 0.01, "wall_s": 0.02, "outcome": "passed"}}  # fmt: skip
    now = {"a": {"cpu_s": 1.2, "wall_s": 5.0, "outcome": "passed"},  # wall grew with the load: not named
           "b": {"cpu_s": 2.0, "wall_s": 4.0, "outcome": "passed"},
           "c": {"cpu_s": 0.1, "wall_s": 0.2, "outcome": "passed"}}  # fmt: skip  # tenfold but under 0.5 s
    assert [r["test"] for r in suite.grew(now, before)] == ["b"]


def test_no_recorded_run_is_said_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_RUNS", str(tmp_path / "nothing"))
    got = suite.run()
    assert got["runs"] == {} and "no run recorded" in got["line"]


def test_the_group_is_made_under_the_process_own_cgroup():
    """A pytest inside a CI job's or container's cgroup stays in it: v2's "0::" path, v1's cpuacct line."""
    v2 = "0::/ci/job-7\n"
    assert durations.own_group(Path("/sys/fs/cgroup"), v2) == Path("/sys/fs/cgroup/ci/job-7")
    v1 = "4:memory:/x\n2:cpu,cpuacct:/ci/job-7\n0::/\n"
    assert durations.own_group(Path("/sys/fs/cgroup/cpuacct"), v1) == Path("/sys/fs/cgroup/cpuacct/ci/job-7")
    assert durations.own_group(Path("/sys/fs/cgroup/unified"), v1) == Path("/sys/fs/cgroup/unified")
    assert durations.own_group(Path("/sys/fs/cgroup/cpuacct"), v2) is None


def test_only_groups_of_ended_processes_are_cleaned(tmp_path, monkeypatch):
    """xdist workers start together: one must not remove a live sibling's group."""
    import subprocess

    ended = subprocess.Popen(["true"])
    ended.wait()
    live, gone = tmp_path / f"pairctl-test-{os.getppid()}", tmp_path / f"pairctl-test-{ended.pid}"
    live.mkdir()
    gone.mkdir()
    (tmp_path / "cgroup.procs").write_text("")
    monkeypatch.setattr(durations, "_CGROUP_ROOTS", (tmp_path,))
    monkeypatch.setattr(durations, "own_group", lambda root, proc: root)
    monkeypatch.setattr(durations, "_tree", None)
    durations._join_tree()  # a plain folder: no cpu.stat in the new group, so nothing is joined
    assert live.is_dir() and not gone.exists() and durations._tree is None
