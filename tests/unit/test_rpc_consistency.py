"""Pure parts of checks.rpc_consistency: the probe's argv, the gates from the floor, the verdict.

The check itself runs against real servers in tests/e2e/test_rpc_consistency.py (a first deploy
of a build whose RPC host alone is broken) and tests/mutants.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.checks import logprobs as lp
from orchestrator.checks.base import CheckContext
from orchestrator.checks.rpc_consistency import _median, gates_of, judge, plan_probe, probe_profile
from orchestrator.config.inventory import load_inventory
from orchestrator.config.profiles import load_profile
from orchestrator.config.rpc_consistency import RpcConsistency
from orchestrator.errors import CheckFailed


def _ctx(api_key: object = None) -> CheckContext:
    inv = load_inventory("lab", {"PAIRCTL_HOME": "/H"})
    return CheckContext(
        client=SimpleNamespace(timeout=10),  # type: ignore[arg-type]
        profile=load_profile("lab"),
        pair="lab",
        inventory=inv,
        host_roots={"native": "/R/n", "rpc": "/R/r"},
        packages={"native": SimpleNamespace(id="pkg-n"), "rpc": SimpleNamespace(id="pkg-r")},
        api_key=api_key,
    )


def test_the_probe_is_the_profile_on_the_native_device_alone():
    ctx = _ctx()
    plan = plan_probe(ctx, RpcConsistency())
    pair = ctx.inventory.pair("lab")  # type: ignore[union-attr]
    argv = plan.argv
    assert argv[0] == "/R/n/releases/pkg-n/bin/llama-server"
    assert "--rpc" not in argv and not any(a.startswith("--spec") for a in argv), argv
    assert "--log-verbosity" not in argv  # the split expectation is identity's, not the probe's
    assert argv[argv.index("--port") + 1] == str(pair.server_port + 1)
    assert argv[argv.index("--model") + 1] == pair.models["target"].path
    state = ctx.inventory.hosts[pair.native].state_dir  # type: ignore[union-attr]  # run/ links there
    assert argv[argv.index("--log-file") + 1].startswith(f"{state}/rpc-consistency/")
    assert "--api-key-file" not in argv
    # what decides the numbers stays the profile's: KV types, flash attention, threads, layers
    live = ctx.profile.render_args(
        model_paths={r: m.path for r, m in pair.models.items()}, host="h", port=1, rpc=["x:1"]
    )
    for flag in ("--cache-type-k", "--cache-type-v", "--flash-attn", "--threads", "--n-gpu-layers", "--ubatch-size"):
        assert argv[argv.index(flag) + 1] == live[live.index(flag) + 1], flag
    assert plan.root == f"{state}/rpc-consistency" and plan.base_url.endswith(f":{pair.server_port + 1}")


def test_the_probe_uses_the_pairs_api_key_file_when_it_has_one():
    argv = plan_probe(_ctx(api_key="k"), RpcConsistency()).argv
    assert argv[argv.index("--api-key-file") + 1] == "/R/n/secrets/api-key"
    assert "k" not in argv


def test_a_port_offset_onto_the_rpc_port_is_refused():
    ctx = _ctx()
    pair = ctx.inventory.pair("lab")  # type: ignore[union-attr]
    with pytest.raises(CheckFailed, match="port_offset"):
        plan_probe(ctx, RpcConsistency.model_construct(port_offset=pair.rpc_port - pair.server_port))


def test_probe_profile_drops_draft_and_split_only():
    p = load_profile("lab")
    q = probe_profile(p)
    assert q.draft is None and q.split is None
    assert q.model_dump(exclude={"draft", "split"}) == p.model_dump(exclude={"draft", "split"})


def test_gates_come_from_the_floor_with_a_minimum():
    lab = RpcConsistency()
    assert lab.gate_abs_dlogprob() == lab.min_abs_dlogprob == 1e-4  # 10 x the lab floor (5e-7) is below the minimum
    assert lab.gate_max_kl() == lab.min_max_kl == 1e-9
    gpu = RpcConsistency(floor_abs_dlogprob=0.02, floor_max_kl=1e-6, factor=5, floor_source="measured")
    assert gpu.gate_abs_dlogprob() == pytest.approx(0.1) and gpu.gate_max_kl() == pytest.approx(5e-6)
    g = gates_of(gpu)
    assert g["floor_source"] == "measured" and g["max_abs_dlogprob"] == pytest.approx(0.1)


def test_judge_passes_the_floor_and_fails_a_small_fault():
    cfg = RpcConsistency()
    floor = lp.Summary(positions=24, mean_kl=1e-29, max_kl=1.5e-28, top1=1.0, max_abs_dlogprob=5e-7)
    assert judge(floor, cfg) == []
    fault = lp.Summary(positions=24, mean_kl=4e-22, max_kl=9e-21, top1=1.0, max_abs_dlogprob=0.135)
    assert judge(fault, cfg) == ["max |delta logprob| 0.135 > 0.0001"]
    flipped = lp.Summary(positions=24, mean_kl=1e-30, max_kl=1e-30, top1=23 / 24, max_abs_dlogprob=1e-7)
    assert any("top-1" in p for p in judge(flipped, cfg))


def test_median():
    assert _median([]) == 0.0 and _median([3.0, 1.0, 2.0]) == 2.0 and _median([1.0, 2.0]) == 1.5
