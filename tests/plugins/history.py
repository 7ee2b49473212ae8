"""A source history to bisect: N commits of harmless changes on top of a revision, with one
breaking commit (a mutant patch folder, tests/mutants/*) at a known point and, optionally,
commits that do not build.

Made with git plumbing in a throw-away index (no checkout of the llama.cpp tree: 16 commits take
about a second), with a fixed identity and dates, so the same arguments give the same commit ids
on every machine, and so the same package ids: a home that built them once builds nothing again.

- harmless commit k: appends line k to `docs/pairctl-bisect-fixture.md` (no compiled file
  changes: with the ccache warm a build is a configure, cache hits and the links);
- breaking commit: the patch folder's diff applied with `git apply --cached` (its base blobs
  must be unchanged at that point, which harmless commits guarantee);
- a commit that does not build: `message(FATAL_ERROR ...)` appended to the top CMakeLists.txt,
  which fails the configure in seconds; the next commit puts the file back.

The tip is kept reachable by `refs/pairctl/test-history/<name>`. Fixture `lab_history(name, n,
breaking_at, patch, unbuildable_at=())`: the same on the lab source's `baseline`.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.lab.source import git_env

FIXTURE_DOC = "docs/pairctl-bisect-fixture.md"
UNBUILDABLE_LINE = 'message(FATAL_ERROR "pairctl bisect fixture: this revision does not build")\n'
BASE_DATE = 1_780_000_000  # 2026-05-28, seconds: commit k is dated BASE_DATE + 60 * k


@dataclass(frozen=True)
class History:
    base: str
    commits: tuple[str, ...]  # oldest first; commits[-1] is the tip (the bad end)
    breaking: str  # the breaking commit (the first bad one)
    breaking_index: int
    unbuildable: tuple[str, ...]

    @property
    def tip(self) -> str:
        return self.commits[-1]


class _Index:
    """git plumbing against one repository with a private index file."""

    def __init__(self, repo: Path, index: Path) -> None:
        self.repo, self.index = repo, index

    def git(self, *args: str, stdin: str | None = None, date: int | None = None) -> str:
        env = git_env()
        env["GIT_INDEX_FILE"] = str(self.index)
        if date is not None:
            stamp = f"{date} +0000"
            env.update(GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
        proc = subprocess.run(
            ["git", "-C", str(self.repo), *args], input=stdin, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def put(self, path: str, content: str) -> None:
        blob = self.git("hash-object", "-w", "--stdin", stdin=content)
        self.git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")

    def read(self, rev: str, path: str) -> str:
        proc = subprocess.run(["git", "-C", str(self.repo), "cat-file", "blob", f"{rev}:{path}"], env=git_env(),
                              capture_output=True, text=True, check=True)  # fmt: skip
        return proc.stdout

    def commit(self, parent: str, message: str, date: int) -> str:
        tree = self.git("write-tree")
        return self.git("commit-tree", tree, "-p", parent, "-m", message, date=date)


def make_history(
    repo: Path,
    base: str,
    *,
    name: str,
    n: int,
    breaking_at: int,
    patch_dir: Path,
    unbuildable_at: tuple[int, ...] = (),
) -> History:
    """`n` commits on top of `base` (index 0 is the first); commit `breaking_at` applies
    `patch_dir`'s patch.diff (every later commit keeps it); each index in `unbuildable_at`
    does not build (the commit after it builds again). Idempotent."""
    if not 0 <= breaking_at < n or any(not 0 <= u < n for u in unbuildable_at) or breaking_at in unbuildable_at:
        raise ValueError("breaking_at and unbuildable_at must be distinct indices in range(n)")
    with tempfile.TemporaryDirectory(prefix="pairctl-history-") as tmp:
        ix = _Index(repo, Path(tmp) / "index")
        parent = ix.git("rev-parse", "--verify", f"{base}^{{commit}}")
        base_commit = parent
        ix.git("read-tree", parent)
        cmake = ix.read(parent, "CMakeLists.txt")
        doc = ""
        commits: list[str] = []
        unbuildable: list[str] = []
        for k in range(n):
            if k - 1 in unbuildable_at and k not in unbuildable_at:
                ix.put("CMakeLists.txt", cmake)  # builds again
            if k == breaking_at:
                diff = (patch_dir / "patch.diff").read_text(encoding="utf-8")
                ix.git("apply", "--cached", "--whitespace=nowarn", "-", stdin=diff)
                message = f"bisect fixture {name}: {patch_dir.name} (the breaking commit)"
            elif k in unbuildable_at:
                ix.put("CMakeLists.txt", cmake + UNBUILDABLE_LINE)
                message = f"bisect fixture {name}: commit {k} does not build (CMakeLists.txt FATAL_ERROR)"
            else:
                doc += f"bisect fixture {name}: harmless change {k}\n"
                ix.put(FIXTURE_DOC, doc)
                message = f"bisect fixture {name}: harmless change {k}"
            parent = ix.commit(parent, message, BASE_DATE + 60 * (k + 1))
            commits.append(parent)
            if k in unbuildable_at:
                unbuildable.append(parent)
        ix.git("update-ref", f"refs/pairctl/test-history/{name}", parent)
    return History(
        base=base_commit,
        commits=tuple(commits),
        breaking=commits[breaking_at],
        breaking_index=breaking_at,
        unbuildable=tuple(unbuildable),
    )


MUTANTS = Path(__file__).resolve().parents[1] / "mutants"


@pytest.fixture
def lab_history(lab_source: Path) -> Callable[..., History]:
    """`lab_history(name, n=16, breaking_at=9, patch="cache-off", unbuildable_at=())`: a history
    on the lab source's `baseline` with the tests/mutants patch folder `patch` (e.g.
    "perf/slow-decode") at `breaking_at`."""

    def make(
        name: str, *, n: int = 16, breaking_at: int = 9, patch: str = "cache-off", unbuildable_at: tuple[int, ...] = ()
    ) -> History:
        return make_history(
            lab_source, "baseline", name=name, n=n, breaking_at=breaking_at, patch_dir=MUTANTS / patch,
            unbuildable_at=unbuildable_at,
        )  # fmt: skip

    return make
