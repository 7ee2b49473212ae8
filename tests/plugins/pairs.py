"""Fixture `deployed_lab`: the baseline packages active and verified on the lab pair `lab`.

Idempotent and cheap when nothing changed: `pairctl status` first; only if the pair does not
run the baseline (as recorded and verified) is `pairctl deploy --skip-accept` run. Tests that
deploy something else must put the baseline back before they end (`restore_baseline`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PAIR = "lab"
PROFILE = "lab"


@dataclass(frozen=True)
class DeployedPair:
    pair: str
    base_url: str
    package_id: str  # the same cpu-lab package on both hosts in the lab
    native_package: str
    rpc_package: str
    profile: str
    home: Path
    inventory: Any  # resolved Inventory
    receipt: str | None = None  # deploy receipt (None when the pair was already active)
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def api_key(self) -> str | None:
        return None  # the lab pair has no api_key_file

    def roots(self) -> dict[str, str]:
        p = self.inventory.pair(self.pair)
        return {"native": self.inventory.host(p.native).install_root, "rpc": self.inventory.host(p.rpc).install_root}


def lab_status(cli, pair: str = PAIR, inventory: str | None = None) -> dict[str, Any]:
    r = cli("--json", "status", "--pair", pair, inventory=inventory)
    if r.exit_code not in (0, 1):
        raise RuntimeError(f"pairctl status --pair {pair} failed (exit {r.exit_code}): {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def three_judgements(deployed: dict[str, str], accept: Callable[..., dict[str, str]]) -> dict[str, list[str]]:
    """Each check of the whole suite judged three times, as verdicts by check name (issue 15's "no
    flaky verdict"): a deploy's own suite (`deployed`, its verdicts by check) is the first judgement
    of every check it judged, then two `accept` runs of the whole suite; a check the deploy only
    recorded answers for (`skipped`: answer_fixtures and reference_logprobs in a home with none for
    this key yet) is judged a third time by one more `accept` limited to those checks. `accept(*args)`
    runs `pairctl accept` on the pair with ARGS added, asserts it passed, and returns its verdicts."""
    full = [accept(), accept()]
    assert set(deployed) == set(full[0]) == set(full[1]), (deployed, full)
    recorded = [name for name, verdict in deployed.items() if verdict == "skipped"]
    third = accept(*(a for name in recorded for a in ("--checks", name))) if recorded else {}
    return {name: [third[name] if name in recorded else deployed[name], *(f[name] for f in full)] for name in full[0]}


def is_active(st: dict[str, Any], package_id: str) -> bool:
    route = st.get("route") or {}
    return (
        not st["problems"]
        and route.get("active_packages") == [package_id, package_id]
        and (route.get("active") or "").endswith(f"({PROFILE})")
        and st.get("health") == "ok"
        and all(h["running"] and h["matches_manifest"] for h in st["hosts"].values())
    )


def deploy_baseline(cli, package_id: str, pair: str = PAIR, inventory: str | None = None) -> str | None:
    """Make the baseline the active pair; returns the deploy receipt (None if it already was)."""
    st = lab_status(cli, pair, inventory)
    if is_active(st, package_id):
        return None
    r = cli(
        "--json",
        "deploy",
        "--pair",
        pair,
        "--packages",
        package_id,
        package_id,
        "--profile",
        PROFILE,
        "--skip-accept",
        inventory=inventory,
    )
    if r.exit_code != 0:
        raise RuntimeError(f"deploying the baseline failed (exit {r.exit_code}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)["receipt"]


@pytest.fixture
def deployed_lab(lab, lab_packages, cli) -> DeployedPair:
    """The lab pair running the baseline cpu-lab package (deployed if needed, verified)."""
    pid = lab_packages.id
    receipt = deploy_baseline(cli, pid)
    st = lab_status(cli)
    assert is_active(st, pid), f"baseline not active after deploy: {st}"
    from orchestrator.engine.plan import pair_view

    view = pair_view(lab.inventory, PAIR)
    return DeployedPair(
        pair=PAIR,
        base_url=view.base_url,
        package_id=pid,
        native_package=pid,
        rpc_package=pid,
        profile=PROFILE,
        home=lab.home.root,
        inventory=lab.inventory,
        receipt=receipt,
        status=st,
    )


def hooked_deploy(
    home: Path, package_id: str, hook: str, fault_dir: Path, *, pair: str = PAIR, inventory: str | None = None
) -> subprocess.Popen[str]:
    """`pairctl deploy --skip-accept` of `package_id` on both hosts, as a child process with the
    engine's test-only fault hook (`STEP:pause` waits at STEP, `STEP:kill` SIGKILLs itself there;
    orchestrator/faults.py). stdout is discarded, stderr kept for the assertion messages."""
    env = dict(
        os.environ,
        PAIRCTL_HOME=str(home),
        PAIRCTL_ENABLE_FAULT_HOOKS="1",
        PAIRCTL_FAULT_HOOK=hook,
        PAIRCTL_FAULT_DIR=str(fault_dir),
    )
    argv = [sys.executable, "-m", "orchestrator", "--home", str(home)]
    argv += [*(["--inventory", inventory] if inventory else []), "deploy", "--pair", pair]
    argv += ["--packages", package_id, package_id, "--skip-accept"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_paused(child: subprocess.Popen[str], fault_dir: Path, step: str, timeout_s: float = 120) -> None:
    """Until a `STEP:pause` child waits at its step (it exiting first fails, with its stderr)."""
    deadline = time.monotonic() + timeout_s
    while not (fault_dir / "paused").exists():
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        assert time.monotonic() < deadline, f"the deploy never reached the {step} step"
        time.sleep(0.05)


def wait_until(what: str, cond: Callable[[], Any], within_s: float, every_s: float = 0.1) -> float:
    """Seconds until `cond()` is true, looking every `every_s`; not within `within_s` fails, naming `what`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {within_s} s")


@contextmanager
def broken_binary(binary: Path, keep_dir: Path) -> Iterator[None]:
    """`binary` (a release's llama-server) replaced by one that exits 1 at once, by rename so a
    running process keeps its own inode; the original is copied to `keep_dir` and put back after."""
    kept = keep_dir / binary.name
    shutil.copy2(binary, kept)
    stub = binary.with_name(f".{binary.name}.broken")
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    stub.rename(binary)
    try:
        yield
    finally:
        shutil.copy2(kept, binary)


@pytest.fixture
def restore_baseline(lab, lab_packages, cli):
    """Use in tests that deploy something else: the baseline is active again afterwards."""
    yield
    deploy_baseline(cli, lab_packages.id)
