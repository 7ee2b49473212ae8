"""Reading a source repository: revisions, trees, cleanliness, and exporting an exact tree.

Builds never compile the working copy: they write REV's blobs raw (no `.gitattributes`, no
filters) and then prove, by blob id, that the exported folder is byte-for-byte that tree.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import BuildError


@dataclass(frozen=True)
class Revision:
    """A commit, its tree and its commit count (llama.cpp's build number)."""

    commit: str
    tree: str
    count: int

    @property
    def short(self) -> str:
        return self.commit[:10]

    @property
    def build_info(self) -> str:
        """What llama-server reports as `/props` `build_info`: `b<N>-<commit>`."""
        return f"b{self.count}-{self.short}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # the operator's own git config (aliases, filters, autocrlf) must not change what is built
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


def commit_env(name: str, email: str, date: str) -> dict[str, str]:
    """`_env()` plus a fixed author, committer and date: commits pairctl makes (the lab baseline,
    a kernel patch on top of a revision) get the same id on every machine."""
    env = _env()
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email,
        GIT_AUTHOR_DATE=date,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email,
        GIT_COMMITTER_DATE=date,
    )
    return env


def git(
    repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["git", "-C", str(repo), *args], env=env or _env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def require_repo(repo: Path) -> Path:
    repo = Path(repo)
    if not repo.is_dir():
        raise BuildError(
            f"source {repo} does not exist",
            hint="name your llama.cpp clone with --source DIR (the default is the source `pairctl lab up` makes)",
        )
    proc = git(repo, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != repo.resolve():
        raise BuildError(f"source {repo} is not the top of a git repository")
    return repo


def dirty_paths(repo: Path) -> list[str]:
    """`git status --porcelain` lines (tracked changes and untracked files); empty = clean."""
    out = git(repo, "status", "--porcelain", "--untracked-files=all").stdout
    return [line for line in out.splitlines() if line.strip()]


def require_clean(repo: Path) -> None:
    dirty = dirty_paths(repo)
    if dirty:
        shown = "\n".join(f"  {d}" for d in dirty[:20]) + (
            f"\n  ... and {len(dirty) - 20} more" if len(dirty) > 20 else ""
        )
        raise BuildError(
            f"source {repo} has uncommitted changes or untracked files; refusing to build:\n{shown}",
            hint="commit or remove them: a package is built only from an exact, clean revision",
        )


def resolve(repo: Path, rev: str) -> Revision:
    """Resolve REV to a commit (refusing trees, blobs and unknown names)."""
    if not rev or rev.startswith("-"):
        raise BuildError(f"revision {rev!r} is not valid")
    proc = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0:
        kind = git(repo, "cat-file", "-t", "--end-of-options", rev, check=False).stdout.strip()
        what = f"a {kind}, not a commit" if kind else "not a known revision"
        raise BuildError(f"revision {rev!r} in {repo} is {what}")
    commit = proc.stdout.strip()
    tree = git(repo, "rev-parse", "--verify", f"{commit}^{{tree}}").stdout.strip()
    count = int(git(repo, "rev-list", "--count", commit).stdout.strip())
    return Revision(commit=commit, tree=tree, count=count)


def require_tree(repo: Path, rev: Revision, expect_rev: str) -> Revision:
    """`--expect-tree`: REV's tree must equal EXPECT's (e.g. the merge equals the reviewed head)."""
    expected = resolve(repo, expect_rev)
    if expected.tree != rev.tree:
        raise BuildError(
            f"tree mismatch: {rev.short} has tree {rev.tree} but --expect-tree {expect_rev} "
            f"({expected.short}) has tree {expected.tree}; refusing to build",
            hint=f"`git diff {expected.short} {rev.short}` shows what differs",
        )
    return expected


@dataclass(frozen=True)
class TreeEntry:
    """One path of a commit's tree as `git ls-tree -r` lists it: mode, object id, path."""

    mode: str  # 100644, 100755, 120000 (symlink) or 160000 (submodule: an empty folder)
    oid: str
    path: str


def tree_entries(repo: Path, commit: str) -> list[TreeEntry]:
    """Every blob and submodule of COMMIT's tree; a path git itself would never check out
    (absolute, `..`, `.`, `.git`) is refused before anything is written."""
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-z", "--full-tree", commit],
                         env=_env(), capture_output=True)  # fmt: skip
    if out.returncode != 0:
        raise BuildError(f"git ls-tree {commit} failed in {repo}: {out.stderr.decode(errors='replace').strip()}")
    entries = []
    for rec in out.stdout.split(b"\0"):
        if not rec:
            continue
        meta, _, raw_path = rec.partition(b"\t")
        mode, _kind, oid = meta.decode().split()
        path = raw_path.decode("utf-8", errors="surrogateescape")
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") or p.lower() == ".git" for p in parts):
            raise BuildError(f"commit {commit} has a path git would not check out: {path!r}; refusing to build")
        if mode not in ("100644", "100755", "120000", "160000"):
            raise BuildError(f"commit {commit}: {path} has mode {mode}, which no checkout writes; refusing to build")
        entries.append(TreeEntry(mode, oid, path))
    # a crafted tree may list a name twice (mktree takes it): a link `x`, then `x/...` that the export
    # would write through it
    names = {e.path for e in entries}
    for e in entries:
        top = next((p for p in _parents(e.path) if p in names), None)
        if top is not None:
            raise BuildError(f"commit {commit}: {e.path} lies inside {top}, which the tree also lists as a file, "
                             "link or submodule; no checkout writes both; refusing to build")  # fmt: skip
    if len(names) < len(entries):
        raise BuildError(f"commit {commit}: its tree lists a path twice; no checkout writes both; refusing to build")
    return entries


def _parents(path: str) -> Iterator[str]:
    parts = path.split("/")
    return ("/".join(parts[:i]) for i in range(1, len(parts)))


def _object_format(repo: Path) -> str:
    proc = git(repo, "rev-parse", "--show-object-format", check=False)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "sha1"


def blob_id(data: bytes, object_format: str = "sha1") -> str:
    """The id git gives a blob of these bytes (`hash-object --no-filters`), with no `.gitattributes` involved."""
    h = hashlib.new("sha256" if object_format == "sha256" else "sha1")
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def _read_blobs(repo: Path, oids: list[str]) -> Iterator[tuple[str, bytes]]:
    """The raw bytes of each blob (`git cat-file --batch`: no attributes, no filters, no
    conversion); stdin is fed from a thread so neither pipe can fill and block the other."""
    proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write("".join(f"{o}\n" for o in oids).encode())
            proc.stdin.close()
        except OSError:
            pass  # git exited; the reader below says why

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        for oid in oids:
            header = proc.stdout.readline().decode(errors="replace").split()
            if len(header) != 3 or header[1] != "blob":
                raise BuildError(f"git cat-file could not read blob {oid} in {repo}: {' '.join(header) or 'no answer'}")
            size = int(header[2])
            data = proc.stdout.read(size)
            proc.stdout.read(1)  # the newline after each object
            if len(data) != size:
                raise BuildError(f"git cat-file returned {len(data)} of {size} bytes of blob {oid} in {repo}")
            yield oid, data
    finally:
        proc.stdout.close()
        writer.join()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create PATH (never through a link, never over an existing file) with exactly DATA."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # the umask must not take the executable bit a blob's mode gives


def export_tree(repo: Path, commit: str, dest: Path) -> None:
    """Write exactly COMMIT's blobs into the new folder DEST, raw: not `git archive`, which applies
    `.gitattributes` (ident, eol, filters, export-subst) and can differ from the commit. Links are
    made last so no file is written through one."""
    dest.mkdir(parents=True, exist_ok=False)
    entries = tree_entries(repo, commit)
    blobs = [e for e in entries if e.mode != "160000"]
    by_oid: dict[str, list[TreeEntry]] = {}
    for e in blobs:
        by_oid.setdefault(e.oid, []).append(e)
    links: list[tuple[TreeEntry, bytes]] = []
    try:
        for oid, data in _read_blobs(repo, list(by_oid)):
            for e in by_oid[oid]:
                if e.mode == "120000":
                    links.append((e, data))
                else:
                    _write_new(dest / e.path, data, 0o755 if e.mode == "100755" else 0o644)
        for e in entries:
            if e.mode == "160000":
                (dest / e.path).mkdir(parents=True, exist_ok=True)  # as `git archive` does: an empty folder
        for e, target in links:
            (dest / e.path).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.fsdecode(target), dest / e.path)
    except OSError as exc:
        raise BuildError(f"exporting {commit} from {repo} into {dest} failed: {exc}") from None


def export_differences(repo: Path, commit: str, work_tree: Path) -> list[str]:
    """Each way WORK_TREE differs from COMMIT's tree, one line per path ("" nowhere: equal).

    Compared here, byte for byte, by blob id and mode: `git diff` would apply the repository's
    `.gitattributes` to both sides and call an `$Id$`-expanded or CRLF-converted file equal."""
    fmt = _object_format(repo)
    expected = {e.path: e for e in tree_entries(repo, commit)}
    problems: list[str] = []
    seen: set[str] = set()
    for top, dirs, files in os.walk(work_tree):
        rel_top = os.path.relpath(top, work_tree)
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(top, d))]):
            full = os.path.join(top, name)
            rel = os.path.normpath(os.path.join(rel_top, name)).replace(os.sep, "/")
            seen.add(rel)
            want = expected.get(rel)
            if want is None:
                problems.append(f"{rel}: not in {commit[:10]}'s tree")
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                mode, data = "120000", os.fsencode(os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                mode = "100755" if st.st_mode & 0o100 else "100644"
                data = Path(full).read_bytes()
            else:
                problems.append(f"{rel}: not a regular file or link")
                continue
            if mode != want.mode:
                problems.append(f"{rel}: mode {mode}, the commit has {want.mode}")
            elif blob_id(data, fmt) != want.oid:
                problems.append(f"{rel}: bytes differ from the commit's blob {want.oid[:12]}")
        for d in dirs:
            rel = os.path.normpath(os.path.join(rel_top, d)).replace(os.sep, "/")
            want = expected.get(rel)
            if want is not None and want.mode == "160000":
                seen.add(rel)
                if os.listdir(os.path.join(top, d)):
                    problems.append(f"{rel}: a submodule's folder, expected empty")
    problems += [f"{p}: missing from the export" for p in sorted(set(expected) - seen)]
    return problems
