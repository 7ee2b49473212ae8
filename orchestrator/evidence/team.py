"""The team's evidence remote: this home's receipts pushed as signed git commits (plumbing only,
no work tree) to a shared bare repository; every other home's pulled into read-only copies.

One branch per home, `refs/heads/homes/<home-id>`, tree `receipts/<sha256>.json` + `heads/<chain>`.
A commit only adds receipt names its parent lacks and keeps earlier blobs, so a receipt rewritten
locally is never sent. The remote refuses non-fast-forwards and deletes, and its pre-receive hook
(pre-receive.sh) refuses a changed or dropped receipt blob and a commit not signed (gpg.format=ssh)
by a key bound to the branch's home: principal `homes/<home-id>` on the key's allowed_signers line.
`receipts verify --remote` checks the same, also on a remote made before the hook.

Under the evidence root:

    home-id            this home's name in the team (its branch); made on first use
    mirror.git/        bare: refs/heads/homes/<me> (committed here), refs/team/<home> (fetched)
    team/<home>/       a pulled home's receipts/ and heads/, read as an EvidenceStore
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import ConfigError, EvidenceError, HostError, PairctlError
from orchestrator.evidence import atomic
from orchestrator.evidence.store import HOME_ID, ChainLock, EvidenceStore

_HEAD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")  # a chain's name (NO_PAIR included)
BRANCH = "refs/heads/homes/"
TRACKING = "refs/team/"
LOCK_WAIT_S = 30.0
HOOK_SOURCE = Path(__file__).with_name("pre-receive.sh")
HOOK_MARK = "evidence remote: pre-receive hook"
REMOTE_SIGNERS = "pairctl/allowed_signers"  # the hook's copy, under the bare repository
UNTRUSTED_EXIT = 3  # the setup script's exit when the repository (or the way to it) is not safe
_SIG_MEANING = {
    "B": "a bad signature",
    "U": "a good signature by a key the allowed signers do not list",
    "X": "an expired signature",
    "Y": "a signature by an expired key",
    "R": "a signature by a revoked key",
    "E": "a signature that cannot be checked (is gpg.ssh.allowedSignersFile readable?)",
    "N": "no signature",
}


@dataclass(frozen=True)
class RemoteAccess:
    """How git reaches the remote, the way pairctl reaches its hosts (config/evidence_remote.py)."""

    url: str  # ssh://user@address:port/path, as git is given it
    path: str
    host_name: str
    ssh_argv: tuple[str, ...]  # ssh with strict host keys; GIT_SSH_COMMAND is its shlex.join
    destination: str  # user@address, for `ssh ... DEST COMMAND`
    port: int
    signing_key: str | None
    allowed_signers: str | None
    timeout_s: float

    @property
    def git_ssh_command(self) -> str:
        return shlex.join(self.ssh_argv)


class RemoteUnreachable(HostError):
    """The evidence remote did not answer (or refused): nothing local was changed or lost."""


@dataclass
class PushResult:
    commit: str | None  # the branch tip after committing (None: nothing ever committed)
    added: int  # receipts this commit added
    pushed: bool
    lost: list[str] = field(default_factory=list)  # receipts this home pushed that its remote branch lost


@dataclass
class PullResult:
    homes: dict[str, int] = field(default_factory=dict)  # home -> receipts written into its copy
    problems: list[str] = field(default_factory=list)


def mirror_dir(store: EvidenceStore) -> Path:
    return store.root / "mirror.git"


def _git(
    store: EvidenceStore,
    *args: str,
    input: bytes | None = None,
    access: RemoteAccess | None = None,
    timeout: float = 120.0,
    config: Sequence[str] = (),
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """git on this home's mirror; with `access`, over pairctl's own ssh (strict host keys, key, port)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", LC_ALL="C")
    if access is not None:
        env["GIT_SSH_COMMAND"] = access.git_ssh_command
        env["GIT_SSH_VARIANT"] = "ssh"
    argv = ["git", "--git-dir", str(mirror_dir(store))]
    for c in config:
        argv += ["-c", c]
    try:  # its own process group: a timeout ends git and the ssh it started, not git alone
        pipe = subprocess.PIPE
        proc = subprocess.Popen([*argv, *args], stdin=pipe, stdout=pipe, stderr=pipe, env=env, start_new_session=True)
    except FileNotFoundError:
        raise EvidenceError("git is not installed here; the evidence remote needs the git CLI") from None
    try:
        out, err_b = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RemoteUnreachable(f"git {args[0]} did not finish within {timeout:.0f} s") from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    cp = subprocess.CompletedProcess(proc.args, proc.returncode, out, err_b)
    if check and cp.returncode != 0:
        err = cp.stderr.decode(errors="replace").strip().splitlines()
        raise EvidenceError(f"git {args[0]} failed: {'; '.join(err[-3:]) or f'exit {cp.returncode}'}")
    return cp


def ensure_mirror(store: EvidenceStore) -> Path:
    d = mirror_dir(store)
    if not (d / "HEAD").is_file():
        store.root.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["git", "init", "-q", "--bare", str(d)], check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EvidenceError(f"cannot make the evidence mirror {d}: {exc}") from None
    return d


@contextmanager
def _mirror_lock(store: EvidenceStore) -> Iterator[None]:
    """One git writer per home at a time (a deploy's automatic push and a `receipts push`)."""
    lock = ChainLock(ensure_mirror(store) / "pairctl.lock")
    if not lock.acquire(wait_s=LOCK_WAIT_S):
        raise EvidenceError(f"{mirror_dir(store)} stayed locked for {LOCK_WAIT_S:.0f} s")
    try:
        yield
    finally:
        lock.release()


def _rev(store: EvidenceStore, ref: str) -> str | None:
    cp = _git(store, "rev-parse", "--verify", "-q", ref + "^{commit}", check=False)
    return cp.stdout.decode().strip() or None if cp.returncode == 0 else None


def tree_of(store: EvidenceStore, ref: str) -> dict[str, str]:
    """path -> blob id of every file in `ref`'s tree (empty: no such ref)."""
    if _rev(store, ref) is None:
        return {}
    out: dict[str, str] = {}
    for line in _git(store, "ls-tree", "-r", "-z", "--full-tree", ref).stdout.split(b"\0"):
        if not line:
            continue
        meta, path = line.split(b"\t", 1)
        out[path.decode()] = meta.split()[2].decode()
    return out


def _hash_files(store: EvidenceStore, paths: Sequence[Path], *, write: bool) -> list[str]:
    if not paths:
        return []
    args = ["hash-object", "--no-filters", "--stdin-paths"] + (["-w"] if write else [])
    data = "".join(f"{p}\n" for p in paths).encode()
    return _git(store, *args, input=data).stdout.decode().split()


def _mktree(store: EvidenceStore, entries: dict[str, tuple[str, str]]) -> str:
    """name -> (mode type, id): one tree object."""
    lines = "".join(f"{mt} {oid}\t{name}\n" for name, (mt, oid) in sorted(entries.items()))
    return _git(store, "mktree", input=lines.encode()).stdout.decode().strip()


def commit_local(store: EvidenceStore, access: RemoteAccess, operator: str | None) -> tuple[str | None, int]:
    """Commit the receipts not yet on this home's branch (appending, signed); (tip, added)."""
    ensure_mirror(store)
    me = store.home_id()
    ref = BRANCH + me
    tip = _rev(store, ref)
    old = tree_of(store, ref) if tip else {}
    names = [f"{h}.json" for h in store.hashes()]
    new = [n for n in names if f"receipts/{n}" not in old]
    heads = sorted(
        p
        for p in (store.heads_dir.iterdir() if store.heads_dir.is_dir() else [])
        if p.is_file() and not p.name.endswith(".pending") and not p.name.startswith(".")
    )
    blobs = _hash_files(store, [store.receipts_dir / n for n in new] + heads, write=True)
    receipts = {p.removeprefix("receipts/"): ("100644 blob", b) for p, b in old.items() if p.startswith("receipts/")}
    receipts.update({n: ("100644 blob", b) for n, b in zip(new, blobs[: len(new)], strict=True)})
    head_tree = {p.name: ("100644 blob", b) for p, b in zip(heads, blobs[len(new) :], strict=True)}
    root: dict[str, tuple[str, str]] = {"receipts": ("040000 tree", _mktree(store, receipts))}
    if head_tree:
        root["heads"] = ("040000 tree", _mktree(store, head_tree))
    tree = _mktree(store, root)
    if tip and _git(store, "rev-parse", tip + "^{tree}").stdout.decode().strip() == tree:
        return tip, 0
    key = access.signing_key
    if not key:
        raise EvidenceError(
            "no SSH key to sign the evidence commit with",
            hint="set evidence_remote.signing_key (or a key on the remote's host) in the inventory",
        )
    who = operator or me
    env_args = ["-m", f"pairctl: {len(new)} receipt(s) from home {me}"]
    cp = _git(
        store,
        "commit-tree",
        "-S",
        *(["-p", tip] if tip else []),
        *env_args,
        tree,
        config=["gpg.format=ssh", f"user.signingkey={key}", f"user.name={who}", f"user.email={me}@pairctl"],
    )
    commit = cp.stdout.decode().strip()
    _git(store, "update-ref", ref, commit, *([tip] if tip else []))
    return commit, len(new)


def push(store: EvidenceStore, access: RemoteAccess, operator: str | None = None) -> PushResult:
    """Commit what is new, push this home's branch (fast-forward only, never forced). A remote branch
    ahead of this mirror (mirror lost or remade) is fetched and built upon, its receipts kept."""
    with _mirror_lock(store):
        tip, added = commit_local(store, access, operator)
        if tip is None:
            return PushResult(None, 0, False)
        lost: list[str] = []
        cp = _push_branch(store, access)
        if cp.returncode != 0 and b"[rejected]" in cp.stdout:  # behind the remote (fetch first, non-fast-forward)
            fetch(store, access)
            ref, remote_tip = BRANCH + store.home_id(), _rev(store, TRACKING + store.home_id())
            lost = lost_receipts(store)
            if remote_tip is not None:
                _git(store, "update-ref", ref, remote_tip)
                tip, added = commit_local(store, access, operator)
                cp = _push_branch(store, access)
        if cp.returncode != 0:
            raise _remote_error("push", access, cp)
        _git(store, "update-ref", TRACKING + store.home_id(), tip or "")  # what the remote now holds
        return PushResult(tip, added, True, lost)


def _push_branch(store: EvidenceStore, access: RemoteAccess) -> subprocess.CompletedProcess[bytes]:
    ref = BRANCH + store.home_id()
    return _git_remote(store, access, "push", "--porcelain", access.url, f"{ref}:{ref}")


def _git_remote(store: EvidenceStore, access: RemoteAccess, *args: str) -> subprocess.CompletedProcess[bytes]:
    return _git(store, *args, access=access, timeout=access.timeout_s, check=False)


def _remote_error(verb: str, access: RemoteAccess, cp: subprocess.CompletedProcess[bytes]) -> PairctlError:
    text = (cp.stderr + cp.stdout).decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("To ")]
    short = "; ".join(lines[-3:]) or f"exit {cp.returncode}"
    if "rejected" in text or "denied" in text or "non-fast-forward" in text:
        return EvidenceError(
            f"the evidence remote {access.url} refused the {verb}: {short}",
            hint="it only accepts appended history; run `pairctl receipts verify --remote`",
        )
    return RemoteUnreachable(
        f"the evidence remote {access.url} did not take the {verb}: {short}",
        hint="every receipt is kept here; `pairctl receipts push` (or the next command) retries",
    )


def _trust_script(path: str) -> str:
    """sh that exits UNTRUSTED_EXIT naming the first path someone other than the login user or root
    could write: the repository, its config, hooks, signers, and every directory above it and above
    its resolved form (sticky ones may be others'-writable), links judged by target (find -L).
    A find that cannot judge (BusyBox and BSD lack -printf) fails closed."""
    q = shlex.quote(path)
    return (
        f"uid=$(id -u); p={q}; "
        f'no() {{ echo "untrusted: $1" >&2; exit {UNTRUSTED_EXIT}; }}; '
        'unsafe() { [ -e "$1" ] || return 0; '
        'if [ "$2" = 1 ]; then s="! -perm -1000"; else s=""; fi; '
        'f=$(find -L "$1" -maxdepth 0 \\( \\( ! -uid "$uid" ! -uid 0 \\) -o \\( -perm /022 $s \\) \\) '
        "-printf '%p is owned by uid %U with mode %m' 2>&1) "
        '|| no "$1 could not be judged: ${f:-find failed} (GNU find is needed)"; '
        '[ -z "$f" ] || no "$f (the login user is uid $uid)"; }; '
        'up() { d=$1; while [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); unsafe "$d" 1; done; }; '
        'r=$p; while [ ! -e "$r" ] && [ "$r" != / ] && [ "$r" != . ]; do r=$(dirname "$r"); done; '
        'r=$(CDPATH= cd -P -- "$r" && pwd -P) || no "$r could not be resolved"; up "$p"; up "$r/."; '
        f'for f in "$p" "$p/config" "$p/hooks" "$p/hooks/pre-receive" "$p/pairctl" "$p/{REMOTE_SIGNERS}"; '
        'do unsafe "$f" 0; done'
    )


def setup_script(path: str, signers: bytes) -> str:
    """sh that makes or updates the bare repository: refuses an untrusted one, then `git init`, the
    receive settings, the allowed signers and the hook, each written to a temp name and renamed."""
    q = shlex.quote(path)
    hook = HOOK_SOURCE.read_text()
    steps = [
        "set -e",
        "umask 022",
        _trust_script(path),
        shlex.join(["git", "init", "-q", "--bare", path]),
        *(
            shlex.join(["git", "--git-dir", path, "config", k, "true"])
            for k in ("receive.denyNonFastForwards", "receive.denyDeletes", "receive.fsckObjects")
        ),
        f"mkdir -p {q}/pairctl {q}/hooks",
        f"printf %s {shlex.quote(signers.decode())} > {q}/pairctl/.allowed_signers.new",
        f"chmod 0644 {q}/pairctl/.allowed_signers.new",
        f"mv -f {q}/pairctl/.allowed_signers.new {q}/{REMOTE_SIGNERS}",
        f"printf %s {shlex.quote(hook)} > {q}/hooks/.pre-receive.new",
        f"chmod 0755 {q}/hooks/.pre-receive.new",
        f"mv -f {q}/hooks/.pre-receive.new {q}/hooks/pre-receive",
    ]
    return "\n".join(steps) + "\n"


def read_signers(allowed_signers: str | None) -> bytes:
    if allowed_signers is None:
        raise ConfigError(
            "the evidence remote needs evidence_remote.allowed_signers: its pre-receive hook accepts only "
            "commits signed by a key listed there",
            hint='list the team\'s keys, one a line: `alice@team,homes/HOME-ID namespaces="git" ssh-ed25519 AAAA...`',
        )
    try:
        data = Path(allowed_signers).read_bytes()
        data.decode()  # the setup script writes it as text
    except OSError as exc:
        raise ConfigError(f"evidence_remote.allowed_signers {allowed_signers}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"evidence_remote.allowed_signers {allowed_signers}: byte {exc.start} is not UTF-8 text",
            hint="write it as UTF-8: one `PRINCIPALS [OPTIONS] KEYTYPE KEY` a line",
        ) from None
    return data


def _ssh(access: RemoteAccess, script: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [*access.ssh_argv, access.destination, script],
            capture_output=True,
            text=True,
            timeout=access.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RemoteUnreachable(f"{access.host_name} did not answer within {access.timeout_s:.0f} s") from None


def _untrusted(cp: subprocess.CompletedProcess[str]) -> str | None:
    """The trust script's refusal (`_trust_script`), if it refused."""
    if cp.returncode == UNTRUSTED_EXIT and "untrusted: " in cp.stderr:
        return cp.stderr.split("untrusted: ", 1)[1].strip().splitlines()[0]
    return None


def init_remote(access: RemoteAccess, signers: bytes) -> None:
    """Create or update the bare repository over SSH; one someone else could write is refused."""
    cp = _ssh(access, setup_script(access.path, signers))
    if why := _untrusted(cp):
        raise ConfigError(
            f"refusing the evidence repository {access.path} on {access.host_name}: {why}",
            hint="make it (and every directory above it) the login user's or root's, not group/world-writable",
        )
    if cp.returncode != 0:
        raise RemoteUnreachable(f"creating {access.path} on {access.host_name} failed: {cp.stderr.strip()[-300:]}")


def remote_state(access: RemoteAccess) -> list[str]:
    """The repository's own problems, read over SSH: [] safe and hooked, 'untrusted: WHY', 'unhooked'."""
    q = shlex.quote(access.path)
    script = (
        _trust_script(access.path)
        + f"; grep -q {shlex.quote(HOOK_MARK)} {q}/hooks/pre-receive 2>/dev/null && [ -x {q}/hooks/pre-receive ] "
        f"&& [ -f {q}/{REMOTE_SIGNERS} ] || echo unhooked"
    )
    cp = _ssh(access, script)
    if why := _untrusted(cp):
        return ["untrusted: " + why]
    if cp.returncode != 0:
        raise RemoteUnreachable(f"reading {access.path} on {access.host_name} failed: {cp.stderr.strip()[-300:]}")
    return ["unhooked"] if "unhooked" in cp.stdout else []


def bound_lines(signers: str, home: str) -> str:
    """The allowed-signers lines whose principals (first field) hold `homes/<home>`, as the hook reads them."""
    want = f"homes/{home}"
    fields = [(line, line.split()) for line in signers.splitlines()]
    return "".join(ln + "\n" for ln, f in fields if f and not f[0].startswith("#") and want in f[0].split(","))


def fetch(store: EvidenceStore, access: RemoteAccess) -> None:
    """Every home's branch into refs/team/<home>; never forced (a rewritten remote branch is refused)."""
    ensure_mirror(store)
    refspec = f"{BRANCH}*:{TRACKING}*"
    cp = _git_remote(store, access, "fetch", "--no-tags", "--no-write-fetch-head", access.url, refspec)
    if cp.returncode != 0:
        raise _remote_error("fetch", access, cp)


def team_homes(store: EvidenceStore) -> list[str]:
    cp = _git(store, "for-each-ref", "--format=%(refname)", TRACKING, check=False)
    return sorted(r.removeprefix(TRACKING) for r in cp.stdout.decode().split() if r.startswith(TRACKING))


def _cat_blobs(store: EvidenceStore, oids: Sequence[str]) -> Iterator[tuple[str, bytes]]:
    """(oid, content) of each blob, through one `git cat-file --batch`."""
    if not oids:
        return
    out = _git(store, "cat-file", "--batch", input="".join(o + "\n" for o in oids).encode()).stdout
    pos = 0
    for oid in oids:
        nl = out.index(b"\n", pos)
        header = out[pos:nl].split()
        if len(header) != 3:
            raise EvidenceError(f"{mirror_dir(store)} lacks object {oid}")
        size = int(header[2])
        yield oid, out[nl + 1 : nl + 1 + size]
        pos = nl + 1 + size + 1


def materialize(store: EvidenceStore, home: str) -> tuple[int, list[str]]:
    """Write the receipts of refs/team/<home> missing from team/<home>/ (heads replaced)."""
    tree = tree_of(store, TRACKING + home)
    copy = store.team_dir(home)
    (copy / "receipts").mkdir(parents=True, exist_ok=True)
    (copy / "heads").mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    want = [(p, oid) for p, oid in tree.items() if p.startswith("receipts/") and not (copy / p).exists()]
    written = 0
    for (path, _oid), (_, data) in zip(want, _cat_blobs(store, [o for _, o in want]), strict=True):
        name = path.removeprefix("receipts/")
        if hashlib.sha256(data).hexdigest() + ".json" != name:
            problems.append(f"home {home}: the remote's {path} does not match its name; not copied")
            continue
        fd = os.open(copy / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        written += 1
    heads = [(p, oid) for p, oid in tree.items() if p.startswith("heads/") and _HEAD_NAME.match(p[6:])]
    for (path, _), (_, data) in zip(heads, _cat_blobs(store, [o for _, o in heads]), strict=True):
        atomic.replace(copy / path, data)
    if written:
        atomic.fsync_dir(copy / "receipts")
    return written, problems


def lost_receipts(store: EvidenceStore) -> list[str]:
    """Receipts of this home that the remote once held and its last fetched branch lacks: someone
    dropped them there (a remote without the hook). The next push adds them back."""
    me = store.home_id()
    if _rev(store, TRACKING + me) is None:
        return []
    remote = tree_of(store, TRACKING + me)
    mine = tree_of(store, BRANCH + me)
    pushed = _rev(store, BRANCH + me)
    if pushed is None or _git(store, "merge-base", "--is-ancestor", pushed, TRACKING + me, check=False).returncode == 0:
        ours = {p for p in mine if p.startswith("receipts/")}
    else:  # only what the remote ever held of ours: the commits it has seen from this branch
        base = _git(store, "merge-base", pushed, TRACKING + me, check=False).stdout.decode().strip()
        ours = {p for p in tree_of(store, base) if p.startswith("receipts/")} if base else set()
    return sorted(p.removeprefix("receipts/")[:-5] for p in ours if p not in remote)


def lost_message(store: EvidenceStore, lost: Sequence[str]) -> str:
    return (
        f"the evidence remote's branch homes/{store.home_id()} lost {len(lost)} receipt(s) this home pushed "
        f"(first: {lost[0]}): someone rewrote it; they are kept here and pushed again; "
        "run `pairctl receipts verify --remote` and tell the team"
    )


def pull(store: EvidenceStore, access: RemoteAccess) -> PullResult:
    """Fetch every home's branch and copy the other homes' receipts here (read-only copies)."""
    with _mirror_lock(store):
        fetch(store, access)
        res = PullResult()
        me = store.home_id()
        lost = lost_receipts(store)
        if lost:
            res.problems.append(lost_message(store, lost))
        for home in team_homes(store):
            if home == me:
                continue
            if not HOME_ID.match(home):
                res.problems.append(f"the remote's branch homes/{home} does not name an operator home; not copied")
                continue
            n, probs = materialize(store, home)
            res.homes[home] = n
            res.problems += probs
        return res


def local_differences(store: EvidenceStore, home: str, files: EvidenceStore, pruned: Collection[str] = ()) -> list[str]:
    """Receipts the fetched branch of `home` holds that `files` lacks or holds otherwise (a rewritten
    home). Missing ones count only for this home (another's copy is just behind), less the `pruned`."""
    tree = {p: o for p, o in tree_of(store, TRACKING + home).items() if p.startswith("receipts/")}
    gone = sorted(p for p in tree if not (files.root / p).is_file() and p.removeprefix("receipts/")[:-5] not in pruned)
    missing = gone if home == store.home_id() else []
    present = sorted(p for p in tree if (files.root / p).is_file())
    local = _hash_files(store, [files.root / p for p in present], write=False)
    changed = [p for p, oid in zip(present, local, strict=True) if oid != tree[p]]
    who = "this home" if home == store.home_id() else f"the copy of home {home}"
    out = []
    if missing:
        out.append(
            f"{len(missing)} receipt(s) of {who} that the evidence remote holds are missing under {files.root} "
            f"(first: {missing[0]}): the evidence here was deleted or rewritten"
        )
    if changed:
        out.append(
            f"{len(changed)} receipt(s) under {files.root} differ from the evidence remote's copy "
            f"(first: {changed[0]}): rewritten after they were pushed"
        )
    return out


def signature_problems(
    store: EvidenceStore, home: str, allowed_signers: str | None, signers: set[str] | None = None
) -> list[str]:
    """Every commit of `home`'s branch signed by an allowed signer, and appending only; the
    principals that signed go into `signers`."""
    ref = TRACKING + home
    out: list[str] = []
    if allowed_signers is None:
        out.append("no allowed signers listed (inventory evidence_remote.allowed_signers): signatures were not checked")
    else:
        if not Path(allowed_signers).is_file():
            raise ConfigError(
                f"evidence_remote.allowed_signers {allowed_signers} is not a readable file",
                hint='list the team\'s keys there, one a line: `alice@team namespaces="git" ssh-ed25519 AAAA...`',
            )
        cp = _git(store, "log", "--format=%H %G? %GS", ref, config=_signers_config(allowed_signers))
        good: dict[str, str] = {}
        for line in cp.stdout.decode(errors="replace").splitlines():
            sha, status, *who = line.split(" ", 2)
            if status == "G" and who and signers is not None:
                signers.add(who[0])
            if status == "G":
                good[sha] = who[0] if who else "?"
            else:
                out.append(
                    f"home {home}: commit {sha[:12]} carries {_SIG_MEANING.get(status, 'an unknown signature')}"
                    + (f" ({who[0]})" if who and who[0] else "")
                )
        out += _binding_problems(store, home, allowed_signers, good)
    cp = _git(store, "log", "--format=%H", "--no-renames", "--diff-filter=DMT", "--name-only", ref, "--", "receipts/")
    touched = [ln for ln in cp.stdout.decode().splitlines() if ln.startswith("receipts/")]
    if touched:
        out.append(
            f"home {home}: {len(touched)} receipt(s) were changed or deleted by a later commit "
            f"(first: {touched[0]}): the branch does not only append"
        )
    return out


def _binding_problems(store: EvidenceStore, home: str, allowed_signers: str, good: dict[str, str]) -> list[str]:
    """The commits `good` (sha -> principal) must verify against the lines bound to `homes/<home>`
    alone, as the hook checks: each home its own signer."""
    if not good:
        return []
    bound = bound_lines(Path(allowed_signers).read_text(errors="replace"), home)
    if not bound:
        return [
            f"home {home}: no key in {allowed_signers} is bound to this home; its commits are signed by "
            f"{', '.join(sorted(set(good.values())))} (add the principal homes/{home} to its operator's key line)"
        ]
    tmp = mirror_dir(store) / f".bound-{os.getpid()}-{home}"
    try:
        atomic.replace(tmp, bound.encode())
        cp = _git(store, "log", "--format=%H %G?", TRACKING + home, config=_signers_config(str(tmp)))
    finally:
        tmp.unlink(missing_ok=True)
    out = []
    for line in cp.stdout.decode(errors="replace").splitlines():
        sha, status = (line.split(" ", 1) + [""])[:2]
        if sha in good and status != "G":
            out.append(
                f"home {home}: commit {sha[:12]} is signed by {good[sha]}, whose key is not bound to home {home} "
                f"(principal homes/{home}): a receipt written into another home's branch"
            )
    return out


def _signers_config(path: str) -> list[str]:
    return ["gpg.format=ssh", f"gpg.ssh.allowedSignersFile={path}"]


def ahead(store: EvidenceStore) -> bool:
    """Has this home receipts its last fetched remote branch lacks (a push to retry)?"""
    me = store.home_id()
    remote = {p for p in tree_of(store, TRACKING + me) if p.startswith("receipts/")}
    return any(f"receipts/{h}.json" not in remote for h in store.hashes())


def remote_copies(
    store: EvidenceStore, access: RemoteAccess, names: Sequence[str]
) -> tuple[str | None, dict[str, bytes]]:
    """Fetch, then (the remote branch's tip, sha -> the remote's bytes) of the receipts `names` this
    home's branch holds there: `receipts prune` compares them with the local files."""
    with _mirror_lock(store):
        fetch(store, access)
        ref = TRACKING + store.home_id()
        tip = _rev(store, ref)
        tree = tree_of(store, ref)
    want = [(n, tree[f"receipts/{n}.json"]) for n in names if f"receipts/{n}.json" in tree]
    got = dict(zip((n for n, _ in want), (d for _, d in _cat_blobs(store, [o for _, o in want])), strict=True))
    return tip, got


QUARANTINE = "quarantine"  # the command of a receipt that sets a home's branch aside


def branch_tip(store: EvidenceStore, home: str) -> str | None:
    """The last fetched tip of `home`'s branch (None: the remote has no such branch)."""
    return _rev(store, TRACKING + home)


def quarantine_decisions(stores: Sequence[tuple[str, EvidenceStore]]) -> dict[str, dict[str, str]]:
    """home -> the newest passed `quarantine` receipt of any (deciding home, store) setting its
    branch aside: who, why, when, at which tip, which receipt."""
    found: list[dict[str, str]] = []
    for decider, st in stores:
        for summ in st.summaries(None):
            if summ.get("command") != QUARANTINE:
                continue
            try:
                r = st.load(summ["hash"])
            except (EvidenceError, ValueError):
                continue
            step = r.step("decision")
            if r.outcome != "passed" or step is None:
                continue
            d = step.data
            if not all(isinstance(d.get(k), str) for k in ("home", "tip", "reason")):
                continue
            what = {k: d[k] for k in ("home", "tip", "reason")}
            found.append(
                {**what, "by": r.operator or "?", "by_home": decider, "at": r.finished_at, "receipt": r.sha256}
            )
    return {d["home"]: d for d in sorted(found, key=lambda x: x["at"])}
