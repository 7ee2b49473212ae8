"""Peak memory probe parser, on /proc/PID/status text as Linux prints it."""

from orchestrator.qualify.engine_driver import parse_vmhwm

STATUS = """Name:\tllama-server
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t  912344 kB
VmSize:\t  846808 kB
VmHWM:\t   48236 kB
VmRSS:\t   48236 kB
Threads:\t5
"""


def test_vmhwm_in_bytes():
    assert parse_vmhwm(STATUS) == 48236 * 1024


def test_vmhwm_missing_or_malformed_is_none_never_zero():
    assert parse_vmhwm(STATUS.replace("VmHWM", "VmXXX")) is None
    assert parse_vmhwm("VmHWM:\t  12 MB\n") is None
    assert parse_vmhwm("") is None


def test_vmhwm_of_this_process_is_positive():
    with open("/proc/self/status") as f:
        assert parse_vmhwm(f.read()) > 0
