"""Issue 42's busy-host case: an operator's profile at 4x lab-real's context (ctx 4096, 2 slots,
batch 1024, ubatch 256, q8_0 KV, flash attention, self-draft, the real model), written as an
operator would. One 1,024-token batch of two near-full lanes takes minutes on the loaded 2-core
lab, where the cold speed probe ran seconds; a healthy pair must still deploy with the whole suite
and be accepted twice, while a SIGSTOPped llama-server or ggml-rpc-server still fails within 3
minutes (the bounds scale with the work; the CPU-time liveness reading catches a stopped service).

The whole-suite deploy and its two accepts take tens of minutes on 2 cores (over an hour on a busy
machine), more than CI's 90 minutes leave, and the SIGSTOP cases stop a service 45 s into a check
whose length depends on the machine's load: the module runs with `make test-long-ctx`
(PAIRCTL_TEST_LONG_CTX=1), on a busy machine as the issue asks. `make test` keeps the real model's
own SIGSTOP case at lab-real's context (tests/e2e/test_real_model.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.evidence.store import EvidenceStore
from orchestrator.paths import MANIFESTS
from tests.plugins.pairs import PAIR

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.real_model,
    pytest.mark.skipif(
        os.environ.get("PAIRCTL_TEST_LONG_CTX") != "1",
        reason="4x context: make test-long-ctx (PAIRCTL_TEST_LONG_CTX=1)",
    ),  # fmt: skip
]

LONG = "lab-real-ctx4096"
STOPPED_WITHIN_S = 180.0


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@pytest.fixture(scope="module")
def long_cli(lab, lab_packages, pairctl_home, tmp_path_factory):
    """The CLI with the 4x-context profile in its config; the tiny-model baseline put back at the end."""
    from tests.plugins.cli import run_cli
    from tests.plugins.pairs import deploy_baseline

    cfg = tmp_path_factory.mktemp("long-ctx") / "pairctl"
    (cfg / "profiles").mkdir(parents=True)
    prof = yaml.safe_load((MANIFESTS / "profiles" / "lab-real.yaml").read_text())
    prof.update(name=LONG, description="lab-real at 4x context (an operator's profile)", ctx_size=4096,
                batch_size=1024, ubatch_size=256)  # fmt: skip
    prof["draft"].update(model=prof["model"], expect=["accepted"])  # self-draft: nothing to reject
    (cfg / "profiles" / f"{LONG}.yaml").write_text(yaml.safe_dump(prof))
    os.chmod(cfg.parent, 0o755)

    def cli(*args: str, inventory: str | None = None):
        inv = ["--inventory", inventory] if inventory else []
        return run_cli(["--home", str(pairctl_home), "--config", str(cfg), *inv, *args])

    yield cli, lab, lab_packages.id
    deploy_baseline(cli, lab_packages.id)


def _deploy(cli, pid: str, *extra: str):
    load0, t0 = _load(), time.monotonic()
    r = cli("--json", "deploy", "--pair", PAIR, "--native", pid, "--rpc", pid, "--profile", LONG, *extra)
    print(f"4x-context deploy {extra}: exit {r.exit_code}, {time.monotonic() - t0:.1f} s, load {load0} -> {_load()}")
    return r


@pytest.fixture(scope="module")
def long_deploy(long_cli):
    """The baseline deployed on the 4x-context profile with the whole acceptance suite."""
    cli, lab, pid = long_cli
    ref = cli("--json", "reference", "set", "--pair", PAIR, "--package", pid, "--reason", "e2e: 4x context")
    assert ref.exit_code == 0, ref.output[-2000:]
    return _deploy(cli, pid), cli, lab


@pytest.fixture(scope="module")
def long_pair(long_cli):
    """The 4x-context pair running (deployed without the suite when the whole-suite deploy did not
    run in this session): what the SIGSTOP cases stop."""
    cli, lab, pid = long_cli
    return _deploy(cli, pid, "--skip-accept"), cli, lab


def test_long_context_deploy_with_whole_suite_passes(long_deploy, pairctl_home):
    r, cli, _lab = long_deploy
    assert r.exit_code == 0, r.output[-4000:]
    rec = EvidenceStore(Path(pairctl_home) / "evidence").load(json.loads(r.stdout)["receipt"])
    acc = rec.extra_fields()["acceptance"]
    assert acc["passed"], acc
    print("budget:", json.dumps(acc["request_budget"]))


@pytest.mark.parametrize("role,service", [("native", "llama-server"), ("rpc", "ggml-rpc-server")])
def test_a_stopped_service_fails_within_three_minutes_at_long_context(long_pair, role, service):
    """SIGSTOP one service while the near-full lanes run: the check fails naming a stall, within 3
    minutes, though this profile's honest batch takes minutes."""
    r, cli, lab_env = long_pair
    assert r.exit_code == 0, r.output[-3000:]
    inv = lab_env.inventory
    p = inv.pair(PAIR)
    root = Path(inv.host(p.native if role == "native" else p.rpc).install_root)
    pid = int((root / "run" / f"{service}.pid").read_text().split()[0])
    stopped: list[float] = []

    def stop_later() -> None:
        time.sleep(45)  # past the speed probe, inside the near-full lanes
        os.kill(pid, signal.SIGSTOP)
        stopped.append(time.monotonic())

    t = threading.Thread(target=stop_later, daemon=True)
    t.start()
    load0 = _load()
    try:
        a = cli("--json", "accept", "--pair", PAIR, "--checks", "two_lane_near_full")
        end = time.monotonic()
    finally:
        t.join()
        os.kill(pid, signal.SIGCONT)
    assert stopped, "the accept ended before the service was stopped"
    took = end - stopped[0]
    print(f"SIGSTOP {service}: failed {took:.1f} s after the stop, load {load0} -> {_load()}")
    assert a.exit_code != 0, a.output[-3000:]
    msg = json.dumps(json.loads(a.stdout))
    assert "stopped making progress" in msg, msg[-3000:]
    assert took < STOPPED_WITHIN_S, took


def test_long_context_two_accepts_pass(long_deploy):
    r, cli, _lab = long_deploy
    assert r.exit_code == 0, r.output[-3000:]
    for i in range(2):
        load0, t0 = _load(), time.monotonic()
        a = cli("--json", "accept", "--pair", PAIR)
        print(f"accept {i + 1}: exit {a.exit_code}, {time.monotonic() - t0:.1f} s, load {load0} -> {_load()}")
        assert a.exit_code == 0, a.output[-4000:]
