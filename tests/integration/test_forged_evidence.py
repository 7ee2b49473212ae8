"""Issue 16 item 6, end to end on the lab's real sshd hosts: `lease release --dead-run` does not
release another operator's live lease on the strength of a forged evidence index, nor of a
receipt planted in this home (it must be reachable from its chain head, and name the lease's
owner). Private install roots (a copy of the inventory), so the lab pair's leases are untouched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import canonical_json
from orchestrator.hosts import leases as L
from orchestrator.remote.pool import TransportPool
from tests.integration.test_leases import private_inventory, write_inventory

pytestmark = pytest.mark.integration

RUN = "20261203T120000Z-4242-feedbeef"


@pytest.fixture
def bobs_live_lease(lab, tmp_path):
    """Another operator's deploy holds both hosts of the pair (run RUN, from another machine)."""
    inv = private_inventory(lab, tmp_path)
    path = write_inventory(inv, tmp_path / "inv.yaml")
    with TransportPool(inv) as pool:
        leases = L.take_leases(L.targets_of(inv, pool, "lab"), "bob@elsewhere", f"pairctl deploy lab (run {RUN})", 3600)
    yield inv, path
    with TransportPool(inv) as pool:
        L.release_leases(L.targets_of(inv, pool, "lab"), leases[0].nonce)


def _still_held(inv) -> list[str]:
    with TransportPool(inv) as pool:
        return [s.state for s in L.show_leases(inv, pool, "lab")]


def test_forged_index_does_not_release_a_live_lease(bobs_live_lease, cli, tmp_path):
    inv, path = bobs_live_lease
    home = tmp_path / "home"
    store = EvidenceStore(home / "evidence")
    sha = store.begin("deploy", ["deploy"], pair="lab").finish("failed", "mine")
    entry = store.index_dir / f"{sha}.json"
    entry.write_text(json.dumps(json.loads(entry.read_text()) | {"run_id": RUN, "outcome": "aborted"}))
    r = cli("lease", "release", "lab", "--dead-run", RUN, home=home, inventory=str(path))
    assert r.exit_code == 5 and "not proven over" in r.stderr and f"no run {RUN}" in r.stderr, r.output
    assert _still_held(inv) == ["held", "held"]


def test_planted_receipt_does_not_release_another_operators_lease(bobs_live_lease, cli, tmp_path):
    inv, path = bobs_live_lease
    home = tmp_path / "home"
    store = EvidenceStore(home / "evidence")
    head = store.begin("deploy", ["deploy"], pair="lab").finish("failed", "mine")
    forged = json.loads(store.path_of(head).read_bytes()) | {"run_id": RUN, "outcome": "aborted", "previous": head}
    data = canonical_json(forged)
    sha = hashlib.sha256(data).hexdigest()
    store.path_of(sha).write_bytes(data)
    # beside the chain: not reachable from the head
    r = cli("lease", "release", "lab", "--dead-run", RUN, home=home, inventory=str(path))
    assert r.exit_code == 5 and "not reachable" in r.stderr, r.output
    # chained and the head moved: consistent here, but the run's evidence names this machine's
    # operator, and the lease is bob's
    (store.heads_dir / "lab").write_text(sha)
    assert store.verify().ok
    r = cli("lease", "release", "lab", "--dead-run", RUN, home=home, inventory=str(path))
    assert r.exit_code == 5 and "bob@elsewhere" in r.stderr and "nothing released" in r.stderr, r.output
    assert _still_held(inv) == ["held", "held"]
    assert Path(home).exists()
