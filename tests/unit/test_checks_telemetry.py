"""Telemetry sampling: parser from captured output (H200 nvidia-smi, CPU /proc), and sampler
faults kept apart from check verdicts, using the real local transport."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.checks import telemetry as tm
from orchestrator.remote.local import LocalTransport

GOLDEN = Path(__file__).parent / "golden"


def test_parse_h200_sample():
    s = tm.parse_sample((GOLDEN / "telemetry_sample_h200.txt").read_text())
    assert s["gpus"] == [{"index": 0, "name": "NVIDIA H200", "used_mib": 0, "total_mib": 143771}]
    assert s["pid"] == 416 and s["vm_hwm_kib"] == 2256 and s["vm_rss_kib"] == 2256


def test_parse_cpu_sample_and_missing_process():
    s = tm.parse_sample((GOLDEN / "telemetry_sample_cpu.txt").read_text())
    assert s["gpus"] == [] and s["vm_hwm_kib"] == 1832
    s = tm.parse_sample((GOLDEN / "telemetry_sample_noproc.txt").read_text())
    assert s.get("no_process") and "vm_hwm_kib" not in s


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        tm.parse_sample("source=nvidia-smi\n0, H200, 12\n")
    with pytest.raises(ValueError):
        tm.parse_sample("hello\n")


def test_sample_cmd_is_fixed_text_with_the_path_as_argument():
    c = tm.sample_cmd("/srv/x; rm -rf /", "native")
    assert c.argv[:2] == ("sh", "-c") and c.argv[2] == tm.SAMPLE_SCRIPT
    assert c.argv[-1] == "/srv/x; rm -rf /run/llama-server.pid"  # one argument, never parsed by a shell


@pytest.fixture
def fake_root(tmp_path):
    """An install root whose run/llama-server.pid names a real process (a sleep we start)."""
    (tmp_path / "run").mkdir()
    p = subprocess.Popen(["sleep", "30"])
    (tmp_path / "run" / "llama-server.pid").write_text(f"{p.pid}\n")
    yield tmp_path
    p.terminate()
    p.wait()


def test_sampler_records_peaks(fake_root):
    s = tm.Sampler(
        transports={"native": LocalTransport("n")},
        roots={"native": str(fake_root)},
        hosts={"native": "n"},
        interval_s=0.05,
        timeout_s=10,
    )
    s._t0 = 0.0
    s.sample_once()
    s.sample_once()
    r = s.result()
    assert r.verdict == "passed" and not r.required
    assert r.figures["sampler_faults"] == 0 and r.figures["n.rss_peak_mib"] > 0
    assert s.peaks["n"].samples == 2


def test_sampler_timeout_is_a_fault_not_a_failure(fake_root):
    s = tm.Sampler(
        transports={"native": LocalTransport("n")},
        roots={"native": str(fake_root)},
        hosts={"native": "n"},
        interval_s=0.05,
        timeout_s=1e-6,
    )
    s.sample_once()
    r = s.result()
    assert s.faults and "CommandTimeout" in s.faults[0]["fault"]
    assert r.verdict == "error" and not r.required  # recorded, and does not fail acceptance
    assert r.ok and r.figures["sampler_faults"] == 1
