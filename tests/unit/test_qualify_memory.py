"""The pair memory a qualification records per sample, from the telemetry sample script's
output as hosts print it (nvidia-smi CSV, /proc/PID/status lines)."""

from orchestrator.checks.telemetry import parse_sample
from orchestrator.qualify.engine_driver import pair_memory

CPU = """source=proc pid=4242
VmHWM:\t   48236 kB
VmRSS:\t   48000 kB
"""
GPU = """source=nvidia-smi
0, Tesla V100-SXM2-32GB, 30120, 32768
source=proc pid=777
VmHWM:\t  900000 kB
VmRSS:\t  880000 kB
"""


def test_cpu_hosts_give_their_services_peak_rss():
    total, source = pair_memory({"native": parse_sample(CPU), "rpc": parse_sample(CPU)})
    assert total == 2 * 48236 * 1024 and source == f"native=VmHWM:{48236 * 1024} rpc=VmHWM:{48236 * 1024}"


def test_a_gpu_host_gives_the_gpu_memory_in_use_not_its_rss():
    total, source = pair_memory({"native": parse_sample(GPU), "rpc": parse_sample(CPU)})
    assert total == 30120 * 1024 * 1024 + 48236 * 1024
    assert source.startswith("native=nvidia-smi:") and "rpc=VmHWM:" in source


def test_no_service_and_no_gpu_is_none_never_zero():
    total, source = pair_memory({"native": parse_sample("no_process=/r/run/llama-server.pid\n")})
    assert total is None and "no running service" in source
