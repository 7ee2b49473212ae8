"""Issue 33 item 6: `receipts prune` bounds local evidence without breaking the audit trail. The
selection and verify logic on real receipts sealed by the evidence store; the lab run (route
records on real hosts, deploys and rollbacks) is tests/e2e/test_receipts_prune.py."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import time
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.errors import EvidenceError
from orchestrator.evidence import prune as pr
from orchestrator.evidence.receipt import parse_time
from orchestrator.evidence.store import EvidenceStore
from orchestrator.ops import prune as ops_prune
from tests.plugins.cli import run_cli

LATER = datetime.now(UTC) + timedelta(days=1)  # a cut-off every receipt written here is older than


def _chain(store: EvidenceStore, pair: str | None, n: int, command: str = "deploy") -> list[str]:
    out = []
    for i in range(n):
        with store.begin(command, [command, str(i)], pair=pair) as j:
            j.record_step("preflight", "passed", {"i": i})
            out.append(j.finish("passed", f"run {i}"))
    return out


def _select(store: EvidenceStore, *, cutoff=LATER, anchors=None, pinned=None, blocked=None) -> pr.Selection:
    receipts = list(store.iter())
    sizes = [(r, store.path_of(r.sha256).stat().st_size) for r in receipts]
    heads = {r.chain: (store.heads_dir / r.chain).read_text().strip() for r in receipts}
    return pr.select(
        sizes,
        heads,
        cutoff=cutoff,
        anchors=anchors or {},
        pinned=pinned or {},
        blocked=blocked or {},
        pruned=store.pruned(),
    )


def test_selection_keeps_the_head_and_everything_from_a_route_anchor_on(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    r = _chain(store, "lab", 6)
    writer = store.load(r[3])
    sel = _select(store, anchors={"lab": pr.Anchors(frozenset({writer.run_id}), frozenset({r[2]}))})
    assert [c.sha for c in sel.prune] == r[:2]  # oldest first; r[2] is the head the record followed
    assert "route record" in sel.kept[r[3]] and "route record" in sel.kept[r[2]]
    assert "newer than a receipt that stays" in sel.kept[r[4]] and sel.kept[r[5]] == "the chain's head"
    # without any anchor only the head stays
    assert [c.sha for c in _select(store).prune] == r[:5]


def test_selection_keeps_receipts_newer_than_the_cutoff_pinned_blocked_and_reused(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    old = _chain(store, "lab", 3)
    time.sleep(0.01)
    cutoff = datetime.now(UTC)
    new = _chain(store, "lab", 2)
    sel = _select(store, cutoff=cutoff)
    assert [c.sha for c in sel.prune] == old and not set(new) & set(sel.kept)  # newer ones are not even candidates
    sel = _select(store, pinned={old[1]: "the pair's reference answers"}, blocked={"other": "x"})
    assert sel.kept[old[1]] == "the pair's reference answers" and old[1] not in [c.sha for c in sel.prune]
    assert _select(store, blocked={"lab": "run X (deploy) is not sealed yet"}).prune == []
    # a derived record that stays keeps the receipt whose step it reuses
    derived = store.derive(old[0], ["preflight"], "reuse the preflight")
    sel = _select(store, cutoff=parse_time(store.load(derived).finished_at))
    assert "reuses it" in sel.kept[old[0]] and old[0] not in [c.sha for c in sel.prune]


def test_prune_with_an_archive_then_verify_passes_and_still_finds_tampering(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    r = _chain(store, None, 5, command="build")
    archive = tmp_path / "old.tar.xz"
    res = ops_prune.run(store, days=0, inventory=None, access=None, archive=archive, dry_run=False, argv=[], now=LATER)
    gone = r[:4]
    assert [c.sha for c in res.selection.prune] == gone and res.receipt
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive, "r:xz") as tar:
        assert sorted(m.name for m in tar) == sorted(f"receipts/{h}.json" for h in gone)
    assert not any(store.path_of(h).exists() or (store.index_dir / f"{h}.json").exists() for h in gone)
    rep = store.verify()
    assert rep.ok and rep.pruned == 4, rep.problems
    doc = store.load(res.receipt).extra_fields()["pruned"]
    assert doc["chains"]["_no-pair"]["first"] == r[0] and doc["chains"]["_no-pair"]["last"] == r[3]
    assert doc["archive"]["sha256"] and all(e["kept"] == ["archive"] for e in doc["receipts"])
    # the chain walk steps over the pruned receipts: what stays is still in its chain
    assert all(s["in_chain"] for s in store.summaries())
    # a rewrite of a kept receipt is still found
    kept = store.path_of(r[4])
    kept.chmod(0o644)
    kept.write_bytes(kept.read_bytes().replace(b'"run 4"', b'"run 5"'))
    probs = store.verify().problems  # the receipt itself, and the prune receipt that follows it
    assert {p.kind for p in probs} == {"changed", "previous-changed"} and probs[0].file == str(kept)


def test_a_second_prune_around_the_first_prune_receipt_still_verifies(tmp_path):
    """A receipt that stays (here the first prune receipt: pinned) whose next receipt was pruned is
    still followed, by the pruned one's entry: not a stray tip "beyond the head" (seen on the lab,
    where reference answers and the pair's baselines stay among pruned deploys)."""
    store = EvidenceStore(tmp_path / "ev")
    _chain(store, None, 3, command="build")
    first = ops_prune.run(store, days=0, inventory=None, access=None, archive=tmp_path / "1.tar.xz",
                          dry_run=False, argv=[], now=LATER)  # fmt: skip
    assert first.receipt and store.verify().ok
    _chain(store, None, 3, command="build")
    later = LATER + timedelta(days=1)
    second = ops_prune.run(store, days=0, inventory=None, access=None, archive=tmp_path / "2.tar.xz",
                           dry_run=False, argv=[], now=later)  # fmt: skip
    assert second.receipt and first.receipt not in [c.sha for c in second.selection.prune]
    assert store.path_of(first.receipt).exists() and second.selection.prune
    rep = store.verify()
    assert rep.ok and rep.pruned == len(first.selection.prune) + len(second.selection.prune), rep.problems
    assert all(s["in_chain"] for s in store.summaries())


def test_a_missing_receipt_no_prune_receipt_accounts_for_is_still_deleted_evidence(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    _chain(store, None, 4, command="build")
    ops_prune.run(
        store, days=0, inventory=None, access=None, archive=tmp_path / "a.tar.xz", dry_run=False, argv=[], now=LATER
    )
    # after the prune: the chain is r3 <- prune receipt (head); r0..r2 pruned. Two more runs, then delete one.
    more = _chain(store, None, 2, command="build")
    store.path_of(more[0]).unlink()
    kinds = {p.kind for p in store.verify().problems}
    assert kinds == {"missing-previous", "deleted"}, kinds
    assert store.verify().pruned == 3


def test_nothing_goes_that_is_kept_nowhere_else(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    _chain(store, None, 3, command="build")
    res = ops_prune.run(store, days=0, inventory=None, access=None, archive=None, dry_run=False, argv=[], now=LATER)
    assert res.selection.prune == [] and res.receipt is None
    assert any("kept nowhere" in why for why in res.selection.kept.values())
    assert len(store.hashes()) == 3


def test_a_broken_store_is_never_pruned(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    r = _chain(store, None, 3, command="build")
    store.path_of(r[1]).unlink()
    with pytest.raises(EvidenceError, match="does not verify"):
        ops_prune.run(
            store, days=0, inventory=None, access=None, archive=tmp_path / "a.tar.xz", dry_run=False, argv=[], now=LATER
        )
    assert not (tmp_path / "a.tar.xz").exists() and len(store.hashes()) == 2


def test_an_archive_that_does_not_read_back_stops_the_prune(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    r = _chain(store, None, 2, command="build")
    bad = tmp_path / "bad.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:  # what a flipped byte on the way to disk looks like
        data = store.path_of(r[0]).read_bytes().replace(b"run 0", b"run 9")
        info = tarfile.TarInfo(f"receipts/{r[0]}.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(EvidenceError, match="did not read back intact"):
        pr.check_archive(bad, {r[0]: store.path_of(r[0])})
    with pytest.raises(EvidenceError, match="exists"):
        pr.write_archive(bad, {r[0]: store.path_of(r[0])})


def test_cli_dry_run_lists_and_frees_nothing_and_bad_options_are_one_line(tmp_path):
    ev = tmp_path / "ev"
    store = EvidenceStore(ev)
    _chain(store, None, 3, command="build")
    before = sorted(os.listdir(store.receipts_dir))
    out = run_cli(["receipts", "prune", "--evidence", str(ev), "--older-than", "0", "--dry-run", "--archive",
                   str(tmp_path / "a.tar.xz")])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "dry run: 2 receipt(s) would go, freeing" in out.stdout and " kB" in out.stdout
    assert sorted(os.listdir(store.receipts_dir)) == before and not (tmp_path / "a.tar.xz").exists()
    js = run_cli(["--json", "receipts", "prune", "--evidence", str(ev), "--older-than", "0", "--dry-run"])
    assert js.exit_code == 0 and json.loads(js.stdout)["pruned"] == []  # no remote, no archive: kept nowhere
    for args, text in (
        (["--older-than", "-1", "--yes"], "--older-than"),
        (["--older-than", "1"], "--yes"),
        (["--older-than", "1", "--yes", "--archive", str(store.path_of(store.hashes()[0]))], "exists"),
    ):
        bad = run_cli(["receipts", "prune", "--evidence", str(ev), *args])
        assert bad.exit_code == 2 and text in bad.output and "Traceback" not in bad.output, bad.output
    ok = run_cli(["receipts", "prune", "--evidence", str(ev), "--older-than", "0", "--yes", "--archive",
                  str(tmp_path / "b.tar.xz")])  # fmt: skip
    assert ok.exit_code == 0 and "pruned 2 receipt(s)" in ok.stdout, ok.output
    assert run_cli(["receipts", "verify", "--evidence", str(ev)]).exit_code == 0


def test_receipts_on_the_team_remote_with_the_same_bytes_go_and_others_stay(tmp_path):
    """The remote side on real git objects: a bare repository reached by git's local transport
    (the same plumbing as over SSH, tests/e2e/test_team_evidence.py has the SSH half)."""
    import subprocess

    from orchestrator.evidence import team

    bare = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    access = team.RemoteAccess(str(bare), str(bare), "local", ("ssh",), "x", 22, str(key), None, 20.0)
    store = EvidenceStore(tmp_path / "ev")
    pushed = _chain(store, None, 4, command="build")
    team.push(store, access, "alice")
    later = _chain(store, None, 2, command="build")  # not pushed
    res = ops_prune.run(store, days=0, inventory=None, access=access, archive=None, dry_run=False, argv=[], now=LATER)
    assert [c.sha for c in res.selection.prune] == pushed
    assert "not on the team's evidence remote" in res.selection.kept[later[0]]
    doc = store.load(res.receipt).extra_fields()["pruned"]
    assert doc["remote"]["commit"] and all(e["kept"] == ["remote"] for e in doc["receipts"])
    assert store.verify().ok
    team.push(store, access, "alice")  # the prune receipt goes too; the remote keeps what was pruned here
    me = store.home_id()
    assert team.local_differences(store, me, store, set(store.pruned())) == []
    assert "missing" in team.local_differences(store, me, store)[0]  # what `verify --remote` saw before
