"""Issue 48 items 1 and 2, on local git only: the evidence remote's pre-receive hook (the same
setup script `receipts init-remote` runs over SSH, run here on a local bare repository) refuses
each forbidden push made directly with git, and `receipts verify --remote`'s checks catch the same
pushes on a repository made before the hook existed. The remote over the lab's sshd, through the
CLI, is tests/e2e/test_evidence_hook.py.

Real objects throughout: receipts sealed by EvidenceStore, commits signed with real SSH keys by
the code pairctl pushes with, pushes by the git CLI (receive-pack runs the hook on a local push as
it does over SSH)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.evidence import team
from orchestrator.evidence.store import EvidenceStore


@dataclass(frozen=True)
class LocalAccess:
    """team.RemoteAccess for a repository on this machine (git needs no ssh to reach it)."""

    url: str
    path: str
    signing_key: str | None
    allowed_signers: str | None
    host_name: str = "localhost"
    ssh_argv: tuple[str, ...] = ("ssh",)
    destination: str = "localhost"
    timeout_s: float = 60.0
    git_ssh_command: str = "false"


def _key(d: Path, name: str) -> Path:
    k = d / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(k)], check=True)
    return k


@dataclass
class Team:
    repo: Path
    signers: Path
    a: EvidenceStore
    b: EvidenceStore
    keys: dict[str, Path]
    url: str = ""  # how git reaches the repository (its path here; ssh://... over the lab's sshd)
    ssh: str = "false"  # GIT_SSH_COMMAND for that url

    def access(self, who: str) -> LocalAccess:
        url = self.url or str(self.repo)
        return LocalAccess(url, str(self.repo), str(self.keys[who]), str(self.signers), git_ssh_command=self.ssh)


def _make_team(tmp_path: Path, *, hooked: bool) -> Team:
    keys = {n: _key(tmp_path, n) for n in ("alice", "bob", "mallory")}
    a = EvidenceStore(tmp_path / "a" / "evidence")
    b = EvidenceStore(tmp_path / "b" / "evidence")
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        "# the team: each home bound to its operator's key by the principal homes/<home-id>\n"
        f'alice@team,homes/{a.home_id()} namespaces="git" {keys["alice"].with_suffix(".pub").read_text()}'
        f'bob@team,homes/{b.home_id()} namespaces="git" {keys["bob"].with_suffix(".pub").read_text()}'
    )
    repo = tmp_path / "remote" / "evidence.git"
    repo.parent.mkdir()
    if hooked:
        subprocess.run(["sh", "-c", team.setup_script(str(repo), signers.read_bytes())], check=True)
    else:  # what init-remote made before issue 48: settings, no hook, no signers copy
        subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
        for k in ("receive.denyNonFastForwards", "receive.denyDeletes", "receive.fsckObjects"):
            subprocess.run(["git", "--git-dir", str(repo), "config", k, "true"], check=True)
    t = Team(repo, signers, a, b, keys)
    for who, store in (("alice", a), ("bob", b)):
        store.begin("deploy", ["deploy"], pair="lab").finish("passed", f"{who}'s first")
        store.begin("accept", ["accept"], pair="lab").finish("passed", f"{who}'s second")
        assert team.push(store, t.access(who), who).pushed
    return t


def _git(store: EvidenceStore, *args: str, **kw: object) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
    cp = subprocess.run(
        ["git", "--git-dir", str(team.mirror_dir(store)), *args], capture_output=True, text=True, env=env, **kw
    )  # type: ignore[call-overload]
    return str(cp.stdout).strip()


def _commit(store: EvidenceStore, tree: dict[str, str], parent: str | None, key: Path | None) -> str:
    """A commit of `tree` (receipts/NAME -> blob id), signed with `key` as pairctl signs."""
    receipts = {p.removeprefix("receipts/"): ("100644 blob", o) for p, o in tree.items() if p.startswith("receipts/")}
    root = team._mktree(store, {"receipts": ("040000 tree", team._mktree(store, receipts))})
    cfg = ["-c", "user.name=x", "-c", "user.email=x@pairctl"]
    if key is not None:
        cfg += ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}"]
    args = [*cfg, "commit-tree", *(["-S"] if key else []), *(["-p", parent] if parent else []), "-m", "x", root]
    return _git(store, *args)


def _push(t: Team, store: EvidenceStore, commit: str, home: str, *, force: bool = False) -> subprocess.CompletedProcess:
    """`git push` of `commit` to homes/HOME, straight from a home's mirror: no pairctl in the way."""
    ref = f"refs/heads/homes/{home}" if commit else f":refs/heads/homes/{home}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"GIT_SSH_COMMAND": t.ssh}
    argv = ["git", "--git-dir", str(team.mirror_dir(store)), "push", *(["--force"] if force else [])]
    spec = f"{commit}:{ref}" if commit else ref
    return subprocess.run([*argv, t.url or str(t.repo), spec], capture_output=True, text=True, env=env)


def _forbidden(t: Team) -> dict[str, tuple[EvidenceStore, str, str, bool]]:
    """name -> (pushing store, commit, branch home, forced): every change issue 48 forbids."""
    a, b = t.a, t.b
    tip = team._rev(a, team.BRANCH + a.home_id())
    assert tip
    tree = team.tree_of(a, tip)
    first = sorted(p for p in tree if p.startswith("receipts/"))[0]
    dropped = {p: o for p, o in tree.items() if p != first}
    other = team._hash_files(a, [b.path_of(b.hashes()[0])], write=True)[0]  # any other real blob
    changed = tree | {first: other}
    new_receipt = a.begin("rollback", ["rollback"], pair="lab").finish("passed", "appended")
    (blob,) = team._hash_files(a, [a.path_of(new_receipt)], write=True)
    appended = tree | {f"receipts/{new_receipt}.json": blob}
    # B appends a receipt of its own to A's branch, signed with B's own (allowed) key
    team.fetch(b, t.access("bob"))
    a_tip_at_b = team._rev(b, team.TRACKING + a.home_id())
    assert a_tip_at_b == tip
    (bblob,) = team._hash_files(b, [b.path_of(b.hashes()[0])], write=True)
    forged = tree | {f"receipts/{b.hashes()[0]}.json": bblob}
    return {
        "dropped receipt": (a, _commit(a, dropped, tip, t.keys["alice"]), a.home_id(), False),
        "changed blob": (a, _commit(a, changed, tip, t.keys["alice"]), a.home_id(), False),
        "unlisted signer": (a, _commit(a, appended, tip, t.keys["mallory"]), a.home_id(), False),
        "unsigned": (a, _commit(a, appended, tip, None), a.home_id(), False),
        "non-fast-forward": (a, _commit(a, appended, None, t.keys["alice"]), a.home_id(), True),
        "another home's signer": (b, _commit(b, forged, tip, t.keys["bob"]), a.home_id(), False),
    }


@pytest.mark.parametrize(
    "change, said",
    [
        ("dropped receipt", "changes or removes receipts/"),
        ("changed blob", "changes or removes receipts/"),
        ("unlisted signer", "not signed by a key in the team's allowed signers"),
        ("unsigned", "not signed by a key in the team's allowed signers"),
        ("non-fast-forward", "non-fast-forward"),
        ("another home's signer", "whose key is not bound to home"),
    ],
)
def test_the_hooked_remote_refuses_each_forbidden_push(tmp_path, change, said):
    t = _make_team(tmp_path, hooked=True)
    before = subprocess.run(["git", "--git-dir", str(t.repo), "show-ref"], capture_output=True, text=True).stdout
    store, commit, home, force = _forbidden(t)[change]
    cp = _push(t, store, commit, home, force=force)
    assert cp.returncode != 0 and "pairctl evidence remote: refused" in cp.stderr and said in cp.stderr, cp.stderr
    after = subprocess.run(["git", "--git-dir", str(t.repo), "show-ref"], capture_output=True, text=True).stdout
    assert after == before  # nothing moved


def test_the_hooked_remote_takes_appends_and_refuses_deletes_and_strays(tmp_path):
    t = _make_team(tmp_path, hooked=True)
    a = t.a
    a.begin("rollback", ["rollback"], pair="lab").finish("passed", "appended")
    assert team.push(a, t.access("alice"), "alice").pushed  # pairctl's own append passes the hook
    tip = team._rev(a, team.BRANCH + a.home_id())
    assert tip
    deleted = _push(t, a, "", a.home_id())
    assert deleted.returncode != 0 and "deletion prohibited" in deleted.stderr
    stray = _push(t, a, tip, "rogue-home")  # an allowed key, but not bound to that home
    assert stray.returncode != 0 and "no key in the allowed signers is bound to this home" in stray.stderr
    other = subprocess.run(
        ["git", "--git-dir", str(team.mirror_dir(a)), "push", str(t.repo), f"{tip}:refs/heads/main"],
        capture_output=True,
        text=True,
    )
    assert other.returncode != 0 and "only refs/heads/homes/<home-id>" in other.stderr


@pytest.mark.parametrize(
    "change, said",
    [
        ("dropped receipt", "were changed or deleted by a later commit"),
        ("changed blob", "were changed or deleted by a later commit"),
        ("unlisted signer", "a good signature by a key the allowed signers do not list"),
        ("unsigned", "no signature"),
        ("another home's signer", "whose key is not bound to home"),
    ],
)
def test_verify_catches_the_same_pushes_on_a_remote_made_before_the_hook(tmp_path, change, said):
    t = _make_team(tmp_path, hooked=False)
    store, commit, home, force = _forbidden(t)[change]
    cp = _push(t, store, commit, home, force=force)
    assert cp.returncode == 0, cp.stderr  # the old remote takes it
    c = EvidenceStore(tmp_path / "c" / "evidence")  # a third home verifies
    team.pull(c, t.access("alice"))
    problems = team.signature_problems(c, home, str(t.signers))
    assert any(said in p for p in problems), problems


def test_a_non_fast_forward_was_refused_before_the_hook_too(tmp_path):
    t = _make_team(tmp_path, hooked=False)
    store, commit, home, force = _forbidden(t)["non-fast-forward"]
    cp = _push(t, store, commit, home, force=force)
    assert cp.returncode != 0 and "non-fast-forward" in cp.stderr


def test_the_operator_whose_branch_lost_a_receipt_is_told(tmp_path):
    """Someone drops one of A's receipts on an old remote (a fast-forward, signed by an allowed
    key): A's next push adds it back and says so; A's pull says so too."""
    t = _make_team(tmp_path, hooked=False)
    store, commit, home, _ = _forbidden(t)["dropped receipt"]
    assert _push(t, store, commit, home).returncode == 0
    a = t.a
    a.begin("rollback", ["rollback"], pair="lab").finish("passed", "next run")
    res = team.push(a, t.access("alice"), "alice")
    assert res.pushed and len(res.lost) == 1
    assert "lost 1 receipt(s) this home pushed" in team.lost_message(a, res.lost)
    assert team.tree_of(a, team.TRACKING + a.home_id()).get(f"receipts/{res.lost[0]}.json")  # added back


def _setup(repo: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = team.setup_script(str(repo), b"")
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, check=False)


def test_a_repository_reached_through_a_link_into_an_open_folder_is_refused(tmp_path):
    """The walk up judges the folders the path resolves to: ev -> open/ev, open mode 0777."""
    (tmp_path / "open" / "ev").mkdir(parents=True)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "ev").symlink_to(tmp_path / "open" / "ev")
    cp = _setup(tmp_path / "mine" / "ev" / "evidence.git")
    assert cp.returncode == team.UNTRUSTED_EXIT, cp.stderr
    assert f"untrusted: {tmp_path / 'open'} is owned by uid" in cp.stderr and "mode 777" in cp.stderr, cp.stderr
    assert not (tmp_path / "open" / "ev" / "evidence.git").exists()
    assert _setup(tmp_path / "open" / "ev" / "evidence.git").returncode == team.UNTRUSTED_EXIT  # as its own path


def test_a_find_without_printf_fails_closed(tmp_path):
    """BusyBox's and BSD's find refuse -printf: the repository is then not judged safe."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "find").write_text("#!/bin/sh\necho 'find: unrecognized: -printf' >&2\nexit 1\n")
    (bin_dir / "find").chmod(0o755)
    cp = _setup(tmp_path / "evidence.git", {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert cp.returncode == team.UNTRUSTED_EXIT, cp.stderr
    assert "could not be judged: find: unrecognized: -printf" in cp.stderr, cp.stderr
    assert not (tmp_path / "evidence.git").exists()
    assert _setup(tmp_path / "evidence.git").returncode == 0  # GNU find: judged, and safe


def test_allowed_signers_that_are_not_utf8_are_a_named_config_error(tmp_path):
    f = tmp_path / "allowed_signers"
    f.write_bytes(b'alice@team namespaces="git" ssh-ed25519 AAAA \xff\n')
    with pytest.raises(ConfigError, match=r"allowed_signers .*: byte 45 is not UTF-8 text") as e:
        team.read_signers(str(f))
    assert e.value.exit_code == 3
