"""Issue 33 item 6: `receipts prune` on the lab pair `lab`, with real receipts (a deploy of B and a
rollback to A, acceptance skipped: it proves nothing here) and the route records on the real
hosts, read over SSH by the prune itself.

The prune runs on a copy of the lab home's evidence (`--evidence`), so the session's other tests
keep theirs; the route records it reads are the hosts' own. After pruning with an archive: the
route record's writer and the head it followed are kept, `receipts verify` passes and counts the
pruned receipts, the route record's anchor check passes on the pruned store, and a receipt
deleted without a prune receipt is still reported (exit 10)."""

from __future__ import annotations

import json
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from orchestrator.engine.route_trust import anchor_problems
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.route import parse_route
from tests.plugins.pairs import PAIR, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _ok(r) -> dict:
    if r.exit_code != 0:
        pytest.fail(f"exit {r.exit_code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout) if r.stdout.strip()[:1] in "{[" else {}


def test_prune_keeps_anchors_verifies_and_still_reports_an_unaccounted_deletion(
    deployed_lab, lab_packages_b, cli, tmp_path
):
    a, b = deployed_lab.package_id, lab_packages_b.id
    deploy_b = _ok(cli("--json", "deploy", "--pair", PAIR, "--packages", b, b, "--skip-accept"))["receipt"]
    _ok(cli("--json", "rollback", "--pair", PAIR))
    assert is_active(lab_status(cli), a)
    record = parse_route((Path(deployed_lab.roots()["native"]) / "run" / "route.json").read_bytes(), pair=PAIR)
    assert record is not None and record.evidence_head == deploy_b

    ev = tmp_path / "evidence"
    shutil.copytree(deployed_lab.home / "evidence", ev, symlinks=True, ignore=shutil.ignore_patterns("mirror.git"))
    before = set(EvidenceStore(ev).hashes())

    dry = cli("receipts", "prune", "--evidence", str(ev), "--older-than", "0", "--dry-run", "--archive",
              str(tmp_path / "x.tar.xz"))  # fmt: skip
    assert dry.exit_code == 0 and "would go, freeing" in dry.stdout, dry.output
    assert set(EvidenceStore(ev).hashes()) == before and not (tmp_path / "x.tar.xz").exists()

    archive = tmp_path / "old.tar.xz"
    out = _ok(cli("--json", "receipts", "prune", "--evidence", str(ev), "--older-than", "0", "--yes", "--archive",
                  str(archive)))  # fmt: skip
    gone = {p["hash"] for p in out["pruned"]}
    store = EvidenceStore(ev)
    assert gone and out["receipt"] and not gone & set(store.hashes())
    # the lab pair's route records were read over SSH; the session's other pairs (their own
    # inventories) cannot be, so their receipts are kept and say why
    assert PAIR not in out["blocked"], out["blocked"]
    assert all("is not in the inventory" in why for why in out["blocked"].values()), out["blocked"]
    assert "route record" in out["kept"][deploy_b]  # the head the route record followed, and its writer:
    assert any(s["run_id"] == record.updated_by and s["in_chain"] for s in store.summaries())
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive, "r:xz") as tar:
        assert {m.name for m in tar} == {f"receipts/{h}.json" for h in gone}

    v = cli("--json", "receipts", "verify", "--evidence", str(ev))
    assert v.exit_code == 0 and json.loads(v.stdout)["pruned"] == len(gone), v.output
    assert anchor_problems(record, store, PAIR) == []  # deploy and rollback would trust the route as before

    # a receipt removed without a prune receipt accounting for it is still deleted evidence
    store.path_of(deploy_b).unlink()
    v = cli("receipts", "verify", "--evidence", str(ev))
    assert v.exit_code == 10 and "FAIL [missing-previous]" in v.stdout and "FAIL [deleted]" in v.stdout, v.output
    assert deploy_b in v.stdout
