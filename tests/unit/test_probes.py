"""Pure parsers of the host helper's output and the identity comparisons (captured output)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.hosts import models as models_module
from orchestrator.hosts import probes
from orchestrator.hosts.probes import (
    ExpectedProc,
    ProbeError,
    argv0_is,
    build_info_problems,
    facts_from,
    hash_problems,
    parse_identity,
    parse_pid,
    parse_rpc_bind,
    parse_sha256sum,
    proc_problems,
    release_of_link,
    slots_problems,
)

# Captured from `pairctl-svc identity ROOT llama-server ggml-rpc-server`.
IDENTITY = (
    "proc=llama-server:31620:4add4bb89d8ca0e3b1bd861130ddd7ae0fd9617a8055de0a38c8d2ca1ac95723:"
    "L3RtcC9oOC9yL3JlbGVhc2VzL3BrZ0EvYmluL2xsYW1hLXNlcnZlcgAzMAAxcwA=\n"
    "proc=ggml-rpc-server:-\n"
)
SHA = "4add4bb89d8ca0e3b1bd861130ddd7ae0fd9617a8055de0a38c8d2ca1ac95723"


CMDLINE = b"/r/releases/pkgA/bin/llama-server\0--model\0/m/t.gguf\0"


def test_facts_from_links_releases_running_route():
    f = facts_from(
        root_exists=True,
        current_link="releases/pkgA",
        previous_link=None,
        release_names=["pkgA", ".pkgB.tmp-1a2b3c4d", "pkgC"],
        svc_bytes=b"#!/bin/sh\n",
        route_bytes=b'{"x":1}\n',
        procs={"llama-server": (31620, CMDLINE), "ggml-rpc-server": (7, b"/usr/bin/sleep\x0030\x00")},
    )
    assert f.root_exists and f.current == "pkgA" and f.previous is None
    assert f.releases == ("pkgA", "pkgC")  # the temporary upload is not a release
    assert f.running == {"llama-server": 31620}  # pid 7 is someone else's process now
    assert f.route_bytes == b'{"x":1}\n' and len(f.svc_sha256) == 64


def test_facts_of_an_empty_host():
    f = facts_from(
        root_exists=False,
        current_link=None,
        previous_link=None,
        release_names=[],
        svc_bytes=None,
        route_bytes=None,
        procs={},
    )
    assert not f.root_exists and f.current is None and f.releases == () and f.route_bytes is None


def test_facts_refuse_a_link_outside_releases():
    with pytest.raises(ProbeError):
        facts_from(
            root_exists=True,
            current_link="/etc",
            previous_link=None,
            release_names=[],
            svc_bytes=None,
            route_bytes=None,
            procs={},
        )


def test_argv0_and_pid_files():
    assert argv0_is(CMDLINE, "llama-server") and not argv0_is(CMDLINE, "ggml-rpc-server")
    assert not argv0_is(b"", "llama-server")
    assert parse_pid(b"123\n") == 123 and parse_pid(b"") is None and parse_pid(b"12a") is None


def test_links_must_point_into_releases():
    assert release_of_link("releases/a-b") == "a-b"
    assert release_of_link("/r/releases/a") == "a"
    assert release_of_link("-") is None
    for bad in ("/etc", "releases/a/b", "../x"):
        with pytest.raises(ProbeError):
            release_of_link(bad)


def test_sha256sum_parse_and_compare():
    out = f"{SHA}  ./bin/llama-server\n{'0' * 64} *./meta/help.txt\n{'1' * 64}  ./a file with spaces\n"
    got = parse_sha256sum(out)
    assert got == {"bin/llama-server": SHA, "meta/help.txt": "0" * 64, "a file with spaces": "1" * 64}
    assert hash_problems({"bin/llama-server": SHA}, got) == []
    probs = hash_problems({"bin/llama-server": "f" * 64, "bin/missing": SHA}, got)
    assert len(probs) == 2 and "bin/llama-server: sha256" in probs[0] and "bin/missing: missing" in probs[1]


@pytest.mark.parametrize("bad", ["nothex  ./x", f"{SHA}./x", f"{SHA}  ./x\n{SHA}  ./x", "\\" + SHA + "  ./a\\nb"])
def test_sha256sum_refuses_odd_lines(bad):
    with pytest.raises(ProbeError):
        parse_sha256sum(bad)


def test_identity_parse_decodes_argv_exactly():
    ids = parse_identity(IDENTITY)
    ls = ids["llama-server"]
    assert ls.pid == 31620 and ls.exe_sha256 == SHA
    assert ls.argv == ("/tmp/h8/r/releases/pkgA/bin/llama-server", "30", "1s")
    assert not ids["ggml-rpc-server"].running


def test_identity_argv_with_spaces_quotes_newlines_survives():
    argv = ["/r/releases/p/bin/llama-server", "--model", "/m/a b'c\"$(x);\n.gguf", "ü"]
    raw = b"\0".join(a.encode() for a in argv) + b"\0"
    line = f"proc=llama-server:7:{SHA}:{base64.b64encode(raw).decode()}\n"
    assert parse_identity(line)["llama-server"].argv == tuple(argv)


def test_proc_problems_catch_wrong_hash_argv_and_absence():
    argv = ("/r/releases/p/bin/llama-server", "30", "1s")
    seen = parse_identity(IDENTITY)["llama-server"]
    seen = type(seen)(seen.name, seen.pid, seen.exe_sha256, argv)
    assert proc_problems("h", ExpectedProc("llama-server", SHA, argv), seen) == []
    assert "sha256" in proc_problems("h", ExpectedProc("llama-server", "f" * 64, argv), seen)[0]
    p = proc_problems("h", ExpectedProc("llama-server", SHA, argv + ("--metrics",)), seen)
    assert "argv differs" in p[0] and "3 arguments, expected 4" in p[0]
    assert "not running" in proc_problems("h", ExpectedProc("llama-server", SHA, argv), None)[0]


def test_build_info_must_name_the_revision():
    rev = "5423bddf352adc41a8cc59ed02d38a511b333d30"
    assert build_info_problems("b11434-5423bddf35", rev) == []
    assert build_info_problems("b11434-5423bddf35", rev, expected="b11434-5423bddf35") == []
    assert build_info_problems("b0-unknown", rev)
    assert build_info_problems("b11434-c7de202aaa", rev)
    assert build_info_problems(None, rev)
    assert build_info_problems("b11434-5423bddf35", rev, expected="b11435-5423bddf35")


def test_slots_count_and_per_slot_context():
    slots = [{"id": 0, "n_ctx": 2048}, {"id": 1, "n_ctx": 2048}]
    assert slots_problems(slots, 2, 2048) == []
    assert slots_problems(slots[:1], 2, 2048)
    assert slots_problems(slots, 2, 4096)


def test_rpc_bind_from_argv():
    assert parse_rpc_bind(["/x/ggml-rpc-server", "-H", "127.0.0.3", "-p", "50052"]) == ("127.0.0.3", 50052)
    assert parse_rpc_bind(["/x/ggml-rpc-server"]) == (None, None)


def test_model_path_that_is_a_directory_is_named_not_a_host_error(tmp_path):
    """Issue 16 item 12: the helper reports a directory as no model (deploy refuses, exit 6),
    where `sha256sum < DIR` used to fail the whole exec (a host error, exit 4)."""
    script = Path(models_module.__file__).parent / "pairctl-svc.sh"
    (tmp_path / "root").mkdir()
    (tmp_path / "model-dir").mkdir()
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    out = subprocess.run(
        [
            "sh",
            str(script),
            "model-hash",
            str(tmp_path / "root"),
            str(tmp_path / "model-dir"),
            str(tmp_path / "m.gguf"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = probes.parse_model_hashes(out)
    assert seen[str(tmp_path / "model-dir")].how == "notfile" and seen[str(tmp_path / "m.gguf")].sha256

    class Local:
        def run(self, cmd, check, timeout):
            argv = ["sh", str(script), "model-hash", str(tmp_path / "root"), *cmd]
            return subprocess.run(argv, capture_output=True, check=check, timeout=timeout)

    class Layout:
        def model_hash_cmd(self, paths):
            return paths

    _, problems = models_module.check_models(
        {"target": str(tmp_path / "model-dir")}, {}, "lab-native", Local(), Layout(), expected_is="declared"
    )
    assert problems == [f"lab-native: model target ({tmp_path / 'model-dir'}) is not a regular file (a directory?)"]


def test_rpc_probe_states_and_problems():
    """pairctl-svc rpc-probe's line (issue 33: a stopped ggml-rpc-server is hung though the kernel accepts)."""
    from orchestrator.hosts.probes import parse_rpc_probe, rpc_probe_problem

    name = "ggml-rpc-server"
    assert parse_rpc_probe("rpc=ggml-rpc-server:hello:7.0.0\n", name) == "hello:7.0.0"
    assert parse_rpc_probe("noise\nrpc=ggml-rpc-server:stopped\n", name) == "stopped"
    assert parse_rpc_probe("rpc=llama-server:stopped\n", name) is None
    assert "SIGSTOP" in (rpc_probe_problem("h", name, "stopped", 3) or "")
    assert "HELLO" in (rpc_probe_problem("h", name, "unanswered", 3) or "")
    for fine in ("serving", "hello:7.0.0", "down", "unprobed", None):
        assert rpc_probe_problem("h", name, fine, 3) is None


def test_host_bounded_commands_carry_the_hosts_own_timeout():
    """Issue 33 item 4: a bounded remote command runs under the host's `timeout -k`, argv intact."""
    from orchestrator.remote.command import Cmd
    from orchestrator.remote.ssh import HOST_KILL_AFTER_S, host_bounded

    c = host_bounded(Cmd.of("sh", "/r/bin/pairctl-svc", "restart", "a b"), 80)
    assert c.real_argv() == [
        "timeout",
        "-k",
        f"{HOST_KILL_AFTER_S:g}s",
        "80.000s",
        "sh",
        "/r/bin/pairctl-svc",
        "restart",
        "a b",
    ]


def test_a_sub_millisecond_bound_is_never_no_bound():
    """`timeout 0` disables the limit: a bound of 1e-4 s (the telemetry fault test's) rendered as
    "0.000s" let the command run unbounded on the host. It is a millisecond instead."""
    from orchestrator.remote.command import Cmd
    from orchestrator.remote.ssh import host_bounded

    assert host_bounded(Cmd.of("true"), 1e-4).real_argv()[3] == "0.001s"


def test_argv_from_the_runtime_dir_moves_only_the_log_file_argument():
    """A start from the runtime dir (run/ read-only) puts llama-server's --log-file there: the
    helper replaces every argument exactly equal to ROOT/run/NAME.log (not only after --log-file),
    and identity expects that."""
    from orchestrator.hosts.probes import argv_from

    argv = ("/r/releases/p/bin/llama-server", "--log-file", "/r/run/llama-server.log", "-m", "/r/run/x.log", "-a")
    rt = "/run/pairctl-0/tag"
    assert argv_from((*argv, "/r/run/llama-server.log"), "/r", "llama-server", rt) == (
        "/r/releases/p/bin/llama-server",
        "--log-file",
        f"{rt}/llama-server.log",
        "-m",
        "/r/run/x.log",
        "-a",
        f"{rt}/llama-server.log",  # equal to it, after another option: replaced too, as the helper does
    )
    assert argv_from(argv, "/r", "llama-server", "/r/run") == argv


class _StrangersShm:
    """A lingering uid 1000 host where a stranger made /dev/shm/pairctl-1000 first (0700, not ours):
    lstat under it is refused (EACCES), as sftp-server answers it. run/ holds the service's state."""

    def __init__(self, root: str) -> None:
        from orchestrator.hosts.units import root_tag

        self.name = "h"
        self.top, self.rt = "/dev/shm/pairctl-1000", f"/dev/shm/pairctl-1000/{root_tag(root)}"
        self.files = {
            "/etc/passwd": b"u:x:1000:1000::/home/u:/bin/sh\n",
            f"{root}/run/llama-server.state": b"state=running\nrestarts=2\n",
        }

    def login_uid(self) -> int:
        return 1000

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        if path.startswith(self.top + "/"):
            raise PermissionError(13, "Permission denied", path)
        if path not in self.files:
            raise FileNotFoundError(2, "No such file", path)
        return self.files[path]

    def stat(self, path: str) -> object:
        from orchestrator.remote.transport import FileStat

        if path == "/var/lib/systemd/linger/u":
            return FileStat(mode=0o100644, size=0, mtime=0.0, uid=0)
        if path == self.top:
            return FileStat(mode=0o40700, size=0, mtime=0.0, uid=4242)  # the stranger's
        if path.startswith(self.top + "/"):
            raise PermissionError(13, "Permission denied", path)
        return None


def test_a_refused_lstat_of_the_runtime_dir_reads_run_as_the_helper_does():
    """The helper's rt_safe calls a runtime dir it cannot lstat not its own and uses run/: so do
    pairctl's readers (service_dirs, supervisor.read_state), never an error for the whole read."""
    from typing import cast

    from orchestrator.hosts.layout import HostLayout
    from orchestrator.hosts.supervisor import read_state
    from orchestrator.remote.transport import Transport

    t = cast(Transport, _StrangersShm("/r"))
    assert probes.RuntimeDir.of(t, "/r") is not None  # lingering: the runtime dir is asked for
    assert probes.service_dirs(t, "/r", ("llama-server", "ggml-rpc-server")) == {
        "llama-server": "/r/run",
        "ggml-rpc-server": "/r/run",
    }
    st = read_state(t, HostLayout("/r"), "llama-server")
    assert st is not None and (st.state, st.restarts, st.runtime_dir) == ("running", 2, None)


def test_the_ssh_batch_answers_a_refused_lstat_only_where_the_op_allows_it():
    """SSH's pipelined batch: an Lstat(soft) the host refuses is that op's result; a plain
    Lstat's refusal is still the batch's error (raised once every answer is read)."""

    from orchestrator.remote.ssh import _first_answers
    from orchestrator.remote.transport import FsResult, Lstat

    class Sftp:
        def _read_response(self, num: int) -> object:
            raise PermissionError(13, "Permission denied")

    sftp: Any = Sftp()  # only the request layer _first_answers reads
    out: list[FsResult] = [None]
    assert _first_answers(sftp, [Lstat("/dev/shm/pairctl-1000/t", soft=True)], [1], out) == {}
    assert isinstance(out[0], PermissionError)
    with pytest.raises(PermissionError):
        _first_answers(sftp, [Lstat("/x")], [1], [None])


def test_a_service_user_in_the_runtime_dir_is_named_as_why_its_log_is_empty():
    """With a service user, llama-server (after setpriv) cannot enter the root-only 0700 runtime
    dir: its --log-file there stays empty. The readers of that log say so (one line: host, path,
    fix), read from the supervisor's own argv; run/ (the normal path) reads nothing at all."""
    from typing import cast

    from orchestrator.remote.transport import Transport

    rt = "/run/pairctl-0/tag"
    sup = b"sh\0/r/run/pairctl-svc\0supervise\0/r\0llama-server\0sup.backoff=1\0sup.user=pairctl\0/r/bin/llama-server\0"
    files = {f"{rt}/llama-server.sup.pid": b"77\n", "/proc/77/cmdline": sup}

    class Host:
        def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
            if path not in files:
                raise FileNotFoundError(2, "No such file", path)
            return files[path]

    t = cast(Transport, Host())
    assert probes.log_unwritable(t, "h1", "/r", rt, "llama-server") == (
        f"h1: llama-server runs from the runtime dir {rt} (/r/run is read-only) as service user pairctl, "
        "which cannot write its log there: make /r/run writable and restart llama-server"
    )
    assert probes.log_unwritable(t, "h1", "/r", "/r/run", "llama-server") is None
    files["/proc/77/cmdline"] = sup.replace(b"sup.user=pairctl\0", b"")  # as the login user: it writes its log
    assert probes.log_unwritable(t, "h1", "/r", rt, "llama-server") is None
    assert probes.sup_user(b"sh\0x\0supervise\0/r\0ggml-rpc-server\0sup.user=u\0p\0", "llama-server") is None
    assert probes.sup_user(b"/r/bin/llama-server\0--log-file\0x\0", "llama-server") is None
    del files[f"{rt}/llama-server.sup.pid"]
    assert probes.log_unwritable(t, "h1", "/r", rt, "llama-server") is None


def test_the_lingering_answer_is_read_once_per_transport():
    """service_dir as non-root read /etc/passwd and the linger file on every call (the telemetry
    sampler asks each second): the answer is kept per transport, and goes with it."""
    from typing import cast

    from orchestrator.remote.transport import Transport

    class Counting(_StrangersShm):
        reads = 0

        def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
            Counting.reads += path == "/etc/passwd"
            return super().read_bytes(path, max_bytes)

    t = Counting("/r")
    for _ in range(3):
        assert probes.service_dir(cast(Transport, t), "/r", "llama-server") == "/r/run"
    assert Counting.reads == 1 and id(t) in probes._LINGERS
    key = id(t)
    del t
    assert key not in probes._LINGERS


def test_the_sampler_resolves_each_service_folder_once(monkeypatch):
    """Telemetry samples every host each second: the service's folder is resolved once per run."""
    from types import SimpleNamespace

    from orchestrator.checks import telemetry

    asked: list[str] = []

    def service_dir(t: object, root: str, name: str) -> str:
        asked.append(name)
        return f"{root}/run"

    ran: list[tuple[str, ...]] = []

    class Host:
        def run(self, cmd: Any, check: bool = False, timeout: float = 0) -> Any:
            ran.append(cmd.argv)
            return SimpleNamespace(stdout="")

    monkeypatch.setattr(telemetry, "service_dir", service_dir)
    s = telemetry.Sampler(transports={"native": Host()}, roots={"native": "/r"}, hosts={"native": "h"})
    for _ in range(3):
        s.sample_once()
    assert asked == ["llama-server"] and len(ran) == 3 and ran[0][-1] == "/r/run/llama-server.pid"
