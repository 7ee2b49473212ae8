"""`pairctl accept` end to end against the lab pair deployed by `pairctl deploy` (real
llama-server + ggml-rpc-server built by `pairctl build`), and, for every check, the same check
run with its condition broken on purpose, seen to fail.

Breaking needs no mock: a profile that asks more of a slot than the deployed server has, a
lane prompt that carries the other lane's nonce, a drafted request whose output changes
(temperature > 0 makes drafting sample), a continuation sent without the cache, a stream left
open instead of closed, a server restarted in the middle of the suite, a different served
model for answer fixtures (a real redeploy, restored afterwards), and a sampler timeout.

The pair under test is `lab` (the `deployed_lab` pair) unless PAIRCTL_ACCEPT_E2E_INVENTORY /
PAIRCTL_ACCEPT_E2E_PAIR name another lab pair (e.g. lab3 / lab2), so these tests, which
redeploy and lease their pair, can run beside other sessions' tests on `lab`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.checks import cached_continuation, cancellation, long_prefix, near_full, speculative
from orchestrator.checks.base import CheckOptions
from orchestrator.checks.live import open_live
from orchestrator.checks.suite import run_suite
from orchestrator.evidence.store import EvidenceStore
from orchestrator.paths import MANIFESTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

INV = os.environ.get("PAIRCTL_ACCEPT_E2E_INVENTORY", "lab")
PAIR = os.environ.get("PAIRCTL_ACCEPT_E2E_PAIR", "lab")
INV_ARG = None if INV == "lab" else INV


@dataclass(frozen=True)
class PairUnderTest:
    package_id: str
    home: Path
    inventory: Any
    env: Any  # the LabEnv


@pytest.fixture
def deployed_lab(request, lab_packages, cli) -> PairUnderTest:
    """The baseline package active and verified on the pair under test (lab profile)."""
    from tests.plugins.pairs import deploy_baseline, is_active, lab_status

    env = request.getfixturevalue("lab" if INV == "lab" else "lab3")
    deploy_baseline(cli, lab_packages.id, PAIR, INV_ARG)
    assert is_active(lab_status(cli, PAIR, INV_ARG), lab_packages.id)
    return PairUnderTest(lab_packages.id, env.home.root, env.inventory, env)


@pytest.fixture
def restore_baseline(lab_packages, cli):
    """For tests that deploy something else: the baseline is active again afterwards."""
    from tests.plugins.pairs import deploy_baseline

    yield
    deploy_baseline(cli, lab_packages.id, PAIR, INV_ARG)


def run_cli(cli, *args: str):
    return cli(*args, inventory=INV_ARG)


def _accept(cli, *extra: str):
    r = run_cli(cli, "--json", "accept", "--pair", PAIR, *extra)
    data = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r, data


def _verdicts(data):
    return {c["name"]: c["verdict"] for c in data["checks"]}


_FIRST: dict[str, object] = {}


@pytest.fixture
def first_accept(deployed_lab):
    """The first acceptance of the deployed lab pair in this module (its answers become the
    baseline the later runs are judged against); run once, shared by the tests that need it."""
    from orchestrator.checks.runner import AcceptRequest, accept_pair

    if "out" not in _FIRST:
        _FIRST["out"] = accept_pair(deployed_lab.env.home, deployed_lab.inventory, AcceptRequest(pair=PAIR))
    return _FIRST["out"]


@pytest.fixture
def live(deployed_lab):
    """A CheckContext on the live lab pair, without a journal (break tests write no receipt)."""
    home = deployed_lab.env.home
    lv = open_live(home, deployed_lab.inventory, PAIR, evidence=EvidenceStore(home.evidence))
    yield lv
    lv.close()


# --- the whole suite through the CLI ---------------------------------------------------------


def test_accept_passes_every_required_check_and_writes_one_receipt(first_accept, cli, deployed_lab):
    r, data = _accept(cli)
    assert r.exit_code == 0, r.output
    v = _verdicts(data)
    for name in (
        "identity",
        "two_lane_near_full",
        "one_lane_near_full",
        "speculative",
        "cached_continuation",
        "cancellation",
        "long_prefix_cache",
        "answer_fixtures",
        "reference_logprobs",
        "rpc_consistency",
        "exactly_full",
        "sampling",
    ):
        assert v[name] == "passed", (name, data)
    assert v["telemetry"] in ("passed", "error")
    receipt = EvidenceStore(deployed_lab.env.home.evidence).load(data["receipt"])
    assert receipt.command == "accept" and receipt.outcome == "passed"
    steps = {s.name: s for s in receipt.steps}
    for name in v:
        assert steps[f"check:{name}"].data["raw"] is not None
    # sizes came from the profile: 2 lanes of 2048-64 tokens on the lab's 2 x 2048 slots
    two = next(c for c in data["checks"] if c["name"] == "two_lane_near_full")
    assert two["figures"]["population"] == 2 * (2048 - 64) and two["figures"]["capacity"] == 4096
    # the second run judged fixtures against the first run's answers
    af = receipt.step("check:answer_fixtures").data
    assert af["raw"]["baseline_receipt"] == first_accept.receipt
    # issue 21: the lease lasts as long as this suite may on the lab profile, renewed by a heartbeat
    from orchestrator.checks.runner import heartbeat_s, lease_ttl_s
    from orchestrator.checks.suite import select
    from orchestrator.config.profiles import load_profile

    lease = steps["lease"].data
    assert lease["ttl_s"] == lease_ttl_s(load_profile("lab"), len(select())), lease
    assert lease["heartbeat_s"] == heartbeat_s(lease["ttl_s"]) and lease["ttl_s"] != 3600
    assert all(h["stale_after_s"] == int(2 * lease["heartbeat_s"]) for h in lease["leases"]), lease


def test_perturbed_draft_is_accepted_often_and_rejected_sometimes(first_accept):
    """The lab route's draft (the target's weights plus seeded noise) runs both verification paths."""
    sp = first_accept.suite.result("speculative")
    assert sp.verdict == "passed", sp.message
    assert sp.figures["expect"] == ["accepted", "rejected"]
    assert sp.figures["draft_n_accepted"] > 0 and sp.figures["draft_rejected"] > 0, sp.figures
    assert 0.3 < sp.figures["acceptance"] < 1.0, sp.figures


def test_accept_cli_table_and_unknown_check(deployed_lab, cli):
    r = run_cli(cli, "accept", "--pair", PAIR, "--only", "identity,one_lane_near_full")
    assert r.exit_code == 0, r.output
    assert "one_lane_near_full" in r.stdout and "PASSED" in r.stdout
    r = run_cli(cli, "accept", "--pair", PAIR, "--only", "no_such_check")
    assert r.exit_code == 2 and "unknown check" in r.stderr  # a usage error (issue 34), as --checks bogus


def test_a_failing_required_check_exits_1(deployed_lab, cli, tmp_path):
    # a profile whose slots are bigger than the deployed server's: identity and the lane fail
    import yaml

    from orchestrator.config.profiles import load_profile

    big = load_profile("lab").model_dump(mode="json")
    big.update(name="lab-big-slots", ctx_size=8192)
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    r = run_cli(
        cli, "accept", "--pair", PAIR, "--only", "identity,one_lane_near_full", "--profile", str(tmp_path / "big.yaml")
    )
    assert r.exit_code == 1, r.output
    assert f"acceptance of pair {PAIR} failed" in r.stderr


# --- each check, broken on purpose ------------------------------------------------------------


def _bigger(ctx):
    """The same pair checked against a profile wanting twice the slot context it has."""
    return replace(ctx, profile=ctx.profile.model_copy(update={"ctx_size": ctx.profile.ctx_size * 2}))


def test_two_lane_fails_when_slot_context_is_smaller_than_needed(live):
    r = near_full.run_two_lane(_bigger(live.ctx))
    assert r.verdict == "failed", r.message
    assert "exceed" in r.message or "truncated" in r.message or "generated" in r.message


def test_one_lane_fails_when_slot_context_is_smaller_than_needed(live):
    r = near_full.run_one_lane(_bigger(live.ctx))
    assert r.verdict == "failed", r.message


def test_exactly_full_fills_the_slot_and_fails_when_it_is_short(live):
    """48 tokens short of the reported context is what the near-full slack hid (issue 15)."""
    from orchestrator.checks import exactly_full

    r = exactly_full.run(live.ctx)
    assert r.verdict == "passed", r.message
    room = live.ctx.profile.draft.n_max if live.ctx.drafting() and live.ctx.profile.draft else 0
    assert exactly_full.GENERATE - room <= r.figures["generated"] <= exactly_full.GENERATE  # lab: 14 of 16, drafting
    assert r.raw["over"]["type"] == exactly_full.OVER_ERROR
    short = replace(live.ctx, profile=live.ctx.profile.model_copy(update={"ctx_size": live.ctx.profile.ctx_size + 96}))
    assert short.per_slot() > live.ctx.per_slot()
    r = exactly_full.run(short)
    assert r.verdict == "failed" and "refused" in r.message, r.message


def test_two_lane_fails_when_a_prompt_carries_the_other_lanes_nonce(live):
    r = near_full.run_two_lane(live.ctx, leak_other_nonce=True)
    assert r.verdict == "failed"
    assert "prompt carries lane 1's nonce" in r.message


def test_two_lane_recall_mode_fails_on_a_model_that_cannot_recall(live):
    # the tiny random model never says its nonce: recall-mode isolation must fail, not pass vacuously
    r = near_full.run_two_lane(replace(live.ctx, options=CheckOptions(isolation="recall")))
    assert r.verdict == "failed" and "own nonce" in r.message


def test_speculative_fails_when_drafting_changes_output(live):
    # The lab model's greedy margins are wide (~30 logits): only a near-flat sampler with every
    # truncation off makes the drafted requests leave the greedy path, as a broken draft would.
    r = speculative.run(
        live.ctx, drafted_params={"temperature": 1000.0, "seed": 7, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    )
    assert r.verdict == "failed" and "differs from the draft-free reference" in r.message


def test_cached_continuation_fails_without_the_cache(live):
    r = cached_continuation.run(live.ctx, cache_second=False)
    assert r.verdict == "failed" and "cached tokens" in r.message


def test_long_prefix_fails_without_the_cache(live):
    r = long_prefix.run(live.ctx, cache_second=False)
    assert r.verdict == "failed" and "reused 0" in r.message


def test_cancellation_fails_when_the_stream_is_not_closed(live):
    r = cancellation.run(live.ctx, close_connection=False)
    assert r.verdict == "failed", r.message
    assert r.figures["cancel_logged"] is False


def test_cancellation_passes_and_reads_the_cancel_from_the_host_log(live):
    r = cancellation.run(live.ctx)
    assert r.verdict == "passed", r.message
    assert r.raw["log"]["found"] and r.figures["idle_after_s"] <= r.figures["bound_s"]
    # issue 42 item 2: the lateness bound is decode steps measured on this pair, with its source
    late = r.raw["late_bound"]
    assert late["bound_s"] == r.figures["late_bound_s"] and late["bound_s"] > 0, late
    assert "steps x allowance" in late["why"] and "follow-up" in late["step_from"], late
    assert late["slots_round_trip_s"] is not None and late["step_s"] > 0, late
    held = r.figures["held_after_close_s"]
    assert held is None or held <= late["bound_s"], (held, late)
    print("cancellation late bound:", late)


def test_identity_fails_when_the_server_restarts_during_the_suite(live):
    from orchestrator.hosts.layout import LLAMA_SERVER, HostLayout
    from orchestrator.hosts.services import wait_health

    ctx = live.ctx
    tr, layout = ctx.transports["native"], HostLayout(ctx.host_roots["native"])
    argv = list(live.route.active.native_argv)

    def restart(c):
        tr.run(layout.stop_cmd(LLAMA_SERVER), timeout=60)
        tr.run(layout.start_cmd(LLAMA_SERVER, argv), timeout=60)
        wait_health(tr, layout, ctx.client.base_url, timeout_s=60)
        from orchestrator.checks.base import CheckResult

        return CheckResult(name="one_lane_near_full", verdict="passed", message="restarted the server")

    s = run_suite(ctx, only=["identity", "one_lane_near_full"], overrides={"one_lane_near_full": restart})
    ident = s.result("identity")
    assert ident.verdict == "failed" and not s.passed
    assert "pid" in ident.message


def test_sampler_timeout_is_a_fault_not_a_check_failure(live):
    ctx = replace(live.ctx, options=CheckOptions(telemetry_sample_timeout_s=1e-4))
    s = run_suite(ctx, only=["one_lane_near_full", "telemetry"])
    t = s.result("telemetry")
    assert s.sampler_faults and t.figures["sampler_faults"] >= 1
    assert s.result("one_lane_near_full").verdict == "passed"
    assert s.passed  # a sampler fault is recorded, not a failure of the pair


def test_answer_fixture_regression_fails_against_the_baseline(first_accept, deployed_lab, restore_baseline, cli):
    """Redeploy the pair serving other weights (profile lab-other-target): every
    same-as-baseline answer changes, so the check fails against the first run's receipt.
    The lab profile is restored afterwards."""
    pkg = deployed_lab.package_id
    r = run_cli(cli, "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", "lab-other-target", "--skip-accept")
    assert r.exit_code == 0, r.output
    r, data = _accept(cli, "--only", "answer_fixtures", "--baseline-receipt", first_accept.receipt)
    assert r.exit_code == 1, r.output
    af = next(c for c in data["checks"] if c["name"] == "answer_fixtures")
    assert af["verdict"] == "failed" and "passed on the baseline, fails now" in af["message"]


def test_other_draft_is_rejected_and_gives_the_undrafted_output(deployed_lab, restore_baseline, cli):
    pkg = deployed_lab.package_id
    r = run_cli(cli, "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", "lab-draft-other", "--skip-accept")
    assert r.exit_code == 0, r.output
    r, data = _accept(cli, "--only", "speculative")
    assert r.exit_code == 0, r.output
    sp = data["checks"][0]
    assert sp["verdict"] == "passed" and sp["figures"]["draft_n"] > 0
    assert sp["figures"]["acceptance"] < 0.5  # rejected, yet the output equals the reference
    assert sp["figures"]["expect"] == ["rejected"]


def test_deploy_whose_acceptance_fails_rolls_back(deployed_lab, lab_packages_b, restore_baseline, cli):
    """Deploy B with a route that declares no near-full slack (profile lab-no-slack): the server is
    the lab's and verifies, but a lane filling the whole slot is cut short by the server, so the
    one-lane acceptance check fails and deploy restores A (exit 7)."""
    from tests.plugins.pairs import is_active, lab_status

    a, b = deployed_lab.package_id, lab_packages_b.id
    r = run_cli(
        cli,
        "--json",
        "deploy",
        "--pair",
        PAIR,
        "--packages",
        b,
        b,
        "--profile",
        "lab-no-slack",
        "--checks",
        "one_lane_near_full",
    )
    assert r.exit_code == 7, (r.exit_code, r.stderr[-2000:])
    assert "one_lane_near_full" in r.stderr and "rolled back" in r.stderr
    st = lab_status(cli, PAIR, INV_ARG)
    assert is_active(st, a), st
    rec = EvidenceStore(deployed_lab.home / "evidence").latest(PAIR)
    assert rec.outcome == "failed"
    lane = rec.step("check:one_lane_near_full")
    assert lane is not None and lane.outcome == "failed" and "truncated" in lane.data["message"]
    assert rec.extra_fields()["final_state"]["state"] == "restored"


def test_leased_pair_refused_and_scheduled_run_skipped(deployed_lab, cli):
    """Acceptance holds both hosts' leases: with someone else's lease it is refused (exit 5), and
    a scheduled run records a skipped receipt and exits 11; the leases are released after."""
    r = run_cli(cli, "--json", "lease", "take", PAIR, "--purpose", "test: someone else works here", "--ttl", "10m")
    assert r.exit_code == 0, r.output
    nonce = json.loads(r.stdout)["nonce"]
    try:
        r = run_cli(cli, "accept", "--pair", PAIR, "--only", "identity")
        assert r.exit_code == 5, r.output
        assert "someone else works here" in r.stderr
        r = run_cli(cli, "accept", "--pair", PAIR, "--only", "identity", "--scheduled")
        assert r.exit_code == 11, r.output
        rec = EvidenceStore(deployed_lab.home / "evidence").latest(PAIR)
        assert rec.command == "accept" and rec.outcome == "inconclusive" and rec.reason.startswith("skipped:")
    finally:
        r = run_cli(cli, "lease", "release", PAIR, "--nonce", nonce)
        assert r.exit_code == 0, r.output
    r = run_cli(cli, "accept", "--pair", PAIR, "--only", "identity")
    assert r.exit_code == 0, r.output


def _deploy(cli, pkg: str, profile: str, *checks: str):
    args = ["--json", "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", profile]
    for c in checks:
        args += ["--checks", c]
    return run_cli(cli, *args)


def _ref_step(home: Path):
    rec = EvidenceStore(home / "evidence").latest(PAIR)
    return rec, rec.step("check:reference_logprobs")


def test_reference_logprobs_pass_a_numeric_change_and_reject_a_forward_pass_change(
    deployed_lab, lab_packages_b, restore_baseline, cli, tmp_path
):
    """On the sensitive model (lab-oracle): the reference pair records its answers once, replays
    them and derives its gates from that floor (kept in the receipt); three accepts of it compare
    with them and pass at the floor; the same package with an f16 KV cache (another numerics key)
    is judged against the q8_0 answers only through its profile's tolerance, which names its
    reason; another package with f16 KV and no tolerance is refused with one line saying what
    changed and how to fix it; a changed RoPE base (no greedy token flips) is rejected at deploy,
    exit 7, and the previous pair is back."""
    pkg = deployed_lab.package_id
    _ensure_baseline_reference(cli, pkg)
    r = _deploy(cli, pkg, "lab-oracle")  # the whole suite: only such a run records answers (issue 42 item 5)
    assert r.exit_code == 0, r.stderr[-3000:]
    rec, st = _ref_step(deployed_lab.home)
    assert st is not None and st.data["raw"]["key"] and st.data["verdict"] in ("skipped", "passed"), st.data["message"]
    ref = (
        EvidenceStore(deployed_lab.home / "evidence")
        .load(st.data["raw"].get("reference_receipt") or rec.sha256)
        .step("check:reference_logprobs")
        .data["raw"]
    )
    assert ref["role"] == "reference" and ref["floor"]["positions"] >= 100, ref.get("floor")
    gates = ref["derived_gates"]  # floor x factor, at least the documented minimum
    assert gates["max_abs_dlogprob"] >= max(ref["floor"]["max_abs_dlogprob"] * ref["floor_factor"], 2e-3 - 1e-12)
    for _ in range(3):
        r, data = _accept(cli, "--only", "reference_logprobs")
        assert r.exit_code == 0, r.output
        c = data["checks"][0]
        assert c["verdict"] == "passed" and c["required"], c
        assert c["figures"]["max_abs_dlogprob"] < 1e-3 and c["figures"]["top1"] == 1.0
        assert c["figures"]["reference_receipt"] and c["figures"]["positions"] >= 100
        assert c["figures"]["gate_max_abs_dlogprob"] == gates["max_abs_dlogprob"]

    r = _deploy(cli, pkg, "lab-oracle-kv-f16", "reference_logprobs")
    assert r.exit_code == 0, r.stderr[-3000:]
    rec, st = _ref_step(deployed_lab.home)
    figs, raw = st.data["figures"], st.data["raw"]
    assert st.data["verdict"] == "passed" and figs["max_abs_dlogprob"] > 1e-3, figs  # it moved, within the tolerance
    assert raw["tolerance"]["reason"] and "cache_type_k q8_0 -> f16" in raw["tolerance"]["changed"], raw["tolerance"]
    assert raw["gates_in_force"]["max_mean_kl"] > figs["mean_kl"] and "tolerance" in raw["gates_in_force"]["from"]

    # the same change on a pair that is not the reference, with no tolerance declared: refused, one line
    bare = tmp_path / "lab-oracle-kv-f16-bare.yaml"
    text = (MANIFESTS / "profiles/lab-oracle-kv-f16.yaml").read_text().split("reference_gates:")[0]
    bare.write_text(text.replace("name: lab-oracle-kv-f16", "name: lab-oracle-kv-f16-bare"))
    r = _deploy(cli, lab_packages_b.id, str(bare), "reference_logprobs")
    assert r.exit_code == 7, (r.exit_code, r.stderr[-2000:])
    rec, st = _ref_step(deployed_lab.home)
    msg = st.data["message"]
    assert "numerics changed since the reference answers (cache_type_k q8_0 -> f16" in msg, msg
    assert "declares no reference_gates.tolerance" in msg and "\n" not in msg, msg
    assert rec.extra_fields()["final_state"]["state"] == "restored"

    r = _deploy(cli, pkg, "lab-oracle-rope", "reference_logprobs")
    assert r.exit_code == 7, (r.exit_code, r.stderr[-2000:])
    assert "reference_logprobs" in r.stderr and "rolled back" in r.stderr
    rec, st = _ref_step(deployed_lab.home)
    assert rec.outcome == "failed" and st.outcome == "failed", st.data["message"]
    assert "KL" in st.data["message"] or "delta logprob" in st.data["message"]
    assert rec.extra_fields()["final_state"]["state"] == "restored"
    status = run_cli(cli, "--json", "status", "--pair", PAIR)
    assert "lab-oracle-kv-f16" in json.loads(status.stdout)["route"]["active"]

    r = run_cli(cli, "--json", "reference", "show", "--pair", PAIR)
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert shown["reference"]["native_package"] and shown["answers"]


def test_reference_set_is_recorded_and_refuses_bad_input(deployed_lab, cli):
    pkg = deployed_lab.package_id
    r = run_cli(cli, "reference", "set", "--pair", PAIR, "--package", "no-such-package", "--reason", "test")
    assert r.exit_code == 3 and "no such package" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(cli, "reference", "set", "--pair", PAIR, "--package", pkg, "--native-package", pkg, "--reason", "x")
    assert r.exit_code == 3
    r = run_cli(
        cli, "--json", "reference", "set", "--pair", PAIR, "--package", pkg, "--reason", "e2e: pin the baseline"
    )
    assert r.exit_code == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["reference"] == {"native_package": pkg, "rpc_package": pkg, "receipt": out["receipt"], "how": "set"}
    rec = EvidenceStore(deployed_lab.home / "evidence").load(out["receipt"])
    assert rec.command == "reference" and rec.extra_fields()["reference"]["reason"] == "e2e: pin the baseline"


def _ensure_baseline_reference(cli, pkg: str) -> None:
    """The route's reference is the baseline package (as the mutant suite pins it), so the lab-oracle
    answers these tests compare with are the baseline's whatever ran before."""
    r = run_cli(cli, "--json", "reference", "show", "--pair", PAIR)
    ref = (json.loads(r.stdout).get("reference") if r.exit_code == 0 else None) or {}
    if (ref.get("native_package"), ref.get("rpc_package")) != (pkg, pkg):
        r = run_cli(cli, "--json", "reference", "set", "--pair", PAIR, "--package", pkg, "--reason", "e2e: baseline")
        assert r.exit_code == 0, r.output[-2000:]


def test_baseline_deploy_and_three_accepts_pass_with_identical_verdicts(deployed_lab, cli):
    """Issue 15's "no flaky verdict": the baseline deployed with its whole acceptance suite, then
    `pairctl accept` on it; every run exits 0 and every check gives the same verdict in three
    independent runs (a check that passes or fails by chance, e.g. on the shared machine's load,
    fails here). The deploy's own suite is the first judgement of each check it judged
    (tests/plugins/pairs.py three_judgements)."""
    from tests.plugins.pairs import three_judgements

    pkg = deployed_lab.package_id
    _ensure_baseline_reference(cli, pkg)
    r = run_cli(cli, "--json", "deploy", "--pair", PAIR, "--packages", pkg, pkg, "--profile", "lab")
    assert r.exit_code == 0, r.stderr[-3000:]
    rec = EvidenceStore(deployed_lab.home / "evidence").load(json.loads(r.stdout)["receipt"])
    assert rec.outcome == "passed" and rec.extra_fields()["acceptance"]["passed"] is True
    assert [s for s in rec.steps if s.name.startswith("check:") and s.outcome == "failed"] == []

    def accept(*extra: str) -> dict[str, str]:
        r, data = _accept(cli, *extra)
        assert r.exit_code == 0, r.output[-3000:]
        return _verdicts(data)

    judged = three_judgements(_verdicts(rec.extra_fields()["acceptance"]), accept)
    # the same verdict three times, and it is `passed` (answers recorded: nothing left to skip)
    assert all(v == ["passed"] * 3 for v in judged.values()), judged


def _llama_server_argv(rec) -> list[str]:
    for ident in rec.identities:
        for host in ident.data.values():
            if isinstance(host, dict) and host.get("service") == "llama-server":
                return list(host["argv"])
    raise AssertionError("no llama-server identity in the deploy receipt")


def test_a_deploy_limited_to_reference_logprobs_records_no_reference(deployed_lab, restore_baseline, cli, tmp_path):
    """Issue 42 item 5: a deploy limited to `--checks reference_logprobs`, whose only check skipped,
    made its pair the route's reference. Now the reference pair, deployed with a profile whose key
    has no answers yet, records nothing in such a run and says so; its receipt says the suite was
    limited, and that real receipt alone makes no pair a reference."""
    from orchestrator.checks.reference import WHOLE_SUITE, ran_whole_suite, state_from_receipts

    pkg = deployed_lab.package_id
    _ensure_baseline_reference(cli, pkg)
    prof = tmp_path / "lab-oracle-limited.yaml"  # a slot size no run has recorded answers for
    text = (MANIFESTS / "profiles/lab-oracle.yaml").read_text()
    text = text.replace("name: lab-oracle", "name: lab-oracle-limited").replace("ctx_size: 4096", "ctx_size: 3072")
    prof.write_text(text)
    r = _deploy(cli, pkg, str(prof), "reference_logprobs")
    assert r.exit_code == 0, r.stderr[-3000:]
    rec, st = _ref_step(deployed_lab.home)
    assert rec.outcome == "passed" and rec.extra_fields()[WHOLE_SUITE] is False and not ran_whole_suite(rec)
    assert st.data["verdict"] == "skipped" and st.data["raw"]["role"] == "not recorded", st.data
    msg = st.data["message"]
    assert "does not run the whole suite" in msg and "nothing was recorded" in msg and "\n" not in msg, msg
    assert "reference_logprobs" in r.stderr and "nothing was recorded" in r.stderr, r.stderr[-2000:]
    shown = json.loads(run_cli(cli, "--json", "reference", "show", "--pair", PAIR).stdout)
    assert st.data["raw"]["key"] not in [a["key"] for a in shown["answers"]], shown
    assert state_from_receipts([rec]).pin is None  # this receipt alone would not make a reference


def test_reference_logprobs_pass_thread_count_split_and_ubatch_changes(deployed_lab, restore_baseline, cli):
    """Issue 15: the thread-count change in the lab passes the logprob gates. In the lab every layer
    of lab-oracle runs on the RPC host (ggml-rpc-server, its own thread count), where llama-server's
    --threads computes nothing; so the thread count is changed on a split with two of the three
    layers on the native host's CPU (lab-oracle-ngl1: 1 thread, lab-oracle-ngl1-t2: 2 threads),
    each judged against the reference answers, and so is ubatch 256 -> 64 (lab-oracle-ub64).
    Each deploy passes reference_logprobs; the figures are printed for docs/reference-answers.md."""
    pkg = deployed_lab.package_id
    _ensure_baseline_reference(cli, pkg)
    r = _deploy(cli, pkg, "lab-oracle")  # the whole suite records the answers (issue 42 item 5), or compares at zero
    assert r.exit_code == 0, r.stderr[-3000:]
    measured = {}
    for profile, checks in (
        ("lab-oracle-ngl1", ("identity", "reference_logprobs")),
        ("lab-oracle-ngl1-t2", ("identity", "reference_logprobs")),
        ("lab-oracle-ub64", ("reference_logprobs",)),
    ):
        r = _deploy(cli, pkg, profile, *checks)
        assert r.exit_code == 0, (profile, r.stderr[-3000:])
        rec, st = _ref_step(deployed_lab.home)
        assert st.data["verdict"] == "passed" and st.data["raw"]["role"] == "candidate", (profile, st.data["message"])
        figs = st.data["figures"]
        assert figs["positions"] >= 100 and figs["reference_receipt"], figs
        argv = _llama_server_argv(rec)
        if profile.startswith("lab-oracle-ngl1"):
            threads = "2" if profile.endswith("-t2") else "1"
            assert argv[argv.index("--threads") + 1] == threads and argv[argv.index("--n-gpu-layers") + 1] == "1"
            split = rec.step("check:identity").data["raw"]["before"]["split"]
            assert split["devices"]["CPU"]["layers"] >= 1 and split["devices"]["RPC0"]["layers"] >= 1, split
        else:
            assert argv[argv.index("--ubatch-size") + 1] == "64"
        keep = ("positions", "mean_kl", "max_kl", "top1", "max_abs_dlogprob", "greedy_flips")
        measured[profile] = {k: figs[k] for k in keep}
    print("reference_logprobs measured:", json.dumps(measured, sort_keys=True))
