"""Fixtures for the fault matrix: the lab hosts, two packages, and the `faults` pairs on tmpfs roots.

By default the shards' hosts are `lab3` (lab3.yaml: three sshd host pairs) and `lab_faults`
(labfaults.yaml: three more), never the `lab` pair the other lab tests deploy on, so the matrix
runs in shards, one pair per shard; and the
packages are `lab_packages` / `lab_packages_b` from `pairctl build`. For development on a busy
machine some variables point elsewhere (never set in CI):
  PAIRCTL_FAULTS_LAB_INVENTORY=PATH   a lab inventory of your own (its hosts are brought up here;
                                      one shard per pair in it)
  PAIRCTL_FAULTS_PACKAGES="A B"       two package ids already in the home's store
  PAIRCTL_FAULTS_SHARDS=N             shards run side by side (default 6, at most one per host pair)
and PAIRCTL_FAULTS_ONLY / PAIRCTL_FAULTS_STEPS (comma lists) run a part of the matrix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.build.store import PackageStore
from orchestrator.config.loader import read_yaml
from orchestrator.engine import route_trust
from orchestrator.paths import Home
from tests.faults.harness import PAIR, lab_for, packages_for

# lab3's three pairs and lab_faults' three: cells mostly wait (cuts, timeouts), so six side by side fit
# 2 cores
DEFAULT_SHARDS = 6


@dataclass(frozen=True)
class ShardSite:
    """Where one shard's pair lives: the sshd hosts of `base_pair` in `base_inventory`."""

    base_inventory: Path
    base_pair: str
    name: str
    ports: tuple[int, int]


@dataclass(frozen=True)
class FaultMatrix:
    home_root: Path
    packages: tuple[str, str]
    root_mb: int
    sites: list[ShardSite]


def _root_mb(pairctl_home: Path, packages: tuple[str, str]) -> int:
    store = PackageStore(Home.resolve(pairctl_home).store)
    size = max(sum(e.size for e in store.get(p).manifest.files.values()) for p in packages)
    return 3 * (size >> 20) + 48  # two releases + one upload in flight + run logs, route, leases


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the fault matrix mounts tmpfs install roots: needs root")


@pytest.fixture(scope="session")
def fault_matrix(request, pairctl_home) -> FaultMatrix:
    """The shards' sites: lab3's and lab_faults' pairs, each shard a pair of sshd hosts."""
    _need_root()
    want = int(os.environ.get("PAIRCTL_FAULTS_SHARDS", DEFAULT_SHARDS))
    if os.environ.get("PAIRCTL_FAULTS_LAB_INVENTORY"):
        home, inv_path, _ = lab_for(request, pairctl_home)
        bases = [(inv_path, p) for p in read_yaml(inv_path)["pairs"]]
    else:  # hosts of its own: the matrix runs beside the tests on `lab` (its own xdist group)
        envs = [request.getfixturevalue(x) for x in ("lab3", "lab_faults")[: 1 if want <= 3 else 2]]
        home = envs[0].home
        bases = [(e.inventory_path, p) for e in envs for p in read_yaml(e.inventory_path)["pairs"]]
    packages = packages_for(request, pairctl_home)
    sites = [
        ShardSite(path, bpair, PAIR if i == 0 else f"{PAIR}{i}", (8190 + i, 50190 + i))
        for i, (path, bpair) in enumerate(bases[: max(1, want)])
    ]
    route_trust.route_key(home)  # made once here, not raced for by the shards' first runs
    return FaultMatrix(home.root, packages, _root_mb(pairctl_home, packages), sites)
