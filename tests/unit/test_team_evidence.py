"""The team's evidence remote, without a lab (issue 35): its config, the route record's writing
home, judging another home's record against its pulled receipts, and the local git side (append-only
signed commits, rewrites found, a remote that does not answer). The remote itself, over the lab's
sshd, is tests/e2e/test_team_evidence.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.config.evidence_remote import parse_url, resolve_remote
from orchestrator.config.inventory import load_inventory
from orchestrator.engine import route_trust
from orchestrator.engine.plan import pair_view
from orchestrator.errors import ConfigError
from orchestrator.evidence import team
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import canonical_json, sha256_bytes
from orchestrator.hosts.route import parse_route
from tests.unit.test_route_trust import KEY, _facts, _written_by

LAB_INV = Path(__file__).resolve().parents[2] / "manifests" / "inventories" / "lab.yaml"


def _inventory(tmp_path: Path, remote: dict) -> Path:
    from orchestrator.config.loader import read_yaml

    inv = read_yaml(LAB_INV)
    inv["evidence_remote"] = remote
    p = tmp_path / "inv.yaml"
    p.write_text(json.dumps(inv))
    return p


@pytest.mark.parametrize(
    "url, why",
    [
        ("https://lab-native/x.git", "only ssh://"),
        ("ssh://lab-native/relative/../x.git", "absolute and plain"),
        ("ssh://lab-native/x.git?a=b", "no password, query"),
        ("ssh://lab-native:99999/x.git", "not a URL"),
        ("ssh://lab-native/-oProxyCommand=x", "absolute and plain"),
        ("ssh://-oProxyCommand=x@lab-native/x.git", "the user name must be"),
    ],
)
def test_a_bad_url_is_one_line_naming_the_field(url, why):
    with pytest.raises(ValueError) as exc:
        parse_url(url)
    assert why in str(exc.value) and "evidence_remote.url" in str(exc.value)


def test_the_remote_host_must_be_an_inventory_host(tmp_path):
    bad = _inventory(tmp_path, {"url": "ssh://elsewhere.example/srv/e.git"})
    with pytest.raises(ConfigError) as exc:
        load_inventory(str(bad), {"PAIRCTL_HOME": str(tmp_path)})
    (line,) = [ln for ln in str(exc.value).splitlines() if "evidence_remote.url" in ln]  # one line per problem
    assert f"{bad}:" in line and "host 'elsewhere.example' is not a host of this inventory" in line
    good = _inventory(tmp_path, {"url": "ssh://lab-native/srv/e.git", "allowed_signers": "${PAIRCTL_HOME}/signers"})
    inv = load_inventory(str(good), {"PAIRCTL_HOME": str(tmp_path)})
    a = resolve_remote(inv)
    assert a is not None and a.url == "ssh://root@127.0.0.2:2222/srv/e.git"
    assert a.allowed_signers == f"{tmp_path}/signers" and a.signing_key == f"{tmp_path}/lab/keys/operator"
    assert "StrictHostKeyChecking=yes" in a.ssh_argv and f"UserKnownHostsFile={tmp_path}/lab/known_hosts" in a.ssh_argv


def test_records_without_a_home_keep_their_bytes():
    from tests.unit.test_route_trust import _record

    old = _record()
    assert b"evidence_home" not in old.to_bytes()
    assert parse_route(old.to_bytes()) == old
    new = old.model_copy(update={"evidence_home": "alice-1", "mac": None}).sign(KEY)
    assert b'"evidence_home":"alice-1"' in new.to_bytes() and parse_route(new.to_bytes()).mac_ok(KEY)


def _copy_home(src: EvidenceStore, dst: EvidenceStore) -> EvidenceStore:
    """What `receipts pull` leaves: the other home's receipts/ and heads/ under team/<home>."""
    d = dst.team_dir(src.home_id())
    for sub in ("receipts", "heads"):
        shutil.copytree(src.root / sub, d / sub)
    copy = dst.team_store(src.home_id())
    assert copy is not None
    return copy


def test_another_homes_record_is_judged_against_its_pulled_receipts(tmp_path):
    """Issue 33 item 10: the second home of a pair saw the first's record as a deletion (exit 10).
    Named by its home, it is checked against that home's pulled chain; not pulled yet, it is a
    warning that deploy and rollback let pass; pulled but rewritten, it is refused as evidence."""
    view = pair_view(load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)}), "lab")
    a, b = EvidenceStore(tmp_path / "a" / "evidence"), EvidenceStore(tmp_path / "b" / "evidence")
    h0 = a.begin("deploy", ["deploy"], pair="lab").finish("passed", "first")
    b.begin("deploy", ["deploy"], pair="lab").finish("passed", "b's own")
    rec = _written_by(a, h0).model_copy(update={"evidence_home": a.home_id(), "mac": None}).sign(KEY)
    facts = {"native": _facts("B", rec.to_bytes()), "rpc": _facts("B", rec.to_bytes())}

    def kinds(store):
        return {p.kind for p in route_trust.judge(view, facts, KEY, store).problems}

    assert kinds(a) == set()
    assert kinds(b) == {route_trust.UNPULLED}
    assert route_trust.UNPULLED in route_trust.DEPLOY_ALLOWS & route_trust.ROLLBACK_ALLOWS
    copy = _copy_home(a, b)
    assert kinds(b) == set()
    # the copy rewritten: the writer's receipt gone and the head moved back
    writer = copy.latest("lab")
    assert writer is not None
    copy.path_of(writer.sha256).unlink()
    (copy.heads_dir / "lab").write_text(h0)
    assert kinds(b) == {route_trust.UNPULLED}  # the remote only appends: a copy behind is not a deletion
    rewritten = json.loads(a.path_of(writer.sha256).read_bytes()) | {"previous": None}
    data = canonical_json(rewritten)
    copy.path_of(sha256_bytes(data)).write_bytes(data)
    (copy.heads_dir / "lab").write_text(sha256_bytes(data))
    assert kinds(b) == {route_trust.EVIDENCE}  # the writer's receipt follows another head: rewritten


def _signing_key(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def _access(tmp_path: Path, port: int = 1):
    inv = _inventory(tmp_path, {"url": f"ssh://lab-native:{port}/srv/e.git", "timeout_s": 20})
    a = resolve_remote(load_inventory(str(inv), {"PAIRCTL_HOME": str(tmp_path)}))
    assert a is not None
    return a.__class__(**{**a.__dict__, "signing_key": str(_signing_key(tmp_path))})


def test_commits_only_append_and_a_rewrite_is_found(tmp_path):
    """A receipt rewritten after it was committed is never committed over its first copy, and the
    comparison with the remote's copy names it; a consistent rewrite (old name gone) too."""
    store = EvidenceStore(tmp_path / "h" / "evidence")
    first = store.begin("deploy", ["deploy"], pair="lab").finish("passed", "ok")
    access = _access(tmp_path)
    tip, added = team.commit_local(store, access, "alice")
    assert tip and added == 1
    log = team._git(store, "cat-file", "commit", tip).stdout.decode()
    assert "-----BEGIN SSH SIGNATURE-----" in log  # signed with the operator's SSH key
    team._git(store, "update-ref", team.TRACKING + store.home_id(), tip)  # as a push leaves it
    assert team.local_differences(store, store.home_id(), store) == []
    # changed in place: the next commit keeps the first blob, and the comparison names it
    p = store.path_of(first)
    p.chmod(0o644)
    p.write_bytes(p.read_bytes().replace(b'"passed"', b'"failed"'))
    store.begin("accept", ["accept"], pair="lab").finish("passed", "ok")
    tip2, added2 = team.commit_local(store, access, "alice")
    assert (
        added2 == 1
        and team.tree_of(store, tip2)[f"receipts/{first}.json"] == team.tree_of(store, tip)[f"receipts/{first}.json"]
    )
    (diff,) = team.local_differences(store, store.home_id(), store)
    assert "differ from the evidence remote's copy" in diff and first in diff
    p.unlink()  # the old name gone (a re-hashed chain)
    (gone,) = team.local_differences(store, store.home_id(), store)
    assert "missing" in gone and first in gone


def test_a_remote_that_does_not_answer_keeps_every_receipt(tmp_path):
    """Offline first: the push is refused by the network (nothing listens on port 1), the receipts
    stay, the commit waits on the local branch and the next push sends it."""
    store = EvidenceStore(tmp_path / "h" / "evidence")
    sha = store.begin("deploy", ["deploy"], pair="lab").finish("passed", "ok")
    with pytest.raises(team.RemoteUnreachable) as exc:
        team.push(store, _access(tmp_path))
    assert "did not take the push" in exc.value.message and "retries" in (exc.value.hint or "")
    assert store.path_of(sha).is_file() and store.verify().ok
    assert team.tree_of(store, team.BRANCH + store.home_id())  # committed, waiting
    assert team.ahead(store)


def test_an_older_record_of_another_home_put_back_is_a_replay(tmp_path):
    """This home wrote revision 5 after another home's revision 3: revision 3 on the hosts again
    (with its links) was put back, whoever's home signed it."""
    view = pair_view(load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)}), "lab")
    a, b = EvidenceStore(tmp_path / "a" / "evidence"), EvidenceStore(tmp_path / "b" / "evidence")
    h0 = a.begin("deploy", ["deploy"], pair="lab").finish("passed", "first")
    rec = _written_by(a, h0).model_copy(update={"revision": 3, "evidence_home": a.home_id(), "mac": None}).sign(KEY)
    j = b.begin("rollback", ["rollback"], pair="lab")
    with j.step("route") as s:
        s.data.update({"action": "route", "lab-native": {"revision": 5, "read_back": "byte-identical"}})
    j.finish("passed", "rolled back")
    _copy_home(a, b)
    facts = {"native": _facts("B", rec.to_bytes()), "rpc": _facts("B", rec.to_bytes())}
    problems = route_trust.judge(view, facts, KEY, b).problems
    assert [p.kind for p in problems] == [route_trust.FORGED]
    assert "this home later wrote revision 5" in problems[0].text
