"""git's own bisect (which commit next, which is first bad: git's answers), driven in a private
bare `--shared` clone in the home: `git bisect` keeps its state in the repository it runs in, and
the operator's checkout must stay untouched. `--no-checkout` only moves BISECT_HEAD (builds export
a commit's tree themselves), and an interrupted bisect resumes from git's own state."""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.build import git
from orchestrator.build.git import Revision
from orchestrator.errors import BuildError, UsageError

Verdict = Literal["good", "bad", "skip"]
_FIRST_BAD = re.compile(r"^# first bad commit: \[([0-9a-f]{40})\]", re.M)
_POSSIBLE = re.compile(r"^# possible first bad commit: \[([0-9a-f]{40})\]", re.M)


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    def as_dict(self) -> dict[str, str]:
        return {"commit": self.sha, "subject": self.subject}


@dataclass(frozen=True)
class Range:
    """good..bad in the source: the commits that may be the first bad one (oldest first)."""

    good: Revision
    bad: Revision
    commits: tuple[Commit, ...]
    git_steps: int  # git's own estimate after the first step (`rev-list --bisect-vars` bisect_steps)

    @property
    def size(self) -> int:
        return len(self.commits)

    @property
    def max_judged_steps(self) -> int:
        """ceil(log2 N) verdicts name the first of N candidates in a linear history with no
        skipped commit (each verdict at least halves the candidates); a skip costs one more."""
        return math.ceil(math.log2(self.size)) if self.size > 1 else 0

    def as_dict(self) -> dict[str, object]:
        return {
            "good": self.good.commit,
            "bad": self.bad.commit,
            "commits": [c.as_dict() for c in self.commits],
            "size": self.size,
            "estimated_steps": (self.git_steps + 1) if self.size > 1 else 0,
            "max_judged_steps": self.max_judged_steps,
        }


def _resolve(repo: Path, rev: str, flag: str) -> Revision:
    try:
        return git.resolve(repo, rev)
    except BuildError as exc:
        raise UsageError(f"{flag} {rev!r}: {exc.message}", hint="give a commit, tag or branch of the source") from None


def resolve_range(repo: Path, good: str, bad: str) -> Range:
    """Both ends resolved and checked: good must be a proper ancestor of bad."""
    g, b = _resolve(repo, good, "--good"), _resolve(repo, bad, "--bad")
    if g.commit == b.commit:
        raise UsageError(f"--good {good} and --bad {bad} are the same commit ({g.short}); nothing to bisect")
    if git.git(repo, "merge-base", "--is-ancestor", g.commit, b.commit, check=False).returncode != 0:
        raise UsageError(
            f"--good {good} ({g.short}) is not an ancestor of --bad {bad} ({b.short})",
            hint="the good revision must be older than the bad one on the same history (swap them?)",
        )
    out = git.git(repo, "log", "--reverse", "--format=%H %s", f"{g.commit}..{b.commit}").stdout
    commits = tuple(Commit(*(line.split(" ", 1) + [""])[:2]) for line in out.splitlines() if line.strip())
    vars_out = git.git(repo, "rev-list", "--bisect-vars", b.commit, f"^{g.commit}").stdout
    m = re.search(r"^bisect_steps=(\d+)", vars_out, re.M)
    return Range(good=g, bad=b, commits=commits, git_steps=int(m.group(1)) if m else 0)


@dataclass(frozen=True)
class Mark:
    """git's state after a verdict: the next commit to judge, or the answer."""

    next: str | None
    first_bad: str | None
    candidates: tuple[str, ...]  # only skipped commits left: the first bad is one of these
    output: str

    @property
    def done(self) -> bool:
        return self.next is None


class PrivateBisect:
    """`git bisect` in `<dir>/repo.git`, a bare `--shared` clone of `source`."""

    def __init__(self, folder: Path, source: Path) -> None:
        self.repo = folder / "repo.git"
        self.source = source

    def exists(self) -> bool:
        return (self.repo / "BISECT_START").is_file()

    def start(self, rng: Range) -> Mark:
        shutil.rmtree(self.repo, ignore_errors=True)
        self.repo.parent.mkdir(parents=True, exist_ok=True)
        git.git(self.source, "clone", "-q", "--bare", "--shared", "--no-tags", str(self.source), str(self.repo))
        git.git(self.repo, "bisect", "start", "--no-checkout", rng.bad.commit, rng.good.commit)
        return self.state("")

    def mark(self, commit: str, verdict: Verdict) -> Mark:
        proc = git.git(self.repo, "bisect", verdict, commit, check=False)
        if proc.returncode not in (0, 2):  # 2: only skipped commits are left (an answer, not an error)
            raise BuildError(f"git bisect {verdict} {commit[:10]} failed: {(proc.stderr or proc.stdout).strip()}")
        return self.state(proc.stdout)

    def log(self) -> str:
        return git.git(self.repo, "bisect", "log", check=False).stdout

    def state(self, output: str) -> Mark:
        log = self.log()
        first = _FIRST_BAD.search(log)
        possible = tuple(_POSSIBLE.findall(log))
        if first or possible:
            return Mark(None, first.group(1) if first else None, possible, output)
        head = git.git(self.repo, "rev-parse", "--verify", "--quiet", "BISECT_HEAD", check=False).stdout.strip()
        return Mark(head or None, None, (), output)

    def remove(self) -> None:
        shutil.rmtree(self.repo, ignore_errors=True)
