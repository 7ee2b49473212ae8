"""The load-log split parser and its judgement, on llama-server logs captured from the pinned build
(lab target over RPC to a CPU ggml-rpc-server, -lv 4 and -lv 5)."""

from pathlib import Path

from orchestrator.checks.split import device_of, parse_load_split, split_problems
from orchestrator.config.split import SplitExpectation

GOLDEN = Path(__file__).parent / "golden"


def test_buffer_names_map_to_devices():
    assert device_of("RPC0[127.0.0.3:50052]") == "RPC0"
    assert device_of("CPU_Mapped") == device_of("CPU_REPACK") == device_of("CPU") == "CPU"
    assert device_of("CUDA0") == "CUDA0"


def test_info_level_log_gives_bytes_and_layers_of_the_one_accelerator():
    s = parse_load_split((GOLDEN / "server_log_load_lv4.txt").read_text())
    assert s is not None
    assert s["offloaded"] == 3 and s["n_layers_total"] == 3
    assert s["devices"]["RPC0"] == {"model_mib": 1.44, "kv_mib": 2.12, "layers": 3}
    assert s["devices"]["CPU"] == {"model_mib": 0.19, "kv_mib": 0.0, "layers": 0}
    assert s["layers_from"].startswith("offloaded")
    assert split_problems(s, SplitExpectation()) == []


def test_debug_level_log_counts_layers_and_skips_the_fitting_probe():
    s = parse_load_split((GOLDEN / "server_log_load_lv5.txt").read_text())
    assert s is not None and s["layers_from"].startswith("debug")
    assert s["devices"]["RPC0"]["layers"] == 3 and s["devices"]["RPC0"]["model_mib"] == 1.44  # not the 0.00 probe


def test_an_idle_rpc_device_fails():
    text = (GOLDEN / "server_log_load_lv4.txt").read_text()
    assert parse_load_split("no load lines at verbosity 3\n") is None
    assert "no model load" in split_problems(None, SplitExpectation())[0]
    # everything on the native CPU: no RPC buffer at all
    local = "\n".join(line for line in text.splitlines() if "RPC0[" not in line)
    local = local.replace("offloaded 3/3", "offloaded 0/3")
    (p,) = split_problems(parse_load_split(local), SplitExpectation())
    assert "RPC host holds nothing" in p
    # an RPC device that holds no layers (zero weights, zero KV)
    idle = text.replace("model buffer size =     1.44 MiB", "model buffer size =     0.00 MiB").replace(
        "KV buffer size =     2.12 MiB", "KV buffer size =     0.00 MiB"
    )
    probs = split_problems(parse_load_split(idle), SplitExpectation())
    assert any("0 MiB of weights" in p for p in probs) and any("no KV cache" in p for p in probs)
    assert any("hold 0 layers" in p or "not in the log" in p for p in probs)
    assert split_problems(parse_load_split(text), SplitExpectation(rpc_min_layers=4))[0].startswith(
        "the RPC device(s) hold 3 layers"
    )
