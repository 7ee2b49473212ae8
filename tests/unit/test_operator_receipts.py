"""Issue 34, item 9: `receipts list` filters by command and outcome, and `--pair` also lists a
pair's qualifications (their receipts stand outside the pair's chain and name the pair in
`qualify_pair`). Real receipts sealed by the evidence store, listed by the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.evidence.store import EvidenceStore
from tests.plugins.cli import run_cli


def _store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    ev = tmp_path / "evidence"
    store = EvidenceStore(ev)
    made = {
        "deploy-passed": store.begin("deploy", ["deploy"], pair="lab").finish("passed", "ok"),
        "deploy-failed": store.begin("deploy", ["deploy"], pair="lab").finish("failed", "start-server failed"),
        "rollback": store.begin("rollback", ["rollback"], pair="lab").finish("passed", "ok"),
        "other-pair": store.begin("deploy", ["deploy"], pair="prod").finish("failed", "x"),
        "build": store.begin("build", ["build"], pair=None).finish("passed", "ok"),
    }
    q = store.begin("qualify", ["qualify", "--pair", "lab"], pair=None)
    q.set("qualify_pair", "lab")
    made["qualify"] = q.finish("inconclusive", "too few pairs")
    return ev, made


def _list(ev: Path, *args: str) -> list[str]:
    r = run_cli(["--json", "receipts", "list", "--evidence", str(ev), *args])
    assert r.exit_code == 0, r.output
    return [row["hash"] for row in json.loads(r.stdout)]


def test_receipts_list_filters_by_pair_command_and_outcome(tmp_path):
    ev, m = _store(tmp_path)
    assert set(_list(ev, "--pair", "lab")) == {m["deploy-passed"], m["deploy-failed"], m["rollback"], m["qualify"]}
    assert _list(ev, "--command", "qualify") == [m["qualify"]]
    assert set(_list(ev, "--command", "deploy,rollback", "--pair", "lab")) == {
        m["deploy-passed"],
        m["deploy-failed"],
        m["rollback"],
    }
    assert set(_list(ev, "--outcome", "failed")) == {m["deploy-failed"], m["other-pair"]}
    assert _list(ev, "--pair", "lab", "--outcome", "failed", "--command", "deploy") == [m["deploy-failed"]]
    r = run_cli(["receipts", "list", "--evidence", str(ev), "--outcome", "bogus"])
    assert r.exit_code == 2 and "unknown bogus" in r.stderr and "passed" in r.stderr, r.stderr
