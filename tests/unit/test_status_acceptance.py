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


def test_a_link_to_another_pair_s_receipt_is_not_this_pair_s_acceptance(tmp_path):
    """A changed head (or `previous`) that leads into another pair's chain: its acceptance is not
    shown as this pair's; the listing's answer (only this pair's receipts) is."""
    store = EvidenceStore(tmp_path / "evidence")
    mine = store.begin("accept", ["accept"], pair="p").finish("failed", "this pair's acceptance")
    store.begin("deploy", ["deploy"], pair="p").finish("passed", "ran")
    other = store.begin("accept", ["accept"], pair="q").finish("passed", "another pair's")
    store.begin("deploy", ["deploy"], pair="q").finish("passed", "ran")
    (store.heads_dir / "p").write_text(store.summaries("q")[-1]["hash"])  # p's head now names q's newest
    got = last_acceptance(store, "p")
    assert got is not None and got["hash"] == mine != other and got["outcome"] == "failed"


def test_the_walk_is_bounded(tmp_path, monkeypatch):
    from orchestrator.cli import status_cmd

    store = EvidenceStore(tmp_path / "evidence")
    acc = store.begin("accept", ["accept"], pair="p").finish("passed", "accepted")
    for _ in range(4):
        store.begin("deploy", ["deploy"], pair="p").finish("passed", "ran")
    monkeypatch.setattr(status_cmd, "WALK_MAX", 2)
    calls: list[str] = []
    real = store.summary_of
    monkeypatch.setattr(store, "summary_of", lambda sha: calls.append(sha) or real(sha))
    got = last_acceptance(store, "p")
    assert got is not None and got["hash"] == acc  # from the listing, after two steps of the walk
    assert len(calls) == 2 + 5, calls  # two links walked, then the listing's five receipts
