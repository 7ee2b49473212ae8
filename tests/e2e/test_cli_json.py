"""Issue 17 against the real lab pair: `--json` on a deploy that fails after activation carries
the failed receipt's hash; status is a read (no receipt); progress reaches stderr as plain lines
without a TTY; the documents match the schemas `config schema output.COMMAND` publishes.
"""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.cli.outputs import validate_output
from orchestrator.evidence.store import EvidenceStore
from tests.plugins.pairs import PAIR, deploy_baseline, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _hashes(home) -> set[str]:
    return set(EvidenceStore(home / "evidence").hashes())


def test_failed_deploy_json_names_its_receipt(deployed_lab, lab_packages, cli):
    pid = deployed_lab.package_id
    before = _hashes(deployed_lab.home)
    # manifests/profiles/lab-unloadable.yaml: an --override-kv naming no architecture -> start-server fails, rolled back
    r = cli(
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
    )
    try:
        assert r.exit_code == 7, r.stderr[-3000:]
        doc = json.loads(r.stdout)  # exactly one document
        validate_output("error", doc)
        err = doc["error"]
        assert err["exit_code"] == 7 and err["kind"] == "RolledBack" and "rolled back" in err["message"], err
        new = _hashes(deployed_lab.home) - before
        assert err["receipt"] in new, (err["receipt"], new)
        rec = EvidenceStore(deployed_lab.home / "evidence").load(err["receipt"])
        assert rec.command == "deploy" and rec.outcome == "failed"
        # progress without a TTY: one plain line per finished step, with no -v
        assert re.search(r"step start-server +FAILED ", r.stderr), r.stderr[-2000:]
    finally:
        deploy_baseline(cli, pid)
    assert is_active(lab_status(cli), pid)


def test_status_is_a_read_and_its_json_matches_the_schema(deployed_lab, cli):
    before = _hashes(deployed_lab.home)
    for argv in (("status", "--pair", PAIR, "--json"), ("--json", "status", "--all"), ("status", "--pair", PAIR)):
        r = cli(*argv)
        assert r.exit_code == 0, r.output[-2000:]
    assert _hashes(deployed_lab.home) == before  # no receipt from any of them
    doc = json.loads(cli("status", "--pair", PAIR, "--json").stdout)
    validate_output("status", doc)
    assert "receipt" not in doc


def test_status_of_an_unknown_pair_prints_an_error_document(deployed_lab, cli):
    r = cli("--json", "status", "--pair", "no-such-pair")
    assert r.exit_code == 3, r.output
    doc = json.loads(r.stdout)
    assert doc["error"]["exit_code"] == 3 and "no-such-pair" in doc["error"]["message"]


def test_dry_run_json_matches_the_schema(deployed_lab, cli):
    pid = deployed_lab.package_id
    r = cli("--json", "deploy", "--pair", PAIR, "--native", pid, "--rpc", pid, "--dry-run")
    assert r.exit_code == 0, r.stderr[-2000:]
    validate_output("deploy", json.loads(r.stdout))
