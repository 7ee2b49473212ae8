"""`pairctl build --patch kernels/<name>`: turn REV + a kernel patch into a new exact commit.

The patch is applied to REV's tree in a throw-away index (`git apply --cached`), never to a working
copy, and committed on REV with a fixed identity and REV's committer date: the same patch on the same
REV always gives the same commit id, whose message names the patch and its sha256.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.build.git import commit_env, git
from orchestrator.config.kernels import KernelPatch, load_kernel
from orchestrator.errors import BuildError, ConfigError
from orchestrator.log import get_logger

PATCH_GIT_NAME = "pairctl kernels"
PATCH_GIT_EMAIL = "kernels@pairctl.invalid"
REF_PREFIX = "refs/pairctl/kernels"


@dataclass(frozen=True)
class PatchedRevision:
    """What `apply_patch_commit` made: the new commit, on which base, from which patch."""

    commit: str
    tree: str
    base: str
    kernel: str
    patch_sha256: str
    ref: str


def _env(date: str) -> dict[str, str]:
    return commit_env(PATCH_GIT_NAME, PATCH_GIT_EMAIL, date)


def commit_message(meta: KernelPatch, base: str) -> str:
    return (
        f"kernels: {meta.name}\n\n"
        f"{meta.title}\n\n"
        f"Applied by pairctl onto {base}.\n\n"
        f"Pairctl-Kernel-Patch: kernels/{meta.name}/{meta.patch}\n"
        f"Pairctl-Patch-Sha256: {meta.patch_sha256}\n"
        f"Pairctl-Base: {base}\n"
    )


def check_base_blobs(repo: Path, base: str, meta: KernelPatch) -> None:
    """The files the patch touches must be, at REV, exactly the blobs it was written against."""
    for path, want in sorted(meta.base.blobs.items()):
        proc = git(repo, "rev-parse", "--verify", "--quiet", f"{base}:{path}", check=False)
        got = proc.stdout.strip()
        if proc.returncode != 0:
            raise BuildError(f"patch {meta.name}: {path} does not exist at {base[:12]}; the patch cannot apply")
        if got != want:
            raise BuildError(
                f"patch {meta.name} was written against {path} blob {want[:12]}, but {base[:12]} has blob {got[:12]}; "
                "refusing to apply it to a different base",
                hint=f"rebase the patch onto this revision and update kernels/{meta.name}/kernel.yaml "
                "(base.blobs, patch_sha256)",
            )


def _patch_and_base(repo: Path, rev: str, patch_dir: Path | str) -> tuple[Path, KernelPatch, str]:
    """The kernel patch's folder and metadata, and the commit REV names once it holds the patch's base blobs."""
    try:
        d, meta = load_kernel(patch_dir)
    except ConfigError as exc:
        raise BuildError(f"kernel patch {patch_dir}: {exc}") from None
    proc = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BuildError(f"revision {rev!r} is not a commit in {repo}")
    base = proc.stdout.strip()
    check_base_blobs(repo, base, meta)
    return d, meta, base


def apply_patch_commit(repo: Path | str, rev: str, patch_dir: Path | str) -> str:
    """Apply `patch_dir`'s patch onto REV in a throw-away index and commit it; return the new commit.

    Raises BuildError when the patch does not apply or REV is not its base, ConfigError when the
    patch folder's metadata does not match its diff."""
    return apply_patch(repo, rev, patch_dir).commit


def apply_patch(repo: Path | str, rev: str, patch_dir: Path | str) -> PatchedRevision:
    repo = Path(repo)
    log = get_logger(step="build.patch", repo=str(repo))
    d, meta, base = _patch_and_base(repo, rev, patch_dir)
    patch = d / meta.patch
    date = git(repo, "show", "-s", "--format=%cI", base).stdout.strip()
    env = _env(date)

    with tempfile.TemporaryDirectory(prefix="pairctl-patch-") as tmp:
        env["GIT_INDEX_FILE"] = str(Path(tmp) / "index")
        git(repo, "read-tree", base, env=env)
        applied = git(repo, "apply", "--cached", "--whitespace=nowarn", "--", str(patch), env=env, check=False)
        if applied.returncode != 0:
            raise BuildError(
                f"patch {meta.name} ({patch}) does not apply cleanly onto {base[:12]}:\n{applied.stderr.strip()}",
                hint="the build stops here; fix or rebase the patch",
            )
        tree = git(repo, "write-tree", env=env).stdout.strip()
    base_tree = git(repo, "rev-parse", f"{base}^{{tree}}").stdout.strip()
    if tree == base_tree:
        raise BuildError(f"patch {meta.name} changes nothing at {base[:12]}")
    commit = git(
        repo, "commit-tree", "--no-gpg-sign", tree, "-p", base, "-m", commit_message(meta, base), env=env
    ).stdout.strip()
    ref = f"{REF_PREFIX}/{meta.name}/{base[:12]}"
    # Keep the commit reachable (so gc cannot drop it) under a ref naming patch and base.
    git(repo, "update-ref", ref, commit, env=env)
    log.info("kernel patch committed", kernel=meta.name, base=base, commit=commit, patch_sha256=meta.patch_sha256)
    return PatchedRevision(
        commit=commit, tree=tree, base=base, kernel=meta.name, patch_sha256=meta.patch_sha256, ref=ref
    )


def verify_patch(patch_dir: Path | str, repo: Path | str, rev: str = "baseline") -> dict[str, str]:
    """Check without committing: metadata matches the diff, REV has the base blobs, the diff applies."""
    repo = Path(repo)
    d, meta, base = _patch_and_base(repo, rev, patch_dir)
    with tempfile.TemporaryDirectory(prefix="pairctl-patch-") as tmp:
        env = _env("1970-01-01T00:00:00+0000")
        env["GIT_INDEX_FILE"] = str(Path(tmp) / "index")
        git(repo, "read-tree", base, env=env)
        applied = git(repo, "apply", "--cached", "--check", "--", str(d / meta.patch), env=env, check=False)
        if applied.returncode != 0:
            raise BuildError(f"patch {meta.name} does not apply cleanly onto {base[:12]}:\n{applied.stderr.strip()}")
    return {"kernel": meta.name, "repo": str(repo), "rev": rev, "base": base, "patch_sha256": meta.patch_sha256}


def patch_digest(patch_dir: Path | str) -> str:
    """The sha256 of the patch's diff, verified against its kernel.yaml (what a package manifest records)."""
    try:
        return load_kernel(patch_dir)[1].patch_sha256
    except ConfigError as exc:
        raise BuildError(f"kernel patch {patch_dir}: {exc}") from None
