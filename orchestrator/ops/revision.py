"""Deploy by revision: which packages of the store a pair gets for REV ((revision, target,
profile) names at most one). Every pair is resolved before anything starts, and one refusal
names every missing package with the `pairctl build` command that makes it."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from orchestrator.build import git
from orchestrator.build.manifest import package_id
from orchestrator.build.store import PackageStore
from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import load_profile
from orchestrator.errors import BuildError, ConfigError, PackageError
from orchestrator.paths import Home

_FULL = re.compile(r"^[0-9a-f]{40}$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class PairPackages:
    """What one pair gets for a revision: package ids per role, the profile they were built for."""

    pair: str
    profile: str  # the profile as the inventory (or --profile) names it: passed to deploy
    profile_name: str  # the profile's `name`: the package id prefix
    native: str
    rpc: str

    @property
    def ids(self) -> tuple[str, str]:
        return (self.native, self.rpc)


def resolve_commit(home: Home, rev: str, source: Path | None = None) -> str:
    """REV as a full commit id: as given, through the source repository, or else a unique prefix
    of a revision the store holds."""
    if not rev or rev.startswith("-"):
        raise ConfigError(f"--rev {rev!r} is not a revision")
    if _FULL.match(rev):
        return rev
    repo = source or home.lab / "source"
    if repo.is_dir():
        try:
            return git.resolve(git.require_repo(repo), rev).commit
        except BuildError as exc:
            hint = "give a commit, tag or branch of the source you build from"
            raise PackageError(str(exc.message), hint=hint) from None
    if _HEX.match(rev):
        found = {p.manifest.revision for p in PackageStore(home.store).list() if p.manifest.revision.startswith(rev)}
        if len(found) == 1:
            return found.pop()
    raise PackageError(
        f"--rev {rev!r}: no source repository at {repo} to resolve it, and it is not a unique revision prefix "
        "of the package store",
        hint="give the full commit id, or --source DIR (the repository `pairctl build --source` used)",
    )


def build_command(rev: str, targets: list[str], profile_name: str, source: Path | None) -> str:
    argv = ["pairctl", "build", "--rev", rev, *(a for t in targets for a in ("--target", t))]
    argv += ["--profile", profile_name, *(["--source", str(source)] if source is not None else [])]
    return shlex.join(argv)


def resolve_packages(
    home: Home,
    inventory: Inventory,
    pairs: list[str],
    rev: str,
    commit: str,
    *,
    profile_override: str | None = None,
    source: Path | None = None,
) -> dict[str, PairPackages]:
    """Per pair, the packages built from `commit` for its native and RPC targets and profile.
    Raises PackageError (exit 6) naming every missing package and the build command for each."""
    store = PackageStore(home.store)
    out: dict[str, PairPackages] = {}
    missing: dict[tuple[str, str], list[str]] = {}  # (profile name, target) -> pairs needing it
    for name in pairs:
        spec = inventory.pair(name)
        ref = profile_override or spec.profile
        prof = load_profile(ref, pair=spec)
        ids: list[str] = []
        for role, target in (("native", spec.target_native), ("rpc", spec.target_rpc)):
            if not target:
                raise ConfigError(
                    f"inventory: pair {name}: field 'target_{role}' is not set, so --rev cannot choose its package",
                    hint=f"set pairs.{name}.target_{role} to the build target of that host (e.g. cpu-lab, v100)",
                )
            pid = package_id(prof.name, commit, target)
            if not _matches(store, pid, commit, target):
                pairs_of = missing.setdefault((prof.name, target), [])
                if name not in pairs_of:
                    pairs_of.append(name)
            ids.append(pid)
        out[name] = PairPackages(name, ref, prof.name, ids[0], ids[1])
    if missing:
        by_profile: dict[str, list[str]] = {}
        for pname, target in missing:
            by_profile.setdefault(pname, []).append(target)
        what = "; ".join(f"{package_id(p, commit, t)} (for {', '.join(missing[(p, t)])})" for (p, t) in missing)
        cmds = " && ".join(build_command(rev, ts, p, source) for p, ts in by_profile.items())
        raise PackageError(
            f"--rev {rev} ({commit[:10]}): not in the package store: {what}; nothing was started",
            hint=f"build them first: {cmds}",
        )
    return out


def _matches(store: PackageStore, pid: str, commit: str, target: str) -> bool:
    if not store.exists(pid):
        return False
    m = store.get(pid).manifest
    return m.revision == commit and m.target.name == target
