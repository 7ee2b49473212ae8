"""Issue 48 item 6: an operator's fork commits bisected as docs/guides/bisect.md says ("Where --good
and --bad resolve"), its walk-through run line by line: the fork's branch fetched into the lab
source with the guide's own `git -C "$PAIRCTL_HOME/lab/source" fetch FORK ...` line, then bisected
there by `--good baseline --bad my-branch`; and the same branch bisected in the fork's own clone
(`--source ~/src/llama.cpp --good v1`). Both name the fork's breaking commit and leave the pair as
they found it; the fork's clone is not touched.

The fork: a clone of the lab source with 4 commits of its own on `baseline` (the `cache-off`
mutant at commit 2: tests/plugins/history.py), its branch `my-branch`, tag `v1` = baseline.

Slow (PAIRCTL_TEST_SLOW=1): each new commit is a real build. Not yet run to the end: on the
shared machine (load average 20) the guide's fetch line ran and the first bisect was still in
its first step's build after 14 minutes, when it was interrupted (the pair restored and verified).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from orchestrator.lab.source import BASELINE_TAG, git_env
from tests.e2e.test_bisect import _route_as_found
from tests.plugins.history import MUTANTS, make_history
from tests.plugins.pairs import PAIR, is_active, lab_status
from tests.plugins.readme import GUIDES, walk

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.environ.get("PAIRCTL_TEST_SLOW") != "1", reason="slow (new builds): PAIRCTL_TEST_SLOW=1"),
]


def _git(repo, *args: str) -> str:
    p = subprocess.run(["git", "-C", str(repo), *args], env=git_env(), capture_output=True, text=True, check=True)
    return p.stdout.strip()


def test_a_forks_commits_are_bisected_as_the_guide_says(deployed_lab, lab_source, cli, tmp_path, monkeypatch):
    home = tmp_path / "home"  # the reader's HOME: ~/src/llama.cpp is the fork's clone
    fork = home / "src" / "llama.cpp"
    fork.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--shared", str(lab_source), str(fork)], env=git_env(), check=True)
    hist = make_history(fork, BASELINE_TAG, name="fork-4", n=4, breaking_at=2, patch_dir=MUTANTS / "cache-off")
    _git(fork, "branch", "-f", "my-branch", hist.commits[-1])
    _git(fork, "tag", "-f", "v1", BASELINE_TAG)
    fork_state = (_git(fork, "status", "--porcelain"), _git(fork, "rev-parse", "HEAD"))
    before = _route_as_found(lab_status(cli))
    cli("bisect", "--pair", PAIR, "--reset")

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PAIRCTL_HOME", str(deployed_lab.home))

    docs = []  # each bisect's --json result

    def pairctl(words: list[str]) -> tuple[int, str]:
        r = cli("--json", *words)
        if r.exit_code == 0:
            docs.append(json.loads(r.stdout))
        return r.exit_code, r.stdout + r.stderr

    try:
        walk(GUIDES / "bisect.md", "fork", lambda line, _: line.replace("FORK", str(fork)), pairctl,
                    monkeypatch.setenv)  # fmt: skip
    finally:
        subprocess.run(["git", "-C", str(lab_source), "update-ref", "-d", "refs/heads/my-branch"], check=False)
    assert len(docs) == 2, docs  # in the lab source, then in the fork's own clone
    for doc in docs:
        assert doc["first_bad"]["commit"] == hist.breaking, doc
        assert all(s["commit"] in hist.commits for s in doc["steps"]), doc["steps"]
    assert _route_as_found(lab_status(cli)) == before
    assert is_active(lab_status(cli), deployed_lab.package_id)
    assert (_git(fork, "status", "--porcelain"), _git(fork, "rev-parse", "HEAD")) == fork_state
    assert os.environ["PAIRCTL_HOME"] == str(deployed_lab.home)
