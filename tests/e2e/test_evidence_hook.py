"""Issue 48 items 1, 2 and 4 through the real CLI over the lab's sshd (lab-native, 127.0.0.2):
`pairctl receipts init-remote` installs the pre-receive hook; each forbidden change pushed straight
with git over SSH is refused by the remote; an allowed_signers writable by others and a repository
owned by another user are refused (exit 3); on a remote made before the hook, `receipts verify
--remote` fails on a rogue branch until a signed `receipts quarantine` decision sets it aside, and
reports a receipt written into another home's branch. Needs the lab's hosts only, no package.
The same hook on local git, change by change: tests/unit/test_evidence_hook.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.config.loader import read_yaml
from orchestrator.evidence import team
from orchestrator.evidence.store import EvidenceStore
from tests.unit.test_evidence_hook import Team, _commit, _forbidden, _key, _push

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _res(r) -> dict:
    return json.loads(r.stdout) if r.stdout.strip()[:1] in "{[" else {}


def test_the_lab_remote_enforces_and_a_stray_branch_is_quarantined(lab, cli, tmp_path):
    keys = {n: _key(tmp_path, n) for n in ("alice", "bob", "carol", "mallory")}
    homes = {n: tmp_path / f"home-{n}" for n in ("alice", "bob", "carol")}
    stores = {n: EvidenceStore(h / "evidence") for n, h in homes.items()}
    ids = {n: s.home_id() for n, s in stores.items()}
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        "".join(
            f'{n}@team,homes/{ids[n]} namespaces="git" {keys[n].with_suffix(".pub").read_text()}'
            for n in ("alice", "bob", "carol")
        )
    )
    signers.chmod(0o644)
    root = lab.home.lab / "hosts" / "lab-native"
    repo, old_repo = root / "evidence-48.git", root / "evidence-48-old.git"
    for r in (repo, old_repo):
        shutil.rmtree(r, ignore_errors=True)
    base = json.loads(json.dumps(read_yaml(lab.inventory_path)).replace("${PAIRCTL_HOME}", str(lab.home.root)))

    def inventory(who: str, path: Path) -> str:
        inv = base | {
            "evidence_remote": {
                "url": f"ssh://lab-native{path}",
                "allowed_signers": str(signers),
                "signing_key": str(keys[who]),
            }
        }
        f = tmp_path / f"{who}-{path.name}.yaml"
        f.write_text(json.dumps(inv))
        return str(f)

    def run(who: str, path: Path, *args: str):
        return cli("--json", *args, home=homes[who], inventory=inventory(who, path))

    # item 2: what decides whose pushes are believed is judged by owner and mode (exit 3)
    signers.chmod(0o666)
    r = run("alice", repo, "receipts", "init-remote")
    assert r.exit_code == 3 and "writable by others" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert run("alice", repo, "receipts", "verify", "--remote").exit_code == 3
    signers.chmod(0o644)
    repo.mkdir()
    shutil.chown(repo, "nobody")
    repo.chmod(0o777)
    r = run("alice", repo, "receipts", "init-remote")
    assert r.exit_code == 3 and f"{repo} is owned by uid" in r.stderr and "an append-only" not in r.stdout, r.stderr
    shutil.rmtree(repo)

    # item 1: the hooked remote takes pairctl's own appends and refuses each forbidden change
    r = run("alice", repo, "receipts", "init-remote")
    assert r.exit_code == 0 and (repo / "hooks" / "pre-receive").is_file(), r.stderr
    for who in ("alice", "bob"):
        stores[who].begin("deploy", ["deploy"], pair="lab").finish("passed", f"{who}'s run")
        stores[who].begin("accept", ["accept"], pair="lab").finish("passed", f"{who}'s second")
        r = run(who, repo, "receipts", "push")
        assert r.exit_code == 0 and _res(r)["pushed"], r.stderr
    native = lab.inventory.hosts["lab-native"]
    a_access = _team_access(inventory("alice", repo), homes["alice"])
    url = a_access.url
    t = Team(repo, signers, stores["alice"], stores["bob"], keys, url=url, ssh=a_access.git_ssh_command)
    assert native.address in url
    for change, said in {
        "dropped receipt": "changes or removes receipts/",
        "changed blob": "changes or removes receipts/",
        "unlisted signer": "not signed by a key in the team's allowed signers",
        "non-fast-forward": "non-fast-forward",
        "another home's signer": "whose key is not bound to home",
    }.items():
        store, commit, home, force = _forbidden(t)[change]
        cp = _push(t, store, commit, home, force=force)
        assert cp.returncode != 0 and said in cp.stderr, (change, cp.stderr)
    deleted = _push(t, stores["alice"], "", ids["alice"])
    assert deleted.returncode != 0 and "deletion prohibited" in deleted.stderr
    ver = run("bob", repo, "receipts", "verify", "--remote")
    assert ver.exit_code == 0 and not _res(ver)["warnings"], ver.stdout + ver.stderr

    # item 4: a remote made before the hook took a rogue branch; verify fails the team on it
    subprocess.run(["git", "init", "-q", "--bare", str(old_repo)], check=True)
    for k in ("receive.denyNonFastForwards", "receive.denyDeletes", "receive.fsckObjects"):
        subprocess.run(["git", "--git-dir", str(old_repo), "config", k, "true"], check=True)
    for who in ("alice", "bob"):  # each home moves to the fresh remote
        for ref in team._git(stores[who], "for-each-ref", "--format=%(refname)", team.TRACKING).stdout.split():
            team._git(stores[who], "update-ref", "-d", ref.decode())
        assert run(who, old_repo, "receipts", "push").exit_code == 0
    old = Team(old_repo, signers, stores["alice"], stores["bob"], keys, url=url.replace(repo.name, old_repo.name))
    old.ssh = t.ssh
    rogue = "mallory-vm-0badc0"
    tip = team._rev(stores["alice"], team.BRANCH + ids["alice"])
    assert tip
    mallory = _commit(stores["alice"], team.tree_of(stores["alice"], tip), None, keys["mallory"])
    assert _push(old, stores["alice"], mallory, rogue).returncode == 0  # no hook: taken
    v = run("carol", old_repo, "receipts", "verify", "--remote")
    assert v.exit_code == 10 and any(rogue in p["message"] for p in _res(v)["problems"]), v.stdout
    assert any("no pairctl pre-receive hook" in w for w in _res(v)["warnings"]), v.stdout
    q = run("carol", old_repo, "receipts", "quarantine", rogue, "--reason", "signed by a key nobody on the team owns")
    assert q.exit_code == 0, q.stderr
    decision = _res(q)
    assert decision["tip"] == mallory and decision["receipt"]
    for who in ("carol", "alice"):  # the deciding home, and another that pulls the decision
        v = run(who, old_repo, "receipts", "verify", "--remote")
        assert v.exit_code == 0, (who, v.stderr[-2000:])
        qd = _res(v)["quarantined"][rogue]
        assert qd["receipt"] == decision["receipt"] and qd["by_home"] == ids["carol"] and qd["problems"]
        assert qd["reason"] == "signed by a key nobody on the team owns" and qd["at"] and qd["by"]
    text = cli("receipts", "verify", "--remote", home=homes["alice"], inventory=inventory("alice", old_repo))
    assert text.exit_code == 0 and f"home {rogue}: quarantined at {mallory[:12]}" in text.stdout, text.stdout

    # item 2 on the old remote: bob's receipt written into alice's branch with bob's own key
    store, commit, home, _ = _forbidden(old)["another home's signer"]
    assert _push(old, store, commit, home).returncode == 0
    v = run("carol", old_repo, "receipts", "verify", "--remote")
    assert v.exit_code == 10 and "whose key is not bound to home" in v.stderr + v.stdout, v.stderr[-2000:]


def _team_access(inventory: str, home: Path):
    from orchestrator.config.evidence_remote import resolve_remote
    from orchestrator.config.inventory import load_inventory

    a = resolve_remote(load_inventory(inventory, {"PAIRCTL_HOME": str(home)}))
    assert a is not None
    return a
