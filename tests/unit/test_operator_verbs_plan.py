"""The plans `restart`, `start` and `stop` print and run (issue 34 item 7), with no host: every
step that stops or starts a service carries its exact command (plan.service_exec), and the
links are left as found. And `diff`'s one-flag-a-line rendering of an argv."""

from __future__ import annotations

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.config.profiles import load_profile
from orchestrator.engine.actions import load_playbook
from orchestrator.engine.diff import argv_lines
from orchestrator.engine.plan import Activation, pair_view, plan
from orchestrator.hosts import services
from orchestrator.hosts.probes import facts_from


def _facts(cur: str, prev: str | None, running: dict[str, int]):
    procs = {n: (pid, f"/r/releases/{cur}/bin/{n}".encode() + b"\0") for n, pid in running.items()}
    return facts_from(
        root_exists=True,
        current_link=f"releases/{cur}",
        previous_link=f"releases/{prev}" if prev else None,
        release_names=[cur] + ([prev] if prev else []),
        svc_bytes=None,
        route_bytes=None,
        procs=procs,
    )


@pytest.fixture
def view(tmp_path):
    inv = load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)})
    return inv, pair_view(inv, "lab")


def _act(inv, view) -> Activation:
    pair = inv.pair("lab")
    argv = services.llama_server_argv(
        view.layouts["native"],
        "a",
        load_profile("lab"),
        model_paths={k: m.path for k, m in pair.models.items()},
        host=view.server_bind,
        port=view.server_port,
        rpc=[f"{view.rpc_bind}:{view.rpc_port}"],
        with_api_key=False,
    )
    rpc = services.rpc_server_argv(view.layouts["rpc"], "a", bind=view.rpc_bind, port=view.rpc_port)
    return Activation("a", "a", tuple(argv), tuple(rpc), label="active")


def test_restart_plan_carries_every_command_and_keeps_the_links(view):
    inv, v = view
    facts = {
        "native": _facts("a", "b", {"llama-server": 10}),
        "rpc": _facts("a", "b", {"ggml-rpc-server": 11}),
    }
    links = {"native": ("a", "b"), "rpc": ("a", "b")}
    act = _act(inv, v)
    steps = plan(load_playbook("restart"), v, facts=facts, target=None, restore=act, restore_links=links)
    by = {s.name: s for s in steps}
    assert [s.name for s in steps if s.changes] == ["stop-native", "restart-rpc", "start-server"]
    assert "switch-native" not in by and "route" not in by  # nothing switched, the record not written
    assert by["restart-rpc"].description.startswith(
        "stop ggml-rpc-server; current -> releases/a, previous -> releases/b"
    )
    start = by["start-server"].argv["lab-native"]
    assert any(a.endswith("/releases/a/bin/llama-server") for a in start), start
    assert all(by[n].execs for n in ("stop-native", "restart-rpc", "start-server"))


def test_stop_plan_stops_both_hosts_and_starts_nothing(view):
    inv, v = view
    facts = {"native": _facts("a", None, {"llama-server": 10}), "rpc": _facts("a", None, {})}
    steps = plan(load_playbook("stop"), v, facts=facts, target=None, restore=_act(inv, v))
    changing = [(s.name, s.hosts, s.action) for s in steps if s.changes]
    assert changing == [("stop-native", ("lab-native",), "stop"), ("stop-rpc", ("lab-rpc",), "stop")]
    assert "(pid 10)" in steps[3].description and "(not running)" in steps[4].description


def test_argv_lines_one_flag_with_its_values_a_line():
    argv = ["/r/bin/llama-server", "-m", "/m.gguf", "--n-gpu-layers", "-1", "--rpc", "a:1", "--flash-attn", "-c", "512"]
    assert argv_lines(argv) == [
        "/r/bin/llama-server",
        "-m /m.gguf",
        "--n-gpu-layers -1",
        "--rpc a:1",
        "--flash-attn",
        "-c 512",
    ]
    assert argv_lines([]) == []
