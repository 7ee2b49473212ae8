"""One lab per pytest-xdist worker (`pytest -n N`): addresses and state folder from the worker id.

Under xdist each worker (PYTEST_XDIST_WORKER=gwK) gets
- its own pairctl home, `<test home>/workers/gwK`, so leases, evidence, logs, route keys, sshd
  host folders and install roots are never shared;
- its own copies of the bundled lab inventories (lab, lab3, labfaults) with every host address
  127.0.0.J moved to `<net>.(32*K + J)` (net: PAIRCTL_TEST_WORKER_NET, default 127.0.4; K plus
  PAIRCTL_TEST_WORKER_OFFSET when set), so two
  workers' sshd hosts, llama-servers and rpc-servers never bind the same address and port;
  PAIRCTL_TEST_LAB_INVENTORY and PAIRCTL_INVENTORY name the worker's `lab` copy, as they would a
  developer's second lab;
- the test home's package store, build cache, pinned source and models, shared through symlinks:
  a package is built once by whichever worker asks first (pairctl's build and store locks are
  file locks in those shared folders), and the source and models are prepared once under
  `prepare_shared`'s lock before any worker's lab starts.
Without xdist nothing changes. tests/integration/test_workers.py runs two workers on purpose and
checks that they share none of these but the package store.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from orchestrator.filelock import file_lock
from orchestrator.paths import MANIFESTS, Home

NET_ENV = "PAIRCTL_TEST_WORKER_NET"
OFFSET_ENV = "PAIRCTL_TEST_WORKER_OFFSET"  # first block (a nested run keeps clear of its parent's workers)
BASE_ENV = "PAIRCTL_TEST_WORKER_BASE"  # the test home the workers share their store with
BLOCK = 32  # addresses per worker: the bundled lab inventories use 127.0.0.2-21
SHARED = ("packages", "build-cache", "lab/source", "lab/sdist", "lab/models")
# Lab tests are grouped by module (their module-scoped deploys stay on one worker); unit tests spread.
LAB_DIRS = ("e2e", "integration", "faults", "mutants", "install", "numerics")


def worker_index() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return int(worker.removeprefix("gw")) + int(os.environ.get(OFFSET_ENV, "0")) if worker else None


def worker_address(address: str, index: int) -> str:
    """A bundled inventory's 127.0.0.J as worker INDEX's address (one block of 32 per worker)."""
    last = int(address.rsplit(".", 1)[1])
    if not address.startswith("127.0.0.") or last >= BLOCK or index >= 256 // BLOCK:
        raise ValueError(f"no worker address for {address} on worker gw{index} (at most {256 // BLOCK} workers)")
    return f"{os.environ.get(NET_ENV, '127.0.4')}.{BLOCK * index + last}"


def spare_addresses() -> tuple[str, str]:
    """Two addresses no lab inventory uses, for a test's throwaway lab: the worker's own under xdist."""
    index = worker_index()
    if index is None:
        return "127.0.0.40", "127.0.0.41"
    return worker_address("127.0.0.30", index), worker_address("127.0.0.31", index)


def worker_inventory(name: str) -> Path:
    """The bundled inventory NAME as this worker's copy (written once per worker session)."""
    index = worker_index()
    assert index is not None, "only under xdist"
    out = Home.resolve(os.environ["PAIRCTL_TEST_HOME"]).root / "inventories" / f"{name}.yaml"
    if not out.is_file():
        inv = yaml.safe_load((MANIFESTS / "inventories" / f"{name}.yaml").read_text())
        for host in inv["hosts"].values():
            host["address"] = worker_address(host["address"], index)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(inv, sort_keys=False))
    return out


def prepare_shared(*, source: bool) -> None:
    """The shared models (and pinned source) made once in the base home, whichever worker comes first."""
    base = os.environ.get(BASE_ENV)
    if worker_index() is None or not base:
        return
    from orchestrator.lab.models import ensure_lab_models
    from orchestrator.lab.real_model import ensure_real_model
    from orchestrator.lab.source import ensure_source

    home = Home.resolve(base)
    with file_lock(home.lab / ".workers.lock"):
        ensure_lab_models(home.lab / "models")
        ensure_real_model(home.lab / "models")
        if source:
            ensure_source(home)


def _worker_home(base: Path, index: int) -> Path:
    home = base / "workers" / f"gw{index}"
    for rel in SHARED:
        link, target = home / rel, base / rel
        target.mkdir(parents=True, exist_ok=True) if rel != "lab/source" else target.parent.mkdir(exist_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(target)
    return home


def pytest_configure(config: pytest.Config) -> None:
    index = worker_index()
    if index is None:
        return
    env = os.environ.get("PAIRCTL_TEST_HOME")
    base = Path(env).resolve() if env else Path(__file__).resolve().parents[2] / ".state" / "test"
    os.environ[BASE_ENV] = str(base)
    os.environ["PAIRCTL_TEST_HOME"] = str(_worker_home(base, index))
    inv = str(worker_inventory("lab"))
    os.environ["PAIRCTL_TEST_LAB_INVENTORY"] = inv
    os.environ["PAIRCTL_INVENTORY"] = inv


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Lab tests in one xdist group per module (`--dist loadgroup`); an explicit group wins."""
    for item in items:
        module = item.nodeid.split("::")[0]
        if module.split("/")[:2] in ([["tests", d] for d in LAB_DIRS]) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(module))
