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
- the test home's package store, build cache and pinned source, shared through symlinks: a
  package is built once by whichever worker asks first (pairctl's build and store locks are file
  locks in those shared folders), and the source and models are prepared once under
  `prepare_shared`'s lock before any worker's lab starts; the models are hard-linked into a folder
  of the worker's own (`_link_models`), so a test that swaps a model file swaps only its own.
Without xdist nothing changes. tests/integration/test_workers.py runs two workers on purpose and
checks that they share none of these but the package store.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.filelock import file_lock
from orchestrator.paths import MANIFESTS, Home

NET_ENV = "PAIRCTL_TEST_WORKER_NET"
OFFSET_ENV = "PAIRCTL_TEST_WORKER_OFFSET"  # first block (a nested run keeps clear of its parent's workers)
BASE_ENV = "PAIRCTL_TEST_WORKER_BASE"  # the test home the workers share their store with
BLOCK = 32  # addresses per worker: the bundled lab inventories use 127.0.0.2-21
SHARED = ("packages", "build-cache", "lab/source", "lab/sdist")  # lab/models: linked file by file (_link_models)
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
    inv = yaml.safe_load((MANIFESTS / "inventories" / f"{name}.yaml").read_text())
    for host in inv["hosts"].values():
        host["address"] = worker_address(host["address"], index)
    text = yaml.safe_dump(inv, sort_keys=False)
    if not out.is_file() or out.read_text() != text:  # a bundled inventory edited since the last run
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return out


def prepare_shared(*, source: bool) -> None:
    """The shared models (and pinned source) made once in the base home, whichever worker comes first."""
    base = os.environ.get(BASE_ENV)
    if worker_index() is None or not base:
        return
    from orchestrator.lab.source import ensure_source

    home = Home.resolve(base)
    with file_lock(home.lab / ".workers.lock"):
        _made_models(home.lab / "models")
        if source:
            ensure_source(home)
        _link_models(home.lab / "models", Home.resolve(os.environ["PAIRCTL_TEST_HOME"]).lab / "models")


def _made_models(folder: Path) -> None:
    """The lab's generated models and the real model (with its draft and F16 form) in FOLDER:
    each written once, checked on every call."""
    from orchestrator.lab.models import ensure_lab_models
    from orchestrator.lab.real_model import ensure_real_model

    ensure_lab_models(folder)
    ensure_real_model(folder)


def _link_models(shared: Path, own: Path) -> None:
    """The worker's lab/models: a folder of its own whose files are hard links to the shared ones.
    A test may swap a model file for a changed one and put it back (test_deploy's model-hash test
    renames target.gguf aside and writes another in its place): in its own folder that swaps
    only its worker's name, never the file the other worker's running pair was deployed with.
    Linked afresh each session, so a model remade in the shared folder is the one linked."""
    if own.is_symlink():  # a run before models were per worker
        own.unlink()
    own.mkdir(parents=True, exist_ok=True)
    for src in shared.iterdir():
        dest = own / src.name
        if src.is_dir():
            if not dest.is_symlink():
                dest.symlink_to(src)
            continue
        if dest.exists() and os.path.samefile(src, dest):
            continue
        dest.unlink(missing_ok=True)
        os.link(src, dest)


def link_session_models(home_root: Path, session_home: Path) -> None:
    """A throwaway home's lab/models as hard links to this session's, so its `lab up` finds the
    models intact instead of writing them: the real model's draft and F16 form alone take ~18
    CPU-s and ~35 s on the 2-core machine (gguf's reader and dequantizer in Python), paid again by
    every `lab up` in a new home. The session's folder (SESSION_HOME's, conftest's pairctl_home) is
    made here if no lab has made it yet: under xdist linked from the shared one (`prepare_shared`),
    so a worker never writes models of its own."""
    prepare_shared(source=False)
    own = Home.resolve(session_home).lab / "models"
    with file_lock(own.parent / ".models.lock"):
        _made_models(own)
    _link_models(own, Home.resolve(home_root).lab / "models")


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
    config.pluginmanager.register(_GroupSuffix(), "pairctl-xdist-group-suffix")
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False  # the controller's scheduler: longest group first instead
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


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which names each item's group from these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Lab tests in one xdist group per module (`--dist loadgroup`); an explicit group wins.

    Under xdist the groups are handed out longest first, by the wall seconds a recorded run gave
    them (`recorded_walls`): a worker that picks the fault matrix or the real model last would
    run it alone at the end while the other idles. xdist's own order (most tests first, its
    `--loadscope-reorder`) is turned off for that; every worker sorts the same file the same way,
    so their collections stay equal, as xdist requires."""
    groups: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        if module.split("/")[:2] in ([["tests", d] for d in LAB_DIRS]) and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(module))
        groups[item.nodeid] = group_of(item)
    if worker_index() is None or not getattr(config.option, "loadgroup", False):  # a worker's own dist is "no"
        return
    walls = recorded_walls()
    weight: dict[str, float] = {}
    for item in items:
        key = groups[item.nodeid] or item.nodeid
        weight[key] = weight.get(key, 0.0) + walls.get(without_group(item.nodeid), 0.0)
    items.sort(key=lambda item: -weight[groups[item.nodeid] or item.nodeid])  # stable: ties keep their order


class _GroupSuffix:
    """xdist's loadgroup sends a worker's items to the controller as `NODEID@GROUP`, written by its
    own collection hook into `item._nodeid`; pytest 9 derives `nodeid` from `item._id` instead,
    so the suffix never reaches the scheduler and every lab module's tests were spread over both
    workers (a module fixture deployed twice, a module's tests on two labs). Run after xdist's hook:
    the suffix set where it is missing, as xdist means it (its group names sorted, joined by `_`)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not getattr(config.option, "loadgroup", False):
            return
        for item in items:
            group = group_of(item)
            if group and not item.nodeid.endswith("@" + group):  # (a pytest before 9 has it)
                from _pytest.nodeid import NodeId  # pytest 9's: imported only where the suffix is missing

                item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


def group_of(item: pytest.Item) -> str:
    """The item's xdist group as xdist names it (its xdist_group names sorted, joined by `_`); ""
    for none."""
    marks = item.iter_markers("xdist_group")
    return "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}))


def without_group(nodeid: str) -> str:
    """A test id as it reads outside loadgroup: its `@GROUP` suffix (no `]` in it) dropped."""
    return re.sub(r"@[^\]@]*$", "", nodeid) if "::" in nodeid else nodeid


def recorded_walls() -> dict[str, float]:
    """Each test's wall seconds: the newest clean-clone run kept in docs/results, overlaid by the
    last run this machine recorded (PAIRCTL_TEST_RECORD's durations.json, which may have run only a
    few tests); empty if none reads (then the collection's own order)."""
    kept = [_run(p) for p in Path(__file__).resolve().parents[2].glob("docs/results/durations-*.json")]
    record = os.environ.get("PAIRCTL_TEST_RECORD")
    runs = [max(kept, key=lambda run: str(run.get("ended_at", "")), default={})]
    runs += [_run(Path(record) / "durations.json")] if record else []
    walls: dict[str, float] = {}
    for run in runs:
        try:
            walls |= {without_group(nodeid): float(row["wall_s"]) for nodeid, row in run.get("tests", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return walls


def _run(path: Path) -> dict[str, Any]:
    """A durations file's content, or {} where it does not read as a JSON object."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return run if isinstance(run, dict) else {}
