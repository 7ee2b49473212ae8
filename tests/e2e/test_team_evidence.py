"""Issue 35 (and 33 item 10): one audit trail per pair for a team, on the lab pair `lab`.

A real bare repository on lab-native, made by `pairctl receipts init-remote` and served by the
lab's sshd. Two operator homes (the lab home and a second one sharing route.key and the same
inventory) deploy, accept and roll back the one pair in turns, each pushing signed commits; a
third, empty home pulls and verifies everything. A consistently rewritten receipt (the chain
re-hashed, head and index moved: what local `receipts verify` cannot see) is reported by
`receipts verify --remote` and by `status`; a forced push and a branch delete are refused by
the remote. One deploy per home; the rest are rollbacks and reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.config.loader import read_yaml
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import canonical_json, sha256_bytes
from tests.plugins.pairs import PAIR, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _ok(r, *codes: int) -> dict:
    if r.exit_code not in (codes or (0,)):
        pytest.fail(f"exit {r.exit_code}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout) if r.stdout.strip()[:1] in "{[" else {}


def _rewrite_newest(store: EvidenceStore, pair: str) -> tuple[str, str]:
    """What someone who can write a home does to hide a run: the newest receipt re-written
    (reason changed), re-hashed, the head and index moved, the old file removed."""
    old = (store.heads_dir / pair).read_text().strip()
    path = store.path_of(old)
    obj = json.loads(path.read_bytes())
    obj["reason"] = "nothing to see here"
    data = canonical_json(obj)
    new = sha256_bytes(data)
    store.path_of(new).write_bytes(data)
    (store.heads_dir / pair).write_text(new)
    idx = store.index_dir / f"{old}.json"
    if idx.exists():
        idx.rename(store.index_dir / f"{new}.json")
    path.chmod(0o644)
    path.unlink()
    return old, new


def test_two_homes_take_turns_and_a_third_verifies_everything(lab, lab_packages, lab_packages_b, cli, tmp_path):
    a_home = lab.home.root
    pid, other = lab_packages.id, lab_packages_b.id
    repo = lab.home.lab / "hosts" / "lab-native" / "evidence.git"  # under the host's root
    shutil.rmtree(repo, ignore_errors=True)
    b_home, c_home = tmp_path / "home-b", tmp_path / "home-c"
    a_id, b_id = EvidenceStore(a_home / "evidence").home_id(), EvidenceStore(b_home / "evidence").home_id()
    signers = tmp_path / "allowed_signers"  # one team key, bound to both homes' branches (issue 48)
    signers.write_text(
        f'team@pairctl,homes/{a_id},homes/{b_id} namespaces="git" '
        f"{lab.operator_key.with_suffix('.pub').read_text().strip()}\n"
    )
    inv = read_yaml(lab.inventory_path)
    native = lab.inventory.hosts["lab-native"]
    inv_text = json.dumps(inv).replace("${PAIRCTL_HOME}", str(a_home))  # one inventory for every home
    inv = json.loads(inv_text)
    inv["evidence_remote"] = {"url": f"ssh://lab-native{repo}", "allowed_signers": str(signers)}
    inventory = tmp_path / "team.yaml"
    inventory.write_text(json.dumps(inv))
    for h in (b_home, c_home):
        h.mkdir(exist_ok=True)
        (h / "packages").symlink_to(a_home / "packages")
    shutil.copy2(a_home / "route.key", b_home / "route.key")  # operators of one pair share route.key

    def run(home: Path, *args: str):
        return cli("--json", *args, home=home, inventory=str(inventory))

    _ok(run(a_home, "receipts", "init-remote"))
    assert (repo / "HEAD").is_file() and native.address

    # turns: A deploys, B deploys over it (once refused: exit 10, "newest receipts were deleted?"),
    # A accepts B's pair, B rolls back (to A's), A rolls back (to B's); every command pushes
    _ok(run(a_home, "deploy", "--pair", PAIR, "--packages", other, other, "--profile", "lab", "--skip-accept"))
    b = run(b_home, "deploy", "--pair", PAIR, "--packages", pid, pid, "--profile", "lab", "--skip-accept")
    assert "deleted" not in b.stderr, b.stderr
    _ok(b)
    # offline first: a remote that does not answer (nothing listens on port 1) leaves the run's
    # result and exit code alone and its receipt here; the next command's push sends it
    offline = json.loads(inv_text) | {"evidence_remote": {"url": f"ssh://lab-native:1{repo}"}}
    offline_inv = tmp_path / "offline.yaml"
    offline_inv.write_text(json.dumps(offline))
    acc = cli("--json", "accept", "--pair", PAIR, "--checks", "identity", home=a_home, inventory=str(offline_inv))
    assert acc.exit_code == 0 and "receipts not pushed to the evidence remote" in acc.stderr, acc.stderr[-2000:]
    accept_receipt = _ok(acc)["receipt"]
    _ok(run(b_home, "rollback", "--pair", PAIR))
    _ok(run(b_home, "repair", "--pair", PAIR, "--yes"))  # issue 33 #10: after it, the first home was refused
    _ok(run(a_home, "rollback", "--pair", PAIR))
    st = _ok(run(b_home, "status", "--pair", PAIR), 0)
    assert not st["problems"], st["problems"]
    shutil.rmtree(b_home / "evidence" / "mirror.git")  # a lost mirror: the next push builds on the remote's branch
    _ok(run(b_home, "receipts", "push"))
    assert st["route"]["evidence_home"] == a_id

    # a third, empty home pulls and verifies the pair's whole history, signatures included
    pulled = _ok(run(c_home, "receipts", "pull"))
    assert {a_id, b_id} <= set(pulled["homes"]), pulled
    ver = _ok(run(c_home, "receipts", "verify", "--remote"))
    assert ver["ok"] and not ver["warnings"], ver
    assert ver["signers"][a_id] == ver["signers"][b_id] == ["team@pairctl"]  # the allowed signer's name
    rows = _ok(run(c_home, "receipts", "list", "--pair", PAIR))
    by_home = {r["home"] for r in rows}
    assert {a_id, b_id} <= by_home, by_home
    assert accept_receipt in {r["hash"] for r in rows}  # pushed by A's next command
    cmds = {(r["home"], r["command"]) for r in rows}
    assert {(a_id, "deploy"), (b_id, "deploy"), (a_id, "accept"), (b_id, "rollback"), (b_id, "repair")} <= cmds
    assert (a_id, "rollback") in cmds

    # B's home rewritten after it pushed: local verify cannot tell, the remote and status can
    b_store = EvidenceStore(b_home / "evidence")
    old, _new = _rewrite_newest(b_store, PAIR)
    assert run(b_home, "receipts", "verify").exit_code == 0  # the hole the remote closes
    vr = run(b_home, "receipts", "verify", "--remote")
    assert vr.exit_code == 10 and "missing" in vr.stderr, (vr.exit_code, vr.stderr[-2000:])
    st = _ok(run(b_home, "status", "--pair", PAIR), 1)
    assert any(old in p or "rewritten" in p for p in st["problems"]), st["problems"]
    # ... and so does every home that pulled B's receipts and finds its copy changed
    c_copy = EvidenceStore(c_home / "evidence").team_dir(b_id) / "receipts" / f"{old}.json"
    c_copy.chmod(0o644)
    c_copy.write_bytes(c_copy.read_bytes().replace(b'"passed"', b'"failed"', 1))
    vc = run(c_home, "receipts", "verify", "--remote")
    assert vc.exit_code == 10 and "differ" in vc.stderr + vc.stdout, vc.stderr[-2000:]

    # the remote refuses a rewrite and a delete, even forced
    env = {**os.environ, "GIT_SSH_COMMAND": _access(inventory, a_home).git_ssh_command}
    mirror = str(b_home / "evidence" / "mirror.git")
    ref = f"refs/heads/homes/{b_id}"
    tree = subprocess.run(["git", "--git-dir", mirror, "rev-parse", f"{ref}^{{tree}}"], capture_output=True, text=True)
    orphan = subprocess.run(
        ["git", "--git-dir", mirror, "commit-tree", "-m", "rewritten", tree.stdout.strip()],
        capture_output=True,
        text=True,
        env={
            **env,
            "GIT_AUTHOR_NAME": "x",
            "GIT_AUTHOR_EMAIL": "x@x",
            "GIT_COMMITTER_NAME": "x",
            "GIT_COMMITTER_EMAIL": "x@x",
        },
    ).stdout.strip()
    url = _access(inventory, a_home).url
    forced = subprocess.run(
        ["git", "--git-dir", mirror, "push", "--force", url, f"{orphan}:{ref}"], capture_output=True, text=True, env=env
    )
    assert forced.returncode != 0 and "non-fast-forward" in forced.stderr, forced.stderr
    deleted = subprocess.run(
        ["git", "--git-dir", mirror, "push", url, f":{ref}"], capture_output=True, text=True, env=env
    )
    assert deleted.returncode != 0 and "deletion prohibited" in deleted.stderr, deleted.stderr
    # and the lab home's pair is the baseline, recorded by the lab home
    assert is_active(lab_status(cli), pid)


def _access(inventory: Path, home: Path):
    from orchestrator.config.evidence_remote import resolve_remote
    from orchestrator.config.inventory import load_inventory

    a = resolve_remote(load_inventory(str(inventory), {"PAIRCTL_HOME": str(home)}))
    assert a is not None
    return a
