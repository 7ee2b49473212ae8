"""Fixtures for the fault matrix: the lab hosts, two packages, and the `faults` pair on tmpfs roots.

By default the lab is the session's `lab` fixture (manifests/inventories/lab.yaml) and the
packages are `lab_packages` / `lab_packages_b` from `pairctl build`. For development on a busy
machine two variables point elsewhere (never set in CI):
  PAIRCTL_FAULTS_LAB_INVENTORY=PATH   a lab inventory of your own (its hosts are brought up here)
  PAIRCTL_FAULTS_PACKAGES="A B"       two package ids already in the home's store
and PAIRCTL_FAULTS_ONLY / PAIRCTL_FAULTS_STEPS (comma lists) run a part of the matrix.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.build.store import PackageStore
from tests.faults.harness import FaultPair, lab_for, make_pair, packages_for, teardown_pair


@pytest.fixture(scope="session")
def fault_pair(request, pairctl_home) -> FaultPair:
    if os.geteuid() != 0:
        pytest.skip("the fault matrix mounts tmpfs install roots: needs root")
    home, inv_path, inv = lab_for(request, pairctl_home)
    packages = packages_for(request, pairctl_home)
    store = PackageStore(home.store)
    size = max(sum(e.size for e in store.get(p).manifest.files.values()) for p in packages)
    root_mb = 3 * (size >> 20) + 48  # two releases + one upload in flight + run logs, route, leases
    fp = make_pair(home, inv_path, inv, packages, root_mb=root_mb)
    yield fp
    teardown_pair(fp)
