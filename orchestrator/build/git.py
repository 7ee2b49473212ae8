"""Reading a source repository: revisions, trees, cleanliness, and exporting an exact tree.

Builds never compile the working copy: they export REV's tree with `git archive` and then
prove, with a throw-away index, that the exported folder is byte-for-byte that tree.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
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
        raise BuildError(f"source {repo} does not exist", hint="`pairctl lab up` creates the lab source")
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


def export_tree(repo: Path, commit: str, dest: Path) -> None:
    """Write exactly COMMIT's tree into the empty folder DEST (`git archive | tar -x`)."""
    dest.mkdir(parents=True, exist_ok=False)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())  # fmt: skip
    untar = subprocess.run(["tar", "-x", "-f", "-", "-C", str(dest)], stdin=archive.stdout, capture_output=True)
    assert archive.stdout is not None
    archive.stdout.close()
    err = archive.stderr.read().decode(errors="replace") if archive.stderr else ""
    if archive.wait() != 0 or untar.returncode != 0:
        raise BuildError(
            f"exporting {commit} from {repo} failed: {err.strip()} {untar.stderr.decode(errors='replace').strip()}"
        )


def diff_against(repo: Path, commit: str, work_tree: Path) -> str:
    """`git diff` of WORK_TREE against COMMIT using a throw-away index; "" proves they are equal.

    Untracked files in WORK_TREE are listed too, so an extra file is a difference.
    """
    with tempfile.TemporaryDirectory(prefix="pairctl-index-") as tmp:
        env = _env()
        env["GIT_INDEX_FILE"] = str(Path(tmp) / "index")
        base = [
            "--git-dir",
            str(Path(git(repo, "rev-parse", "--absolute-git-dir").stdout.strip())),
            "--work-tree",
            str(work_tree),
        ]

        def run(*args: str) -> str:
            proc = subprocess.run(["git", *base, *args], env=env, capture_output=True, text=True)
            if proc.returncode not in (0, 1):
                raise BuildError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
            return proc.stdout

        run("read-tree", commit)
        run("update-index", "-q", "--refresh")
        diff = run("diff-files", "-p", "--no-color")
        extra = run("ls-files", "--others", "-z")
        lines = [diff] if diff else []
        lines += [f"untracked: {p}\n" for p in extra.split("\0") if p]
        return "".join(lines)
