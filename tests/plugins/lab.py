"""Session fixtures for the lab: `lab` (manifests/inventories/lab.yaml), `lab3` (lab3.yaml) and
`lab_faults` (labfaults.yaml, the fault matrix's extra shards).

Each runs the real `Lab.up` once per session in the shared `pairctl_home` and yields a
`LabEnv`. `up` is idempotent, so a lab left running by an aborted session is reused. At session
end only the hosts this session started are stopped (services under their roots, then sshd):
another test session sharing the home keeps the hosts it relies on. Set PAIRCTL_LAB_KEEP=1 to
leave everything running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.config.inventory import Inventory, load_inventory
from orchestrator.lab.lab import Lab, LabStatus, down_all
from orchestrator.paths import Home
from tests.plugins.tiers import refuse_in_check
from tests.plugins.workers import prepare_shared, worker_index, worker_inventory


@dataclass(frozen=True)
class LabEnv:
    home: Home
    inventory: Inventory  # resolved: ${PAIRCTL_HOME} expanded
    inventory_path: Path
    models: dict[str, Path]  # role (target, draft_same, draft_other) -> GGUF path
    status: LabStatus  # as `lab up` left it

    @property
    def known_hosts(self) -> Path:
        return self.home.lab / "known_hosts"

    @property
    def operator_key(self) -> Path:
        return self.home.lab / "keys" / "operator"

    def pids(self) -> dict[str, int]:
        return {h.name: h.pid for h in self.status.hosts if h.pid is not None}


def lab_inventory_file(name: str = "lab") -> Path:
    """The inventory file of lab NAME as this test session brings it up; tests that edit a copy read it here.

    A developer's second lab on other addresses (same pair names), so two test runs need not share
    one pair: PAIRCTL_TEST_LAB_INVENTORY=FILE with PAIRCTL_INVENTORY=FILE and its own home; an
    xdist worker sets both to its own copy (tests/plugins/workers.py)."""
    override = os.environ.get("PAIRCTL_TEST_LAB_INVENTORY") if name == "lab" else None
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parents[2] / "manifests" / "inventories" / f"{name}.yaml"


def _lab_up(home_root: Path, name: str, *, source: bool):
    refuse_in_check(f"the {name} lab's sshd hosts")
    home = Home.resolve(home_root)
    path = lab_inventory_file(name)
    if worker_index() is not None:  # an xdist worker's own addresses (tests/plugins/workers.py)
        path = worker_inventory(name)
        prepare_shared(source=source)
    inv = load_inventory(str(path), {"PAIRCTL_HOME": str(home.root)})
    _clear_immutable(home.root / "lab" / "hosts")
    lab = Lab(home, inv)
    status = lab.up(source=source)
    env = LabEnv(home=home, inventory=inv, inventory_path=path, models=lab.model_paths(), status=status)
    started = {h.name for h in status.hosts if h.started}
    return env, started


def _clear_immutable(hosts: Path) -> None:
    """test_deploy's state-dir test sets chattr +i on the lab hosts' folders and clears it in its
    own `finally`, which a killed run never reaches; left set, every later deploy there is refused
    (ROOT.state cannot be made) and `lab down` or `rm -rf .state` fail with EPERM."""
    if hosts.is_dir() and shutil.which("chattr"):
        dirs = [str(d) for d in hosts.iterdir() if d.is_dir() and not d.is_symlink()]
        if dirs:
            subprocess.run(["chattr", "-i", *dirs], capture_output=True, check=False)


def _teardown(env: LabEnv, started: set[str]) -> None:
    if started and not os.environ.get("PAIRCTL_LAB_KEEP"):
        down_all(env.home, only=started)


def _want_source() -> bool:
    """The pinned source is slow to prepare the first time; tests that only need hosts may skip it."""
    return os.environ.get("PAIRCTL_LAB_SOURCE", "1") != "0"


def drop_boot_lines(*homes: Path) -> str:
    """The @reboot and watchdog lines of every install root under these folders out of this
    user's crontab (hosts/boot.py). The lab hosts are this machine's user, so every pair, key
    or jitter fixture's deploy wrote into one crontab that other sessions (other labs, other
    worktrees) share: only roots under this session's own homes are touched."""
    from orchestrator.hosts import boot
    from orchestrator.remote.local import LocalTransport

    t = LocalTransport("test-session")
    return "; ".join(boot.remove_entries_under(t, str(h.resolve())) for h in homes)


@pytest.fixture(scope="session", autouse=True)
def _boot_lines_removed(tmp_path_factory: pytest.TempPathFactory):
    """A test session leaves no boot line for a root it made: under the test home (lab hosts,
    pairs) or pytest's temporary folders. `lab down` removes only its own lab's lines, and each
    session left ~30 behind, their watchdogs run by cron every minute."""
    yield
    home = os.environ.get("PAIRCTL_TEST_HOME")  # as conftest's pairctl_home, read at the end (workers set it)
    drop_boot_lines(
        Path(home) if home else Path(__file__).resolve().parents[2] / ".state" / "test", tmp_path_factory.getbasetemp()
    )


@pytest.fixture(scope="session")
def lab(pairctl_home: Path):
    """The two-host lab (lab-native 127.0.0.2, lab-rpc 127.0.0.3, port 2222; a worker's own under xdist)."""
    env, started = _lab_up(pairctl_home, "lab", source=_want_source())
    yield env
    _teardown(env, started)


@pytest.fixture(scope="session")
def lab_faults(pairctl_home: Path):
    """Three more pairs on six hosts (127.0.0.18-23, port 2222): with lab3's, the fault matrix's shards."""
    env, started = _lab_up(pairctl_home, "labfaults", source=_want_source())
    yield env
    _teardown(env, started)


@pytest.fixture(scope="session")
def lab3(pairctl_home: Path):
    """Three lab pairs on six hosts (127.0.0.12-17, port 2222), up for the session."""
    env, started = _lab_up(pairctl_home, "lab3", source=_want_source())
    yield env
    _teardown(env, started)
