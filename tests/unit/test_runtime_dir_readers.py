"""Issue 49's readers of a service's files: the commands and hints that name its folder, with the
runtime dir (run/ read-only) and without (run/: byte-identical to before). Pure: fake hosts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from orchestrator.checks.split import log_grep_cmd
from orchestrator.checks.telemetry import SAMPLE_SCRIPT, sample_cmd
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.units import root_tag
from orchestrator.remote.transport import FileStat

RT = f"/run/pairctl-0/{root_tag('/r')}"


class _Root:
    """A root login whose runtime dir holds NAME.state for the services in `held`."""

    name = "h"

    def __init__(self, *held: str) -> None:
        self.held = held

    def login_uid(self) -> int:
        return 0

    def stat(self, path: str) -> FileStat | None:
        if path in ("/run/pairctl-0", RT):
            return FileStat(mode=0o40700, size=0, mtime=0.0, uid=0)
        if path in (f"{RT}/{n}.state" for n in self.held):
            return FileStat(mode=0o100600, size=1, mtime=0.0, uid=0)
        return None


def test_log_grep_cmd_reads_run_unless_given_the_service_folder():
    assert log_grep_cmd("/r/", "llama-server.log", "a", "b", most=5).argv == (
        "grep", "-F", "-m", "5", "-e", "a", "-e", "b", "--", "/r/run/llama-server.log",
    )  # fmt: skip
    assert log_grep_cmd("/r", "llama-server.log", "a", folder=RT).argv == (
        "grep", "-F", "-m", "20", "-e", "a", "--", f"{RT}/llama-server.log",
    )  # fmt: skip
    assert log_grep_cmd("/r", "x.log", "a", folder="/r/run") == log_grep_cmd("/r", "x.log", "a")


def test_sample_cmd_reads_the_pid_file_in_the_service_folder():
    assert sample_cmd("/r/", "native").argv == ("sh", "-c", SAMPLE_SCRIPT, "pairctl-mem", "/r/run/llama-server.pid")
    assert sample_cmd("/r", "rpc", RT).argv == ("sh", "-c", SAMPLE_SCRIPT, "pairctl-mem", f"{RT}/ggml-rpc-server.pid")
    assert sample_cmd("/r", "native", "/r/run") == sample_cmd("/r", "native")


def test_a_failed_rollbacks_hint_names_the_folder_each_service_runs_from():
    from orchestrator.engine.deploy import _logs_folder

    def ctx(t: Any) -> Any:
        def get(role: str) -> Any:
            if isinstance(t, Exception):
                raise t
            return t

        return SimpleNamespace(
            view=SimpleNamespace(layouts={"native": HostLayout("/r"), "rpc": HostLayout("/r")}), t=get
        )

    assert _logs_folder(ctx(_Root("llama-server")), "native") == f"{RT}/"
    assert _logs_folder(ctx(_Root("llama-server")), "rpc") == "/r/run/"  # its ggml-rpc-server is in run/
    assert _logs_folder(ctx(_Root()), "native") == "/r/run/"
    assert _logs_folder(ctx(OSError("unreachable")), "native") == "/r/run/"


def test_the_split_check_names_a_service_user_that_cannot_write_its_log_in_the_runtime_dir():
    """A service user's llama-server cannot enter the root-only runtime dir: its --log-file there
    stays empty, and the split check says so (host, path, user, fix), not "run it with -lv 4"."""
    from orchestrator.checks.split import read_split

    sup = b"sh\0/r/bin/pairctl-svc\0supervise\0/r\0llama-server\0sup.user=pairctl\0/r/bin/llama-server\0"

    class Host(_Root):
        def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
            files = {f"{RT}/llama-server.sup.pid": b"77\n", "/proc/77/cmdline": sup}
            if path not in files:
                raise FileNotFoundError(2, "No such file", path)
            return files[path]

        def run(self, cmd: Any, check: bool = False, timeout: float = 0) -> Any:
            assert cmd.argv[-1] == f"{RT if self.held else '/r/run'}/llama-server.log"
            return SimpleNamespace(stdout="", exit_status=1)

    def ctx(t: Any) -> Any:
        profile = SimpleNamespace(split=SimpleNamespace(rpc_min_layers=1, rpc_min_model_mib=1, rpc_kv=False))
        return SimpleNamespace(profile=profile, transports={"native": t}, host_roots={"native": "/r"}, host_names={})

    assert read_split(ctx(Host("llama-server")))["problems"] == [
        f"split: h: llama-server runs from the runtime dir {RT} (/r/run is read-only) as service user pairctl, "
        "which cannot write its log there: make /r/run writable and restart llama-server"
    ]
    (normal,) = read_split(ctx(Host()))["problems"]  # run/: the advice as before
    assert normal.startswith("split: the server's log shows no model load (run it with --log-verbosity")
