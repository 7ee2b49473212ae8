"""`pairctl status`'s last acceptance per pair (cli/status_cmd.last_acceptance) reads the pair's
receipts back from its chain head to its newest `accept`, not every receipt in the store: a status
of many pairs over a big store read the whole store once per pair. The answer is the one the full
listing gives, also where the chain breaks (that is left to the listing)."""

from __future__ import annotations

from orchestrator.cli.status_cmd import last_acceptance
from orchestrator.evidence import safejson
from orchestrator.evidence.store import EvidenceStore


def _newest_accept(store: EvidenceStore, pair: str):
    return next(s for s in store.summaries(pair)[::-1] if s["command"] == "accept")


def test_last_acceptance_reads_only_the_pair_s_newest_receipts(tmp_path, monkeypatch):
    store = EvidenceStore(tmp_path / "evidence")
    store.begin("accept", ["accept"], pair="p").finish("failed", "an older acceptance")
    store.begin("accept", ["accept"], pair="p").finish("passed", "the newest acceptance")
    for i in range(150):  # the rest of a busy store: other pairs' runs, and this pair's since
        store.begin("deploy", ["deploy"], pair="p" if i % 50 == 0 else f"q{i % 7}").finish("passed", "ran")
    store.begin("accept", ["accept"], pair="q1").finish("passed", "another pair's")
    want = _newest_accept(store, "p")
    reads: list[str] = []
    real = safejson.read_receipt
    monkeypatch.setattr(safejson, "read_receipt", lambda path, *a, **k: reads.append(str(path)) or real(path, *a, **k))
    got = last_acceptance(store, "p")
    assert got is not None and {k: got[k] for k in ("hash", "outcome", "finished_at")} == {
        k: want[k] for k in ("hash", "outcome", "finished_at")
    }
    assert got["outcome"] == "passed" and len(reads) <= 4, reads  # 3 deploys since, then the accept
    assert last_acceptance(store, "none-yet") is None


def test_a_broken_chain_is_left_to_the_full_listing(tmp_path):
    store = EvidenceStore(tmp_path / "evidence")
    store.begin("accept", ["accept"], pair="p").finish("passed", "accepted")
    bad = store.begin("deploy", ["deploy"], pair="p").finish("passed", "ran")
    store.begin("deploy", ["deploy"], pair="p").finish("passed", "ran")
    store.path_of(bad).write_bytes(store.path_of(bad).read_bytes().replace(b"ran", b"RAN"))  # no longer verifies
    got = last_acceptance(store, "p")
    assert got is not None and got["hash"] == _newest_accept(store, "p")["hash"]
