"""The host helper (orchestrator/hosts/pairctl-svc.sh) run for real on this machine with real
processes, its output parsed by the same parsers deploy uses. No network, no SSH."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time

import pytest

from orchestrator.hashing import sha256_bytes, sha256_file
from orchestrator.hosts.layout import HostLayout, svc_script
from orchestrator.hosts.probes import parse_facts, parse_identity, parse_sha256sum


def run(cmd, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd.real_argv(), input=stdin, capture_output=True, timeout=30)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd.display()[:200]} -> {p.returncode}: {p.stderr.decode()}")
    return p


@pytest.fixture
def host(tmp_path):
    layout = HostLayout(str(tmp_path / "root dir"))  # a space in the root: arguments, not shell text
    run(layout.prepare_cmd(), stdin=svc_script())
    return layout


def _release(layout: HostLayout, pid: str, name: str = "llama-server") -> str:
    b = os.path.join(layout.release(pid), "bin")
    os.makedirs(b)
    os.symlink("/bin/sleep", os.path.join(b, name))
    return os.path.join(b, name)


def test_prepare_installs_layout_and_helper(host):
    f = parse_facts(run(host.facts_cmd()).stdout.decode())
    assert f.root_exists and f.current is None and f.svc_sha256 == sha256_bytes(svc_script())
    assert oct(os.stat(host.secrets).st_mode & 0o777) == "0o700"


def test_start_identity_stop_with_pidfile(host):
    exe = _release(host, "pkg-a")
    run(host.switch_cmd("pkg-a", None))
    out = run(host.start_cmd("llama-server", [exe, "30", "1s"])).stdout.decode()
    assert out.startswith("pid=")
    time.sleep(0.05)
    again = run(host.start_cmd("llama-server", [exe, "30"]), check=False)
    assert again.returncode == 3 and b"already runs" in again.stderr
    ident = parse_identity(run(host.identity_cmd("llama-server", "ggml-rpc-server")).stdout.decode())
    assert ident["llama-server"].argv == (exe, "30", "1s")
    assert ident["llama-server"].exe_sha256 == sha256_file("/bin/sleep")
    assert not ident["ggml-rpc-server"].running
    assert parse_facts(run(host.facts_cmd()).stdout.decode()).running == {"llama-server": ident["llama-server"].pid}
    stopped = run(host.stop_cmd("llama-server")).stdout.decode()
    assert stopped.startswith("stopped=llama-server:") and not stopped.strip().endswith(":-")
    assert not os.path.exists(f"/proc/{ident['llama-server'].pid}/cmdline") or \
        open(f"/proc/{ident['llama-server'].pid}/stat").read().split(") ")[1][0] == "Z"
    assert run(host.stop_cmd("llama-server")).stdout.decode().strip() == "stopped=llama-server:-"


def test_stop_leaves_a_foreign_pid_alone(host):
    p = subprocess.Popen(["sleep", "30"])
    try:
        with open(os.path.join(host.run, "llama-server.pid"), "w") as f:
            f.write(str(p.pid))
        assert run(host.stop_cmd("llama-server")).stdout.decode().strip() == "stopped=llama-server:-"
        assert p.poll() is None  # argv[0] is not .../llama-server: not ours, not signalled
    finally:
        p.kill()
        p.wait()


def test_wait_listen_reports_a_dead_process(host):
    exe = _release(host, "pkg-a", "ggml-rpc-server")
    run(host.start_cmd("ggml-rpc-server", [exe, "0"]))  # exits at once, like a failed bind
    time.sleep(0.1)
    r = run(host.wait_listen_cmd("ggml-rpc-server", "127.0.0.1", 1, 5), check=False)
    assert r.returncode == 4 and r.stdout.decode().startswith("died=")


def test_switch_renames_links_and_refuses_missing_release(host):
    _release(host, "a")
    _release(host, "b")
    run(host.switch_cmd("a", None))
    run(host.switch_cmd("b", "a"))
    f = parse_facts(run(host.facts_cmd()).stdout.decode())
    assert (f.current, f.previous, f.releases) == ("b", "a", ("a", "b"))
    assert run(host.switch_cmd("nope", "a"), check=False).returncode == 3
    assert parse_facts(run(host.facts_cmd()).stdout.decode()).current == "b"


def test_cas_write_refuses_a_stale_token_and_reads_back(host):
    first = run(host.cas_write_cmd(None), stdin=b'{"revision":1}\n').stdout
    assert first == b'{"revision":1}\n'
    stale = run(host.cas_write_cmd(None), stdin=b'{"revision":2}\n', check=False)
    assert stale.returncode == 3 and stale.stdout.decode().startswith("have=")
    ok = run(host.cas_write_cmd(sha256_bytes(first)), stdin=b'{"revision":2}\n')
    assert ok.stdout == b'{"revision":2}\n'
    assert parse_facts(run(host.facts_cmd()).stdout.decode()).route_bytes == b'{"revision":2}\n'


def test_unpack_hash_commit(host, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"payload"
        info = tarfile.TarInfo("bin/llama-server")
        info.size, info.mode = len(data), 0o755
        t.addfile(info, io.BytesIO(data))
    run(host.unpack_cmd(".p1.tmp-abcd"), stdin=buf.getvalue())
    got = parse_sha256sum(run(host.hash_cmd(".p1.tmp-abcd")).stdout.decode())
    assert got == {"bin/llama-server": sha256_bytes(b"payload")}
    assert run(host.unpack_cmd("p1"), check=False).returncode == 2  # only temporary names
    run(host.commit_cmd(".p1.tmp-abcd", "p1"))
    assert parse_facts(run(host.facts_cmd()).stdout.decode()).releases == ("p1",)
    assert run(host.commit_cmd(".p1.tmp-abcd", "p1"), check=False).returncode == 3


def test_put_secret_mode_0600(host):
    run(host.put_secret_cmd(), stdin=b"k3y\n")
    st = os.stat(host.api_key)
    assert oct(st.st_mode & 0o777) == "0o600"
    with open(host.api_key, "rb") as f:
        assert f.read() == b"k3y\n"
