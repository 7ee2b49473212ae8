"""The evidence store on a real disk with real processes: tampering, deletion, SIGKILL, derive.

These need no lab hosts; they are integration tests because they kill real processes and go
through the real CLI (`cli` fixture) against a real store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode
from orchestrator.evidence import EvidenceBusy, EvidenceStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path) -> EvidenceStore:
    return EvidenceStore(tmp_path / "evidence")


def _chain(store: EvidenceStore, n: int, pair: str = "lab") -> list[str]:
    out = []
    for i in range(n):
        with store.begin("deploy", ["deploy", "--pair", pair], pair=pair, inputs={"pkg": f"{i:064x}"}) as j:
            with j.step("activate", host="native") as s:
                s.data["i"] = i
            j.samples("activate", [{"i": i, "t": 0.1 * i}])
        out.append(j.receipt_hash)
    return out


def _verify(cli, store: EvidenceStore):
    return cli("receipts", "verify", "--evidence", str(store.root))


# -- verify ---------------------------------------------------------------------------------------
def test_verify_passes_on_whole_chains(cli, store):
    _chain(store, 3)
    _chain(store, 2, pair="lab2")
    r = _verify(cli, store)
    assert r.exit_code == 0, r.output
    assert "lab (3)" in r.stdout and "lab2 (2)" in r.stdout and "ok:" in r.stdout


def test_one_changed_byte_fails_verify_and_names_the_file(cli, store):
    hashes = _chain(store, 3)
    path = store.path_of(hashes[1])
    data = bytearray(path.read_bytes())
    i = data.index(b'"i":1')
    data[i + 4] = ord("7")  # one digit of the step data
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    r = _verify(cli, store)
    assert r.exit_code == ExitCode.EVIDENCE, r.output
    assert str(path) in r.stderr and "does not match its name" in r.stderr  # the first problem, in the error
    assert f"[changed] receipt file {path}" in r.stdout


def test_deleted_middle_receipt_breaks_the_chain_and_is_named(cli, store):
    a, b, c = _chain(store, 3)
    os.chmod(store.path_of(b), 0o644)
    store.path_of(b).unlink()
    r = _verify(cli, store)
    assert r.exit_code == ExitCode.EVIDENCE, r.output
    assert "missing-previous" in r.stdout
    assert str(store.path_of(c)) in r.stderr and b in r.stderr  # the receipt whose link broke and the missing hash


def test_deleted_newest_receipt_is_caught_by_the_head_cross_check(cli, store):
    a, b = _chain(store, 2)
    store.path_of(b).unlink()
    r = _verify(cli, store)
    assert r.exit_code == ExitCode.EVIDENCE and "head-missing" in r.stdout and b in r.stdout
    # A run is never blocked by it (a rollback may depend on running), and the gap stays visible.
    c = store.begin("rollback", [], pair="lab").finish("passed", "ok")
    assert store.load(c).previous == b
    r = _verify(cli, store)
    assert r.exit_code == ExitCode.EVIDENCE and str(store.path_of(c)) in r.stderr and b in r.stderr


def test_verify_does_not_trust_heads(cli, store):
    a, b, c = _chain(store, 3)
    (store.heads_dir / "lab").write_text(c)  # head fine, but remove the middle: the walk must still fail
    store.path_of(b).unlink()
    assert _verify(cli, store).exit_code == ExitCode.EVIDENCE


# -- SIGKILL mid-run ------------------------------------------------------------------------------
_KILLED_RUN = textwrap.dedent(
    """
    import sys, time
    from orchestrator.evidence import EvidenceStore
    store = EvidenceStore(sys.argv[1])
    pair = sys.argv[2] if sys.argv[2] != "-" else None
    j = store.begin("qualify", ["qualify", "--pair", str(pair), "--api-key", "s3cr3t"], pair=pair, """
    """inputs={"plan": "p" * 64})
    j.set("plan_sha256", "p" * 64)
    with j.step("snapshot", host="native") as s:
        s.data["route_revision"] = 7
    with j.step("measure") as s:
        s.data["pairs"] = 5
        j.samples("measure", [{"pair": i, "tg_tps": 100.0 + i} for i in range(30)])
    with j.step("restore", host="native") as s:
        print("ready", flush=True)
        time.sleep(120)
    """
)


def _start_killable(tmp_path: Path, root: Path, pair: str | None) -> subprocess.Popen:
    script = tmp_path / "killed_run.py"
    script.write_text(_KILLED_RUN)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root), pair or "-"], stdout=subprocess.PIPE, env=env, text=True
    )
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"child did not get ready (rc={proc.poll()})"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def test_sigkilled_run_becomes_an_aborted_receipt_with_its_completed_steps(cli, tmp_path, store):
    before = _chain(store, 1)[0]
    proc = _start_killable(tmp_path, store.root, "lab")
    try:
        with pytest.raises(EvidenceBusy):  # the live child holds the pair's chain
            store.begin("deploy", [], pair="lab")
        assert store.recover_aborted("lab") == []  # alive: left alone
    finally:
        _kill(proc)
    journals = list(store.journal_dir.glob("*.jsonl"))
    assert len(journals) == 1, "the killed run left its journal"
    listed = cli("receipts", "list", "--evidence", str(store.root))
    assert "killed; sealed as aborted by the next command" in listed.stdout, listed.output

    j = store.begin("deploy", ["deploy"], pair="lab")
    assert len(j.recovered) == 1, "the next run on the pair noticed and sealed it"
    aborted = store.load(j.recovered[0])
    assert aborted.outcome == "aborted" and aborted.recovered
    assert f"process {proc.pid}" in aborted.reason and "restore" in aborted.reason
    assert [(s.name, s.outcome) for s in aborted.steps] == [
        ("snapshot", "passed"),
        ("measure", "passed"),
        ("restore", "aborted"),
    ]
    assert aborted.step("snapshot").data == {"route_revision": 7} and aborted.step("snapshot").host == "native"
    assert len(aborted.samples["measure"]) == 30 and aborted.plan_sha256 == "p" * 64
    assert aborted.host.pid == proc.pid and aborted.argv[-1] == "***"
    assert aborted.previous == before, "the aborted receipt sits in the pair's chain"
    assert not journals[0].exists()

    new = j.finish("passed", "ok")
    assert store.load(new).previous == aborted.sha256
    assert store.verify().ok


def test_recover_aborted_without_a_new_run_and_for_pairless_runs(tmp_path, store):
    proc = _start_killable(tmp_path, store.root, None)
    _kill(proc)
    assert [u["alive"] for u in store.unsealed()] == [False]
    sealed = store.recover_aborted()
    assert len(sealed) == 1 and store.load(sealed[0]).outcome == "aborted" and store.load(sealed[0]).pair is None
    assert store.recover_aborted() == [] and store.unsealed() == []


# -- derive ---------------------------------------------------------------------------------------
def _failed_after_samples(store: EvidenceStore) -> str:
    """The field report's case: all samples taken, then the last configuration read timed out."""
    j = store.begin("qualify", ["qualify", "--pair", "lab"], pair="lab", inputs={"plan": "p" * 64})
    j.set("plan_sha256", "p" * 64)
    with j.step("measure") as s:
        s.data["pairs"] = 5
        j.samples("measure", [{"pair": i // 2, "arm": "ab"[i % 2], "tg_tps": 100.0 + i} for i in range(30)])
    with j.step("snapshot-before-write", host="native") as s:
        s.data["route"] = {"revision": 7}
    with pytest.raises(TimeoutError):
        with j.step("final-config-read", host="native"):
            raise TimeoutError("configuration read timed out after 10 s")
    return j.finish("failed", "final configuration read timed out")


def test_derive_references_resolve_and_the_original_is_byte_identical(cli, store, tmp_path):
    original = _failed_after_samples(store)
    path = store.path_of(original)
    before_bytes, before_stat = path.read_bytes(), os.stat(path)
    fresh = tmp_path / "fresh.json"
    fresh.write_text('[{"name": "final-config-read", "outcome": "passed", "data": {"route": {"revision": 7}}}]')

    r = cli(
        "receipts",
        "derive",
        "--evidence",
        str(store.root),
        "--from",
        original[:10],
        "--reuse",
        "measure",
        "--reuse",
        "snapshot-before-write",
        "--reason",
        "config read timed out after all samples; snapshot matches",
        "--fresh",
        str(fresh),
        "--json",
    )
    assert r.exit_code == 0, r.output
    import json

    derived = json.loads(r.stdout)["hash"]
    assert path.read_bytes() == before_bytes
    after_stat = os.stat(path)
    assert (after_stat.st_ino, after_stat.st_mtime_ns, after_stat.st_mode) == (
        before_stat.st_ino,
        before_stat.st_mtime_ns,
        before_stat.st_mode,
    )

    d = store.load(derived)
    assert d.derived_from == original and d.outcome == "passed" and d.previous == original
    assert set(d.reused_steps) == {"measure", "snapshot-before-write"} and d.fresh_steps == ["final-config-read"]
    assert all(ref.from_ == original for ref in d.reused_steps.values())
    assert d.samples == {}, "reused samples are referenced, not copied"
    rec, rows = store.step_view(derived, "measure")  # follows the reference, checks both hashes
    assert rec.data == {"pairs": 5} and len(rows) == 30 and rows == store.load(original).samples["measure"]
    assert _verify(cli, store).exit_code == 0

    show = cli("receipts", "show", derived[:12], "--evidence", str(store.root))
    assert show.exit_code == 0 and f"derived from {original}" in show.stdout and "final-config-read" in show.stdout

    # A derived record whose original disappears is a dangling reference.
    path.unlink()
    bad = _verify(cli, store)
    assert (
        bad.exit_code == ExitCode.EVIDENCE
        and "dangling-reference" in bad.stdout
        and str(store.path_of(derived)) in bad.stdout
    )


def test_reusing_a_failed_or_missing_step_is_refused(cli, store):
    original = _failed_after_samples(store)
    n = len(store.hashes())
    r = cli(
        "receipts",
        "derive",
        "--evidence",
        str(store.root),
        "--from",
        original,
        "--reuse",
        "measure",
        "--reuse",
        "final-config-read",
        "--reason",
        "try",
    )
    assert r.exit_code == ExitCode.EVIDENCE and "refusing to reuse step 'final-config-read'" in r.stderr
    r = cli(
        "receipts",
        "derive",
        "--evidence",
        str(store.root),
        "--from",
        original,
        "--reuse",
        "never-ran",
        "--reason",
        "try",
    )
    assert r.exit_code == ExitCode.EVIDENCE and "was not run" in r.stderr
    assert len(store.hashes()) == n, "a refused derive writes nothing"
    assert store.verify().ok


def test_derive_through_a_derived_record_points_at_the_source(store):
    original = _failed_after_samples(store)
    d1 = store.derive(original, ["measure"], "first recovery")
    d2 = store.derive(d1, ["measure"], "second")
    assert store.load(d2).reused_steps["measure"].from_ == original
    assert len(store.step_view(d2, "measure")[1]) == 30


# -- list / show ----------------------------------------------------------------------------------
def test_list_filters_and_show(cli, store):
    _chain(store, 2)
    _chain(store, 1, pair="other")
    r = cli("receipts", "list", "--evidence", str(store.root), "--pair", "lab", "--since", "1h", "--json")
    import json

    rows = json.loads(r.stdout)
    assert r.exit_code == 0 and len(rows) == 2 and {x["pair"] for x in rows} == {"lab"}
    assert (
        json.loads(
            cli("receipts", "list", "--evidence", str(store.root), "--since", "2099-01-01T00:00Z", "--json").stdout
        )
        == []
    )
    table = cli("receipts", "list", "--evidence", str(store.root))
    assert table.exit_code == 0 and rows[0]["hash"][:12] in table.stdout and "3 receipt(s)" in table.stdout
    show = cli("receipts", "show", rows[0]["hash"][:8], "--evidence", str(store.root))
    assert show.exit_code == 0 and "activate" in show.stdout and "samples   activate: 1" in show.stdout
    full = json.loads(cli("receipts", "show", rows[0]["hash"], "--evidence", str(store.root), "--json").stdout)
    assert full["hash"] == rows[0]["hash"] and full["steps"][0]["name"] == "activate"
    assert (
        cli("receipts", "show", "ffff", "--evidence", str(store.root)).exit_code == ExitCode.USAGE
    )  # names no receipt: a usage error (issue 34)
    assert cli("receipts", "list", "--evidence", str(store.root), "--since", "soon").exit_code == ExitCode.USAGE


def test_a_receipt_added_outside_pairctl_is_caught(cli, store):
    """A well-formed receipt with a correct name, chained onto the real tip, but never made the head."""
    import json

    from orchestrator.hashing import canonical_json, sha256_bytes

    a, b = _chain(store, 2)
    forged = json.loads(store.path_of(b).read_bytes())
    forged.update(previous=b, reason="forged", run_id="forged")
    data = canonical_json(forged)
    store.path_of(sha256_bytes(data)).write_bytes(data)
    r = _verify(cli, store)
    assert r.exit_code == ExitCode.EVIDENCE and "beyond-head" in r.stdout and sha256_bytes(data) in r.stderr


def test_non_canonical_receipt_is_invalid_even_with_a_matching_name(cli, store):
    import json

    from orchestrator.hashing import sha256_bytes

    (a,) = _chain(store, 1)
    data = json.dumps(json.loads(store.path_of(a).read_bytes()), indent=1).encode()
    store.path_of(sha256_bytes(data)).write_bytes(data)
    r = _verify(cli, store)
    assert r.exit_code == ExitCode.EVIDENCE and "not canonical" in r.output


# -- crashes while sealing ------------------------------------------------------------------------
def test_interrupted_head_update_is_a_warning_and_repaired_by_the_next_run(cli, store):
    a, b = _chain(store, 2)
    (store.heads_dir / "lab").write_text(a)  # died after linking b, before moving the head
    (store.heads_dir / "lab.pending").write_text(b)
    r = _verify(cli, store)
    assert r.exit_code == 0 and "not yet its head" in r.stdout
    c = store.begin("deploy", [], pair="lab").finish("passed", "ok")
    assert store.load(c).previous == b, "no fork: the head was repaired first"
    assert (store.heads_dir / "lab").read_text() == c and not (store.heads_dir / "lab.pending").exists()
    assert store.verify().ok


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _orphan_journal(store: EvidenceStore, *, finished: bool) -> tuple[Path, str]:
    """A journal as a process that died right after `finish` was journaled would leave it."""
    import json

    j = store.begin("deploy", ["deploy"], pair="lab")
    with j.step("activate"):
        pass
    if finished:
        j._emit("finish", outcome="failed", reason="health check failed")
    run_id = j.run_id
    j.close_unfinished()
    lines = j.path.read_text().splitlines()
    begin = json.loads(lines[0])
    begin["host"].update(pid=_dead_pid(), start_ticks=None)
    j.path.write_text("\n".join([json.dumps(begin), *lines[1:]]) + "\n")
    return j.path, run_id


def test_journal_that_finished_but_was_not_sealed_keeps_its_own_outcome(store):
    path, run_id = _orphan_journal(store, finished=True)
    [sha] = store.recover_aborted("lab")
    r = store.load(sha)
    assert r.run_id == run_id and r.outcome == "failed" and r.reason.startswith("health check failed (sealed later")
    assert not path.exists()


def test_two_commands_recovering_one_killed_run_at_once_seal_it_once(store):
    """Two `pairctl build` on one home after a killed run: both list its journal as dead, one
    takes the chain's lock and seals it, the other gets the lock next and finds the journal
    gone. It ended in an internal FileNotFoundError; it now finds nothing left to seal."""
    path, run_id = _orphan_journal(store, finished=False)
    winner = EvidenceStore(store.root)
    won: list[str] = []

    class Loser(EvidenceStore):
        def _lock(self, chain: str):  # type: ignore[no-untyped-def]
            won.extend(winner.recover_aborted(chain))  # the other command seals it first
            return super()._lock(chain)

    assert Loser(store.root).recover_aborted("lab") == []
    assert len(won) == 1 and store.load(won[0]).run_id == run_id and store.load(won[0]).outcome == "aborted"
    assert not path.exists() and store.hashes() == won


def test_journal_already_sealed_is_only_removed(store):
    import json

    path, run_id = _orphan_journal(store, finished=True)
    # Seal it as the dead process had (its receipt became the head), then leave the journal behind.
    copy = path.read_bytes()
    [sha] = store.recover_aborted("lab")
    path.write_bytes(copy)
    assert store.recover_aborted("lab") == [] and not path.exists()
    assert len(store.hashes()) == 1 and json.loads(store.path_of(sha).read_bytes())["run_id"] == run_id


def test_derive_with_fields_samples_and_explicit_outcome(store):
    original = _failed_after_samples(store)
    with pytest.raises(Exception, match="reserved"):
        store.derive(original, ["measure"], "x", fields={"outcome": "passed"})
    n = len(store.hashes())
    assert n == 1, "a refused derive writes nothing"
    sha = store.derive(
        original,
        ["measure"],
        "recomputed from the valid samples",
        fresh_steps=[{"name": "restore-check", "outcome": "passed", "data": {"match": True}}],
        fresh_samples={"restore-check": [{"revision": 7}]},
        fields={"qualification": {"code": {"gain": 0.0334}}},
        outcome="inconclusive",
    )
    d = store.load(sha)
    assert d.outcome == "inconclusive" and d.qualification == {"code": {"gain": 0.0334}}
    assert d.samples == {"restore-check": [{"revision": 7}]} and d.step("restore-check").data == {"match": True}
    assert store.verify().ok
