"""Journal and receipt semantics on a store in a temp folder (files only, no processes)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import EvidenceError, Inconclusive
from orchestrator.evidence import EvidenceStore
from orchestrator.evidence.journal import replay
from orchestrator.evidence.receipt import Receipt, seal_bytes
from orchestrator.evidence.timespec import parse_since
from orchestrator.hashing import canonical_json, sha256_bytes


@pytest.fixture
def store(tmp_path) -> EvidenceStore:
    return EvidenceStore(tmp_path / "evidence")


def test_step_records_outcomes_timing_errors_and_data(store):
    j = store.begin("accept", ["accept", "--pair", "lab"], pair="lab", inputs={"pkg": "a" * 64})
    with j.step("identity", host="native") as s:
        s.data["sha256"] = "b" * 64
    with j.step("optional") as s:
        s.skip("not configured")
        raise AssertionError("not reached")
    with pytest.raises(TimeoutError):
        with j.step("props", host="native") as s:
            s.data["partial"] = 1
            raise TimeoutError("read timed out after 10 s")
    with j.step("check") as s:
        s.fail("slot 1 saw slot 0's nonce")
    j.record_step("external", "passed", {"x": 1}, host="rpc", duration_s=0.5)
    sha = j.finish("failed", "props timed out")
    r = store.load(sha)
    assert [(s.name, s.outcome) for s in r.steps] == [
        ("identity", "passed"),
        ("optional", "skipped"),
        ("props", "failed"),
        ("check", "failed"),
        ("external", "passed"),
    ]
    assert r.step("identity").data == {"sha256": "b" * 64} and r.step("identity").host == "native"
    assert r.step("optional").skip_reason == "not configured"
    assert r.step("props").error == "TimeoutError: read timed out after 10 s" and r.step("props").data == {"partial": 1}
    assert r.step("check").error == "slot 1 saw slot 0's nonce"
    assert all(s.duration_s is not None and s.duration_s >= 0 for s in r.steps)
    assert r.outcome == "failed" and r.reason == "props timed out" and r.inputs == {"pkg": "a" * 64}
    assert not store.journal_dir.exists() or not list(store.journal_dir.glob("*.jsonl")), "journal removed once sealed"


def test_receipt_file_is_canonical_named_by_hash_read_only(store):
    j = store.begin("build", ["build"], pair=None)
    j.samples("m", [{"b": 1, "a": [1.5, "x"]}, {"z": None}])
    j.samples("m", [])
    j.samples("n", [{"k": "ü"}])
    sha = j.finish("passed", "ok")
    path = store.path_of(sha)
    data = path.read_bytes()
    assert sha256_bytes(data) == sha
    assert canonical_json(json.loads(data)) == data, "spliced samples give exactly the canonical bytes"
    assert os.stat(path).st_mode & 0o777 == 0o444
    r = store.load(sha)
    assert r.samples == {"m": [{"a": [1.5, "x"], "b": 1}, {"z": None}], "n": [{"k": "ü"}]}
    assert seal_bytes(r) == (sha, data), "a loaded receipt reseals to the same bytes"


def test_chain_links_each_pair_separately(store):
    a1 = store.begin("deploy", [], pair="a").finish("passed", "1")
    b1 = store.begin("deploy", [], pair="b").finish("passed", "1")
    a2 = store.begin("deploy", [], pair="a").finish("failed", "2")
    n1 = store.begin("build", [], pair=None).finish("passed", "n")
    assert store.load(a1).previous is None and store.load(b1).previous is None
    assert store.load(a2).previous == a1
    assert store.load(n1).previous is None
    assert store.latest("a").sha256 == a2 and store.latest("b").sha256 == b1 and store.latest(None).sha256 == n1
    assert [r.sha256 for r in store.iter(pair="a")] == [a1, a2]
    assert store.verify().ok


def test_set_fields_are_top_level_and_timed_before_samples(store):
    j = store.begin("qualify", [], pair="lab")
    j.set("plan_sha256", "c" * 64)
    j.samples("arm-1", [{"tg": 1.0}])
    with pytest.raises(ValueError):
        j.set("outcome", "passed")
    r = store.load(j.finish("passed", "ok"))
    assert r.plan_sha256 == "c" * 64 and r.extra_fields() == {"plan_sha256": "c" * 64}
    assert r.fields_set[0].key == "plan_sha256" and r.fields_set[0].at <= r.first_sample_at


def test_context_manager_finishes_on_exception_and_inconclusive(store):
    with pytest.raises(RuntimeError):
        with store.begin("deploy", [], pair="lab") as j:
            raise RuntimeError("boom")
    assert store.load(j.receipt_hash).outcome == "failed" and "boom" in store.load(j.receipt_hash).reason
    with pytest.raises(Inconclusive):
        with store.begin("qualify", [], pair="lab") as j2:
            raise Inconclusive("only 2 valid pairs")
    assert store.load(j2.receipt_hash).outcome == "inconclusive"
    with store.begin("status", [], pair="lab") as j3:
        pass
    assert store.load(j3.receipt_hash).outcome == "passed"


def test_finish_twice_and_bad_outcome_refused(store):
    j = store.begin("x", [], pair="lab")
    with pytest.raises(ValueError):
        j.finish("great", "no such outcome")
    j.finish("passed", "ok")
    with pytest.raises(EvidenceError):
        j.finish("passed", "again")


def test_secrets_masked_in_argv_step_data_notes_and_errors(store):
    j = store.begin("deploy", ["deploy", "--api-key", "s3cr3t"], pair="lab")
    with pytest.raises(ValueError):
        with j.step("start") as s:
            s.data["argv"] = ["llama-server", "--api-key", "s3cr3t"]
            s.data["api_key"] = "s3cr3t"
            raise ValueError("server refused --api-key s3cr3t")
    j.note("used --token=s3cr3t")
    j.samples("m", [{"cmd": "x --api-key s3cr3t", "n_tokens": 3}])
    sha = j.finish("failed", "Bearer s3cr3t rejected")
    assert b"s3cr3t" not in store.path_of(sha).read_bytes()
    assert store.load(sha).samples["m"][0]["n_tokens"] == 3


def test_replay_rebuilds_the_same_receipt_and_drops_a_torn_last_line(store, tmp_path):
    j = store.begin("accept", [], pair="lab")
    with j.step("one") as s:
        s.data["v"] = 1
    j.samples("one", [{"t": 0.5}])
    state_live = j.state
    journal_copy = tmp_path / "copy.jsonl"
    journal_copy.write_bytes(j.path.read_bytes() + b'{"ev":"note","se')
    state, problems = replay(journal_copy)
    assert problems and "incomplete" in problems[0]
    live = state_live.seal(outcome="aborted", reason="r", previous=None)
    replayed = state.seal(outcome="aborted", reason="r", previous=None)
    assert live[:2] == replayed[:2]
    j.finish("passed", "ok")


def test_resolve_prefix_and_errors(store):
    sha = store.begin("x", [], pair="lab").finish("passed", "ok")
    assert store.resolve(sha[:8]) == sha
    with pytest.raises(EvidenceError):
        store.resolve("zz")
    with pytest.raises(EvidenceError):
        store.load("0" * 64)


def test_bad_pair_name_cannot_name_a_chain(store):
    with pytest.raises(EvidenceError):
        store.begin("x", [], pair="../etc")


def test_parse_since():
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert parse_since("2h", now=now) == datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    assert parse_since("3d", now=now).day == 29
    assert parse_since("2026-12-01T10:00Z") == datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    with pytest.raises(ValueError):
        parse_since("yesterday")


def test_receipt_model_rejects_unknown_outcome():
    with pytest.raises(ValueError):
        Receipt.model_validate(
            {
                "run_id": "r",
                "command": "c",
                "argv": [],
                "host": {"hostname": "h", "pid": 1},
                "started_at": "t",
                "finished_at": "t",
                "outcome": "great",
                "reason": "",
            }
        )


def test_threads_share_one_journal_safely(store):
    import threading

    j = store.begin("deploy", [], pair="lab")

    def work(host: str) -> None:
        for i in range(40):
            with j.step(f"{host}-{i}", host=host) as s:
                s.data["i"] = i
            j.samples(f"{host}-{i}", [{"i": i}])

    threads = [threading.Thread(target=work, args=(h,)) for h in ("native", "rpc")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live = j.state.seal(outcome="passed", reason="ok", previous=None)[:2]
    replayed = replay(j.path)[0].seal(outcome="passed", reason="ok", previous=None)[:2]
    assert live == replayed
    r = store.load(j.finish("passed", "ok"))
    assert len(r.steps) == 80 and all(s.outcome == "passed" for s in r.steps) and len(r.samples) == 80


def test_summaries_come_from_the_receipts_never_the_index(store):
    """The index is written as a cache for other tools; a forged or missing entry changes nothing."""
    sha = store.begin("deploy", [], pair="lab").finish("failed", "broken")
    assert (store.index_dir / f"{sha}.json").exists()
    (store.index_dir / f"{sha}.json").write_text(json.dumps({"hash": sha, "outcome": "passed", "run_id": "x"}))
    [s] = store.summaries(pair="lab")
    assert s["hash"] == sha and s["outcome"] == "failed" and s["in_chain"]
    for p in store.index_dir.iterdir():
        p.unlink()
    assert store.summaries(pair="lab")[0]["outcome"] == "failed"
    assert store.summaries(pair="other") == []


def test_a_dropped_journal_is_sealed_aborted_and_frees_the_pair(store):
    import gc

    j = store.begin("deploy", [], pair="lab")
    with j.step("one"):
        pass
    del j
    gc.collect()
    [r] = list(store.iter(pair="lab"))
    assert r.outcome == "aborted" and "without finish" in r.reason and r.steps[0].outcome == "passed"
    store.begin("deploy", [], pair="lab").finish("passed", "the pair is free again")


def test_secret_named_set_fields_are_masked(store):
    j = store.begin("x", [], pair="lab")
    j.set("hf_token", "s3cr3t")
    sha = j.finish("passed", "ok")
    assert b"s3cr3t" not in store.path_of(sha).read_bytes()


def test_empty_journal_of_a_dead_process_is_removed(store):
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    store.journal_dir.mkdir(parents=True)
    empty = store.journal_dir / f"20261202T000000Z-{p.pid}-abcdef.jsonl"
    empty.write_bytes(b'{"ev":"beg')
    assert store.recover_aborted() == [] and not empty.exists()
    mine = store.journal_dir / f"20261202T000000Z-{os.getpid()}-abcdef.jsonl"
    mine.write_bytes(b"")
    store.recover_aborted()
    assert mine.exists(), "a live process's journal is never removed"


def test_unserialisable_step_data_fails_the_step_visibly(store):
    j = store.begin("x", [], pair="lab")
    with pytest.raises(TypeError):
        with j.step("bad") as s:
            s.data["obj"] = object()
    r = store.load(j.finish("failed", "bug"))
    assert r.step("bad").outcome == "failed" and "not JSON-serialisable" in r.step("bad").error


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12,
)


def test_spliced_samples_equal_canonical_json_for_any_rows(tmp_path):
    """The 100k-sample fast path writes samples as pre-serialised text: it must be byte-identical
    to canonical_json of the whole receipt, for any JSON rows, step names and call splits."""
    counter = iter(range(10**6))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        st.dictionaries(st.text(min_size=1, max_size=6), st.lists(st.lists(_json, max_size=3), max_size=3), max_size=3)
    )
    def check(calls):
        store = EvidenceStore(tmp_path / f"s{next(counter)}")
        j = store.begin("x", [], pair="lab")
        for step, chunks in calls.items():
            for rows in chunks:
                j.samples(step, rows)
        sha = j.finish("passed", "ok")
        data = store.path_of(sha).read_bytes()
        assert canonical_json(json.loads(data)) == data and sha256_bytes(data) == sha

    check()


def test_operator_disk_full_fails_the_step_once_then_keeps_events_until_there_is_room(store, monkeypatch):
    """Issue 33 item 6: the operator's own disk full mid-run was an internal error (exit 1) that
    left an unaccepted pair running. The first write without room raises EvidenceError naming the
    journal (the step fails, the run rolls back); later writes (the rollback's) are kept and
    written once there is room, and the receipt then holds all of them."""
    import errno as errno_

    from orchestrator.evidence import journal as journal_mod

    real_write, full = os.write, {"on": False}

    def write(fd, data):
        if full["on"]:
            raise OSError(errno_.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(journal_mod.os, "write", write)
    j = store.begin("deploy", ["deploy"], pair="lab")
    full["on"] = True
    with pytest.raises(EvidenceError) as ei:
        j.note("accept: sample rows")
    assert "No space left on device" in ei.value.message and str(j.path) in ei.value.message
    j.note("rolling back")  # kept, not raised: the rollback goes on
    full["on"] = False
    h = j.finish("failed", "rolled back")
    notes = store.load(h).notes
    assert "rolling back" in str(notes) and "accept: sample rows" in str(notes)


def test_operator_disk_still_full_at_the_end_says_what_the_run_did(store, monkeypatch):
    import errno as errno_

    from orchestrator.evidence import journal as journal_mod

    def write(fd, data):
        raise OSError(errno_.ENOSPC, "No space left on device")

    j = store.begin("deploy", ["deploy"], pair="lab")
    monkeypatch.setattr(journal_mod.os, "write", write)
    with pytest.raises(EvidenceError):
        j.note("accept")
    with pytest.raises(EvidenceError) as ei:
        j.finish("failed", "deploy failed at step 'accept' and was rolled back: A is running again, verified")
    assert "rolled back" in ei.value.message and "receipt could not be written" in ei.value.message
    assert str(j.path) in ei.value.message and "seals that journal" in (ei.value.hint or "")
