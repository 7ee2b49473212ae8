"""Issue 28: the lab's real model (SmolLM2-135M-Instruct) served by the pair pairctl built, in the
production shape (profile lab-real: two slots, Q8 KV, flash attention, all layers over RPC,
a draft accepted often and rejected sometimes), judged by the same acceptance suite.

What these prove on real components (lab sshd hosts, the baseline package, the real model):
- deploy with the full acceptance suite passes on a healthy pair, and every check gives the same
  verdict in three independent runs (the deploy's suite where it judged, then `accept` runs): no
  flaky judgement on a real model's distributions;
- every request bound comes from the speed measured on this pair (the receipt records the
  probe's figures and the derived bounds), not from constants tuned to the toy model;
- a SIGSTOPped llama-server fails with "stopped making progress" within two minutes;
- a profile whose floor the pair cannot reach fails with "slower than the profile's floor";
- an OpenAI client gets a real answer, under the model name the profile declares (`--alias`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.evidence.store import EvidenceStore
from tests.plugins.pairs import PAIR, lab_status, three_judgements

pytestmark = [pytest.mark.e2e, pytest.mark.real_model]

REAL_PROFILE = "lab-real"
ALIAS = "smollm2-135m-instruct"


def _active_profile(st: dict) -> str:
    return ((st.get("route") or {}).get("active") or "").rsplit("(", 1)[-1].rstrip(")")


@pytest.fixture(scope="module")
def real_deploy(lab, lab_packages, pairctl_home):
    """The baseline deployed on the real-model profile with the whole acceptance suite (once per
    module); the tiny-model baseline is put back at the end for the other modules."""
    from tests.plugins.cli import run_cli

    def cli(*args: str, inventory: str | None = None):
        return run_cli(["--home", str(pairctl_home), *(["--inventory", inventory] if inventory else []), *args])

    pid = lab_packages.id
    # the baseline is the route's reference: it records the real model's reference answers
    ref = cli("--json", "reference", "set", "--pair", PAIR, "--package", pid, "--reason", "e2e: real model baseline")
    assert ref.exit_code == 0, ref.output[-2000:]
    t0 = time.monotonic()
    r = cli("--json", "deploy", "--pair", PAIR, "--native", pid, "--rpc", pid, "--profile", REAL_PROFILE)
    took = time.monotonic() - t0
    yield r, took, cli, lab
    from tests.plugins.pairs import deploy_baseline

    deploy_baseline(cli, pid)


def test_real_model_deploy_with_full_acceptance_passes(real_deploy, pairctl_home):
    r, took, cli, _lab = real_deploy
    assert r.exit_code == 0, r.output[-4000:]
    out = json.loads(r.stdout)
    rec = EvidenceStore(Path(pairctl_home) / "evidence").load(out["receipt"])
    acc = rec.extra_fields()["acceptance"]
    assert acc["passed"], acc
    verdicts = {c["name"]: c["verdict"] for c in acc["checks"]}
    required_failed = [c for c in acc["checks"] if c["required"] and c["verdict"] != "passed"]
    assert not required_failed, verdicts
    # the bounds came from this pair's measured speed, and say so
    rb = acc["request_budget"]
    assert rb["speeds"]["source"].startswith("measured by a cold probe"), rb
    assert rb["speeds"]["prompt_per_s"] > 0 and rb["speeds"]["generated_per_s"] > 0
    assert rb["completion_s"] > 0 and rb["stall_s"] >= 30
    st = lab_status(cli)
    assert _active_profile(st) == REAL_PROFILE, st.get("route")
    print(f"real-model deploy with acceptance: {took:.1f} s; budget {rb}")


def test_real_model_three_accepts_pass_with_identical_verdicts(real_deploy, pairctl_home):
    """Every check judged three times on the real model with the same verdict: the deploy's own
    suite, then two `accept` runs of the whole suite, and for the two checks the deploy only
    recorded answers for (answer_fixtures, reference_logprobs) a third `accept` limited to them
    (tests/plugins/pairs.py three_judgements)."""
    r, _took, cli, lab_env = real_deploy
    assert r.exit_code == 0, r.output[-3000:]
    rec = EvidenceStore(Path(pairctl_home) / "evidence").load(json.loads(r.stdout)["receipt"])
    deployed = {c["name"]: c["verdict"] for c in rec.extra_fields()["acceptance"]["checks"]}
    took = []

    def accept(*extra: str) -> dict[str, str]:
        t0 = time.monotonic()
        a = cli("--json", "accept", "--pair", PAIR, *extra)
        assert a.exit_code == 0, a.output[-4000:]
        took.append((" ".join(extra) or "whole suite", round(time.monotonic() - t0, 1)))
        return {c["name"]: c["verdict"] for c in json.loads(a.stdout)["checks"]}

    judged = three_judgements(deployed, accept)
    assert all(len(set(v)) == 1 for v in judged.values()), judged
    # the answer fixtures are judged on content: a fact, a sum and a JSON reply
    assert judged["answer_fixtures"] == ["passed"] * 3, judged
    print("real-model accept durations:", took)


def test_openai_client_gets_a_real_answer_under_the_declared_name(real_deploy):
    openai = pytest.importorskip("openai")
    r, _took, cli, lab_env = real_deploy
    assert r.exit_code == 0, r.output[-3000:]
    st = lab_status(cli)
    from orchestrator.engine.plan import pair_view

    base = pair_view(lab_env.inventory, PAIR).base_url  # the lab's own (an xdist worker's: its addresses)
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0)
    models = [m.id for m in client.models.list().data]
    assert models == [ALIAS], models  # the profile's alias, not a host path
    resp = client.chat.completions.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}],
        max_tokens=24,
        temperature=0,
    )
    answer = resp.choices[0].message.content or ""
    assert "Paris" in answer, answer
    assert st["health"] == "ok"


def test_a_stopped_server_fails_with_no_progress_within_two_minutes(real_deploy):
    """SIGSTOP llama-server while acceptance runs its near-full lanes: the request stops making
    progress in /slots, and the check fails naming that (not a 30-minute timeout, not
    "unreachable" on a slow server)."""
    r, _took, cli, lab_env = real_deploy
    assert r.exit_code == 0, r.output[-3000:]
    inv = lab_env.inventory
    root = Path(inv.host(inv.pair(PAIR).native).install_root)
    pid = int((root / "run" / "llama-server.pid").read_text().split()[0])
    import threading

    def stop_later() -> None:
        time.sleep(8)  # past the speed probe, inside the first near-full check
        os.kill(pid, signal.SIGSTOP)

    t = threading.Thread(target=stop_later, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        a = cli("--json", "accept", "--pair", PAIR, "--checks", "two_lane_near_full")
        took = time.monotonic() - t0
    finally:
        t.join()
        os.kill(pid, signal.SIGCONT)
    assert a.exit_code != 0, a.output[-3000:]
    doc = json.loads(a.stdout)
    msg = json.dumps(doc)
    assert "stopped making progress" in msg, msg[-3000:]
    assert took < 8 + 150, took  # the stall bound (>= 30 s) plus the poll, well under the old hour
    print(f"SIGSTOP seen as a stall after {took:.1f} s")


def test_a_floor_the_pair_cannot_reach_fails_as_too_slow(real_deploy, tmp_path):
    """An operator's profile declaring a floor this pair cannot reach: acceptance fails at the
    speed probe with both figures, and says 'slower than the profile's floor', not 'unreachable'."""
    r, _took, cli, lab_env = real_deploy
    assert r.exit_code == 0, r.output[-3000:]
    from orchestrator.paths import MANIFESTS

    prof = yaml.safe_load((MANIFESTS / "profiles" / f"{REAL_PROFILE}.yaml").read_text())
    prof["speed"] = {"min_prompt_tokens_per_s": 1_000_000, "min_generated_tokens_per_s": 1}
    cfg = tmp_path / "pairctl"
    (cfg / "profiles").mkdir(parents=True)
    (cfg / "profiles" / f"{REAL_PROFILE}.yaml").write_text(yaml.safe_dump(prof))
    os.chmod(tmp_path, 0o755)
    a = cli("--json", "--config", str(cfg), "accept", "--pair", PAIR, "--checks", "one_lane_near_full",
            "--profile", REAL_PROFILE)  # fmt: skip
    assert a.exit_code == 1, a.output[-3000:]
    msg = json.dumps(json.loads(a.stdout))
    assert "slower than the profile's floor" in msg and "floor 1000000 tok/s" in msg, msg[-2000:]
    assert "unreachable" not in msg.lower()
