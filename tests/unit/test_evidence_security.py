"""Issue 16 items 6 and 7 (evidence side): the index never decides, tampering that can be seen
locally is seen, hostile JSON is "does not verify" (exit 10), never a crash. Pure: a real
EvidenceStore in a temporary folder, no hosts."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import canonical_json

ME = f"{getpass.getuser()}@{socket.gethostname()}"


@pytest.fixture
def store(tmp_path) -> EvidenceStore:
    return EvidenceStore(tmp_path / "evidence")


def _chain(store: EvidenceStore, outcomes=("passed", "failed", "failed")) -> list[str]:
    return [
        store.begin("deploy", ["deploy", str(i)], pair="lab").finish(o, f"run {i} {o}") for i, o in enumerate(outcomes)
    ]


def _obj(store: EvidenceStore, sha: str) -> dict:
    return json.loads(store.path_of(sha).read_bytes())


def _put(store: EvidenceStore, obj: dict) -> str:
    """Write a receipt as a forger would: canonical JSON named by its own hash."""
    data = canonical_json(obj)
    sha = hashlib.sha256(data).hexdigest()
    store.path_of(sha).write_bytes(data)
    return sha


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "--home", str(home), "receipts", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_deeply_nested_receipt_is_exit_10_not_recursion_error(store, tmp_path):
    _chain(store, ("passed",))
    data = b"[" * 100_000
    (store.receipts_dir / f"{hashlib.sha256(data).hexdigest()}.json").write_bytes(data)
    rep = store.verify()
    assert not rep.ok and any(p.kind == "invalid" and "nested" in p.message for p in rep.problems)
    assert len(store.summaries()) == 1
    for args in (["verify"], ["list"]):
        r = _cli(*args, "--evidence", str(store.root), home=tmp_path / "home")
        assert "RecursionError" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert _cli("verify", "--evidence", str(store.root), home=tmp_path / "home").returncode == 10


def test_deep_journal_line_is_an_evidence_error(store):
    from orchestrator.errors import EvidenceError
    from orchestrator.evidence.journal import replay

    store.journal_dir.mkdir(parents=True, exist_ok=True)
    p = store.journal_dir / "x.jsonl"
    p.write_bytes(b"[" * 100_000 + b"\n" + b"{}\n")
    with pytest.raises(EvidenceError, match="nested too deeply"):
        replay(p)


def test_forged_index_changes_no_outcome_and_proves_no_run_over(store):
    shas = _chain(store)
    for sha in shas:
        entry = store.index_dir / f"{sha}.json"
        forged = json.loads(entry.read_text()) | {"outcome": "passed", "run_id": "run-of-someone-else"}
        entry.write_text(json.dumps(forged))
    assert [s["outcome"] for s in store.summaries("lab")] == ["passed", "failed", "failed"]
    assert store.run_status("run-of-someone-else")[0] == "unknown"


def test_planted_receipt_beside_the_chain_proves_nothing(store):
    shas = _chain(store)
    forged = _obj(store, shas[-1]) | {
        "run_id": "live-run",
        "outcome": "passed",
        "previous": shas[-1],
        "host": {"hostname": "elsewhere", "pid": 1, "user": "bob"},
    }
    sha = _put(store, forged)
    state, why, _ = store.run_record("live-run")
    assert state == "unknown" and "not reachable" in why
    assert not store.verify().ok and any(p.kind == "beyond-head" for p in store.verify().problems)
    [row] = [s for s in store.summaries("lab") if s["hash"] == sha]
    assert row["in_chain"] is False


def test_run_record_names_the_owner_leases_carry(store):
    j = store.begin("deploy", ["deploy"], pair="lab")
    run_id = j.run_id
    j.finish("failed", "x")
    state, _, owner = store.run_record(run_id)
    assert state == "ended" and owner == ME


def test_deleting_the_newest_receipt_and_moving_the_head_back_is_seen(store):
    shas = _chain(store)
    store.path_of(shas[-1]).chmod(0o600)
    store.path_of(shas[-1]).unlink()
    (store.heads_dir / "lab").write_text(shas[-2])
    rep = store.verify()
    assert not rep.ok and [p.kind for p in rep.problems] == ["deleted"], rep.problems


def test_deleting_a_whole_chain_is_seen(store):
    shas = _chain(store)
    for sha in shas:
        store.path_of(sha).unlink()
    (store.heads_dir / "lab").unlink()
    rep = store.verify()
    assert not rep.ok and {p.kind for p in rep.problems} == {"deleted"} and len(rep.problems) == 3


def test_rehashing_a_chain_after_editing_an_old_receipt_is_seen(store):
    shas = _chain(store)
    previous = None
    for i, sha in enumerate(shas):
        obj = _obj(store, sha)
        if i == 1:
            obj["outcome"], obj["reason"] = "passed", "all good"
        obj["previous"] = previous
        store.path_of(sha).unlink()
        previous = _put(store, obj)
    (store.heads_dir / "lab").write_text(previous)
    rep = store.verify()
    assert not rep.ok and {p.kind for p in rep.problems} == {"deleted"}


def test_untampered_store_verifies(store):
    _chain(store)
    assert store.verify().ok


# -- item 13: a derived record's outcome is computed --------------------------------------------


def _failed_deploy(store: EvidenceStore) -> str:
    """A deploy whose acceptance failed, with its plan and identities, as the engine records it."""
    j = store.begin("deploy", ["deploy"], pair="lab")
    j.set("plan", [{"name": n} for n in ("preflight", "upload", "start", "check:cached_continuation", "accept")])
    j.identity("lab-native", {"lab-native": {"exe_sha256": "a" * 64}, "server": {"build_info": "b1-abc"}})
    for name, outcome in (
        ("preflight", "passed"),
        ("upload", "passed"),
        ("start", "passed"),
        ("check:cached_continuation", "passed"),
        ("accept", "failed"),
    ):
        j.record_step(name, outcome, {}, error="broken" if outcome == "failed" else None)
    return j.finish("failed", "acceptance failed")


def test_derived_record_reusing_one_check_is_incomplete_not_passed(store):
    original = _failed_deploy(store)
    sha = store.derive(original, ["check:cached_continuation"], "reuse the cached check")
    d = store.load(sha)
    assert d.outcome == "incomplete" and "not covered" in d.reason
    assert set(d.coverage["missing"]) == {"preflight", "upload", "start", "accept"}
    # an explicit "passed" cannot grant it either
    granted = store.derive(original, ["check:cached_continuation"], "x", outcome="passed")
    assert store.load(granted).outcome == "incomplete"
    assert store.verify().ok


def test_derived_record_passes_only_when_covered_against_the_same_identities(store):
    original = _failed_deploy(store)
    reuse = ["preflight", "upload", "start", "check:cached_continuation"]
    fresh = [{"name": "accept", "outcome": "passed", "data": {}}]
    same = [("lab-native", {"lab-native": {"exe_sha256": "a" * 64}, "server": {"build_info": "b1-abc"}})]
    other = [("lab-native", {"lab-native": {"exe_sha256": "c" * 64}, "server": {"build_info": "b1-abc"}})]
    assert store.load(store.derive(original, reuse, "no identity", fresh_steps=fresh)).outcome == "incomplete"
    d = store.load(store.derive(original, reuse, "other binary", fresh_steps=fresh, identities=other))
    assert d.outcome == "incomplete" and "identities" in d.reason
    covered = store.derive(original, reuse, "re-ran accept", fresh_steps=fresh, identities=same)
    assert store.load(covered).outcome == "passed"
    failing = [{"name": "accept", "outcome": "failed", "data": {}}]
    assert store.load(store.derive(original, reuse, "x", fresh_steps=failing, identities=same)).outcome == "failed"


def test_since_too_far_back_is_a_usage_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--home", str(tmp_path), "receipts", "list", "--since", "99999999999w"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "before year 1" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_journal_another_user_planted_proves_no_run_dead(store, tmp_path):
    """`lease release --dead-run` frees a run's leases once its journal shows its process dead.
    A journal written by another user (a home others can write to) is skipped, not believed; the
    same bytes owned by this user do prove it (so the test can fail)."""
    j = store.begin("deploy", ["deploy"], pair="lab")
    real = next(store.journal_dir.glob("*.jsonl"))
    header = json.loads(real.read_text().splitlines()[0])
    text = real.read_text().replace(header["run_id"], "victim-run")
    text = text.replace(f'"pid":{header["host"]["pid"]},', '"pid":999999999,')
    assert '"pid":999999999,' in text
    forged = store.journal_dir / "20261204T000000-999999999-forged.jsonl"
    forged.write_text(text)
    assert store.run_status("victim-run")[0] == "dead"  # believed while it is this user's file
    os.chown(forged, 65534, 65534)
    assert store.run_status("victim-run")[0] == "unknown"
    j.finish("passed", "ok")
