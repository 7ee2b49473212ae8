"""`pairctl bisect`'s pure parts on a small real git repository: the range and its checks,
git's bisect in the private clone (verdicts, skips, the answer), the state file, and the
command line's refusals (one line, exit 2/3, nothing started)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.bisect import state as st
from orchestrator.bisect.gitbisect import PrivateBisect, resolve_range
from orchestrator.bisect.run import classify_rolled_back
from orchestrator.bisect.state import BisectState, Judgement, StepRecord
from orchestrator.errors import ConfigError, UsageError
from orchestrator.paths import Home


def _repo(tmp_path: Path, n: int) -> tuple[Path, list[str]]:
    repo = tmp_path / "src"
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *a], env=env, check=True, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    repo.mkdir()
    git("init", "-q")
    commits = []
    for i in range(n + 1):
        (repo / "f").write_text(f"{i}\n")
        git("add", "f")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}")
        commits.append(git("rev-parse", "HEAD"))
    return repo, commits


def test_range_counts_commits_and_bounds_the_steps(tmp_path):
    repo, c = _repo(tmp_path, 16)
    rng = resolve_range(repo, c[0], c[16])
    assert rng.size == 16 and [x.sha for x in rng.commits] == c[1:]
    assert rng.max_judged_steps == 4 and rng.as_dict()["estimated_steps"] == 4
    assert resolve_range(repo, c[0], c[1]).max_judged_steps == 0


@pytest.mark.parametrize(
    ("good", "bad", "says"),
    [
        ("nosuch", "HEAD", "--good 'nosuch'"),
        ("HEAD", "HEAD", "are the same commit"),
        ("HEAD", "HEAD~3", "is not an ancestor of --bad"),
    ],
)
def test_range_refuses_bad_ends_in_one_line(tmp_path, good, bad, says):
    repo, _ = _repo(tmp_path, 4)
    with pytest.raises(UsageError) as e:
        resolve_range(repo, good, bad)
    assert says in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("first_bad", [1, 7, 12, 16])
def test_git_bisect_names_the_first_bad_commit_within_log2_steps(tmp_path, first_bad):
    repo, c = _repo(tmp_path, 16)
    priv = PrivateBisect(tmp_path / "home" / "bisect" / "lab", repo)
    mark = priv.start(resolve_range(repo, c[0], c[16]))
    judged = 0
    while not mark.done:
        assert mark.next is not None
        judged += 1
        mark = priv.mark(mark.next, "bad" if c.index(mark.next) >= first_bad else "good")
    assert mark.first_bad == c[first_bad] and judged <= 4
    assert subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                          text=True).stdout == ""  # fmt: skip


def test_a_skipped_commit_costs_a_step_and_only_skips_left_is_ambiguous(tmp_path):
    repo, c = _repo(tmp_path, 8)
    priv = PrivateBisect(tmp_path / "b", repo)
    mark = priv.start(resolve_range(repo, c[0], c[8]))
    first = mark.next
    mark = priv.mark(first, "skip")
    assert mark.next not in (None, first)
    # every commit skipped: git names the candidates instead of a first bad commit
    while not mark.done:
        mark = priv.mark(mark.next, "skip")
    assert mark.first_bad is None and set(mark.candidates) == set(c[1:])


def test_state_round_trips_and_refuses_a_different_request(tmp_path):
    home = Home.resolve(tmp_path)
    j = Judgement("checks", ("cached_continuation",))
    s = BisectState(pair="lab", source="/src", good="a" * 40, bad="b" * 40, judgement=j, profile="lab",
                    started_at="now")  # fmt: skip
    s.steps.append(StepRecord("c" * 40, "skip", "does not build", "r1", {"build": {"error": "x"}}))
    st.save(home, s)
    back = st.load(home, "lab")
    assert back == s and back.judged == 0
    assert back.same_request("a" * 40, "b" * 40, j, "lab")
    assert not back.same_request("a" * 40, "b" * 40, Judgement("plan", plan="lab"), "lab")
    assert "--resume" in (st.refuse_other(back).hint or "")
    st.state_path(home, "lab").write_text(json.dumps({"version": 99}))
    with pytest.raises(ConfigError, match="--reset"):
        st.load(home, "lab")


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--good", "baseline", "--bad", "lab-b"], 2, "needs a judgement"),
        (["--good", "baseline"], 2, "--bad"),
        (["--good", "a", "--bad", "b", "--checks", "identity", "--plan", "lab"], 2, "one judgement"),
        (["--resume", "--good", "a"], 2, "--resume continues"),
        (["--reset", "--good", "a"], 2, "--reset"),
        (["--resume"], 2, "no unfinished bisect"),
    ],
)
def test_command_line_refusals(tmp_path, cli, args, code, says):
    r = cli("bisect", "--home", str(tmp_path), "--pair", "lab", *args)
    assert r.exit_code == code, r.output
    assert says in r.stderr and "Traceback" not in r.output


def test_reset_discards_the_state(tmp_path, cli):
    home = Home.resolve(tmp_path)
    s = BisectState(pair="lab", source="/s", good="a" * 40, bad="b" * 40, judgement=Judgement("plan", plan="x"),
                    profile="lab", started_at="now")  # fmt: skip
    st.save(home, s)
    r = cli("--json", "bisect", "--home", str(tmp_path), "--pair", "lab", "--reset")
    assert r.exit_code == 0 and json.loads(r.stdout)["discarded"] is True
    assert st.load(home, "lab") is None


@pytest.mark.parametrize(
    ("failed", "verdict"),
    [
        (["start-server"], "skip"),  # llama-server never became healthy: the package cannot start
        (["restart-rpc"], "skip"),
        (["verify"], "bad"),  # it runs, but is not what the manifest says
        (["accept", "check:cached_continuation"], "bad"),
        ([], "bad"),  # no step named: never a free pass
    ],
)
def test_a_rolled_back_deploy_is_bad_only_once_the_package_ran(failed, verdict):
    assert classify_rolled_back(failed, "x")[0] == verdict


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),  # issue 49: internal error: RecursionError
        (b'{"steps": ' + b"[" * 100 + b"]" * 100 + b"}", "nested more than 64 levels deep"),
        (b" " * (17 << 20) + b"{}", "more than any bisect state pairctl writes"),
        (b"[1, 2]", "not an object"),
    ],
)
def test_a_hostile_state_file_is_a_one_line_config_error(tmp_path, cli, content, says):
    """Issue 49 item 7: `bisect --resume` over a state.json nested 200,000 deep ended in
    `internal error: RecursionError`; a huge or deep file is exit 3 naming the file and the bound."""
    path = st.state_path(Home.resolve(tmp_path), "lab")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    r = cli("bisect", "--home", str(tmp_path), "--pair", "lab", "--resume")
    assert r.exit_code == 3, r.output
    assert says in r.stderr and str(path) in r.stderr and "Traceback" not in r.output
    assert "internal error" not in r.output and len(r.stderr.strip().splitlines()) == 2  # message + hint


def test_a_linked_state_file_is_refused_not_followed(tmp_path, cli):
    path = st.state_path(Home.resolve(tmp_path), "lab")
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    r = cli("bisect", "--home", str(tmp_path), "--pair", "lab", "--resume")
    assert r.exit_code == 3 and "symbolic link" in r.stderr, r.output


def test_the_snapshot_taken_before_the_first_step_survives_the_state_file(tmp_path):
    """Issue 48 item 3: the restore of a resumed bisect puts back what ran before the bisect, so
    the first run's snapshot (a real signed route record, the active pair, the previous links)
    is kept in state.json and read back whole; a state written before it existed still loads."""
    from orchestrator.bisect.driver import BisectDriver
    from orchestrator.config.inventory import load_inventory
    from tests.unit.test_route_trust import _record

    home = Home.resolve(tmp_path / "home")
    inv = load_inventory("lab", {"PAIRCTL_HOME": str(home.root)})
    first = BisectDriver(home, inv, "lab", argv=["pairctl", "bisect"])
    rec = _record(active="B", previous="A")
    active = {"native": "B", "rpc": "B", "profile": {"name": "lab"}, "route_revision": rec.revision}
    first.found_snapshot, first._bisect_found, first._bisect_links = active, rec, ("A", "A")
    s = BisectState(
        pair="lab", source="/src", good="a" * 40, bad="b" * 40, judgement=Judgement("checks", ("identity",)),
        profile="lab", started_at="2026-12-06T00:00:00+00:00", snapshot=first.saved_snapshot(),
    )  # fmt: skip
    st.save(home, s)
    back = st.load(home, "lab")
    assert back is not None and back.snapshot == s.snapshot
    resumed = BisectDriver(home, inv, "lab", argv=["pairctl", "bisect", "--resume"])
    assert resumed.use_snapshot(back.snapshot) == active
    assert resumed._bisect_found is not None and resumed._bisect_found.to_bytes() == rec.to_bytes()
    assert resumed._bisect_links == ("A", "A")
    first.close()
    resumed.close()
    old = json.loads(st.state_path(home, "lab").read_text())
    del old["snapshot"]
    st.state_path(home, "lab").write_text(json.dumps(old))
    legacy = st.load(home, "lab")
    assert legacy is not None and legacy.snapshot is None  # the next run takes one, as before


def test_bisect_receipts_are_listed_under_their_pair(tmp_path, cli):
    """Issue 48 item 6: a bisect and its steps run beside the pair's chain (under its leases), and
    `receipts list --pair P --command bisect` shows them, an interrupted run's included."""
    from orchestrator.evidence.store import EvidenceStore

    home = tmp_path / "home"
    store = EvidenceStore(Home.resolve(home).evidence)
    j = store.begin("bisect", ["pairctl", "bisect", "--pair", "lab"], pair=None)
    j.set("bisect_pair", "lab")
    run = j.finish("interrupted", "interrupted by SIGINT")
    s = store.begin("bisect step", ["pairctl", "bisect", "(step)"], pair=None)
    s.set("bisect_step", {"pair": "lab", "commit": "c" * 40})
    step = s.finish("passed", "good")
    other = store.begin("bisect", ["pairctl", "bisect", "--pair", "lab3"], pair=None)
    other.set("bisect_pair", "lab3")
    other.finish("passed", "found")
    r = cli("--json", "receipts", "list", "--pair", "lab", "--command", "bisect", home=home)
    assert r.exit_code == 0, r.stderr
    assert {row["hash"] for row in json.loads(r.stdout)} == {run, step}
