"""systemd units for a pair's supervisors: rendered (pure), checked by the real `systemd-analyze
verify`, and read back (pure parser of what pairctl-svc prints). Starting them under a real
systemd user manager: tests/e2e/test_systemd.py."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from orchestrator.config.inventory import Supervision
from orchestrator.errors import ConfigError, HostError
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts.units import (
    check_readback,
    exec_quote,
    parse_readback,
    render_unit,
    root_tag,
    supervise_argv,
    unit_name,
    verify_units,
)

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def _pair(tmp_path: Path, *, same_host: bool, arg: str = "--port"):
    bins = {}
    for name in ("llama-server", "ggml-rpc-server"):
        b = tmp_path / "root" / "releases" / "pkg-1" / "bin"
        b.mkdir(parents=True, exist_ok=True)
        shutil.copy2("/bin/true", b / name)
        bins[name] = str(b / name)
    root = str(tmp_path / "root")
    native = [bins["llama-server"], "-m", "/models/a b.gguf", arg, "8080", "--alias", '50% $HOME "q" \\x']
    rpc = [bins["ggml-rpc-server"], "-H", "127.0.0.3", "-p", "50052"]
    s = Supervision(backoff_s=0.2, backoff_max_s=2, loop_starts=4, loop_window_s=20)
    svc = f"{root}/bin/pairctl-svc"
    sup = ["sup.backoff=0.2", "sup.peer=127.0.0.3:50052"]
    return (
        supervise_argv(svc, root, "llama-server", sup, native),
        supervise_argv(svc, root, "ggml-rpc-server", [], rpc),
        _render_pair(
            native_exec=supervise_argv(svc, root, "llama-server", sup, native),
            rpc_exec=supervise_argv(svc, root, "ggml-rpc-server", [], rpc),
            root=root,
            same_host=same_host,
            supervision=s,
        ),
    )


def _render_pair(*, native_exec, rpc_exec, root, same_host, supervision):
    """role -> {unit file name: text}, as SystemdManager.stage renders each host's unit: sharing a
    host, llama-server's unit comes after (and wants) ggml-rpc-server's."""
    rpc_unit = unit_name("lab", "ggml-rpc-server", root)
    rpc_text = render_unit(
        pair="lab", service="ggml-rpc-server", exec_argv=rpc_exec, root=root, supervision=supervision
    )
    native_text = render_unit(
        pair="lab",
        service="llama-server",
        exec_argv=native_exec,
        root=root,
        supervision=supervision,
        after=rpc_unit if same_host else None,
    )
    return {"rpc": {rpc_unit: rpc_text}, "native": {unit_name("lab", "llama-server", root): native_text}}


def _exec_argv(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    # systemd's quoting of these words is the shell's double quotes, with $$ and %% for $ and %
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(line.removeprefix("ExecStart="))]


@needs_analyze
def test_units_verify_and_carry_the_exact_argv(tmp_path):
    native, rpc, units = _pair(tmp_path, same_host=True)
    files = {**units["rpc"], **units["native"]}
    assert verify_units(files) == []
    root = str(tmp_path / "root")
    n_unit, r_unit = unit_name("lab", "llama-server", root), unit_name("lab", "ggml-rpc-server", root)
    assert n_unit == f"pairctl-lab-llama-server-{root_tag(root)}.service" and len(root_tag(root)) == 8
    n, r = units["native"][n_unit], units["rpc"][r_unit]
    assert _exec_argv(n) == native and _exec_argv(r) == rpc
    assert native[:3] == ["/bin/sh", str(tmp_path / "root" / "bin" / "pairctl-svc"), "supervise"]
    assert native[-1] == '50% $HOME "q" \\x'  # the service's argv is ExecStart's tail, byte for byte
    for text in (n, r):
        assert "Restart=on-failure" in text and "StartLimitBurst=4" in text and "StartLimitIntervalSec=20" in text
        assert "Environment=PATH=/usr/local/bin:/usr/bin:/bin" in text
        assert "Environment=PAIRCTL_SVC_MANAGED=systemd" in text and "KillMode=control-group" in text
    # sharing a host: llama-server's supervisor after its RPC peer's (it also waits for the port itself)
    assert f"After={r_unit}" in n and f"Wants={r_unit}" in n
    assert "After=pairctl" not in r


@needs_analyze
def test_units_on_two_hosts_have_no_cross_host_ordering(tmp_path):
    _, _, units = _pair(tmp_path, same_host=False)
    (n,) = units["native"].values()
    assert "After=pairctl" not in n and verify_units(units["native"]) == []


@needs_analyze
def test_verify_fails_on_a_broken_unit(tmp_path):
    _, _, units = _pair(tmp_path, same_host=False)
    broken = {k: v.replace('ExecStart="/bin/sh"', 'ExecStart="/nonexistent/sh"') for k, v in units["native"].items()}
    problems = verify_units(broken)
    assert problems and any("not executable" in p or "No such file" in p for p in problems)
    bad = {"pairctl-lab-x.service": "[Service]\nExecStart=/bin/true\nRestart=sometimes\n"}
    assert verify_units(bad)


def test_control_characters_are_written_as_escapes_and_nul_is_refused():
    """A profile argument may hold a line break or an escape (a chat template): systemd reads
    `\\xNN` inside double quotes as that byte, so every such argument is written exactly and a
    rendering can never fail half-way through a deploy. NUL cannot be in any argv."""
    assert exec_quote('a"b$c%d\\e') == '"a\\"b$$c%%d\\\\e"'
    assert exec_quote("a\nExecStartPre=/bin/sh -c id\t\x1b[2J") == '"a\\x0aExecStartPre=/bin/sh -c id\\x09\\x1b[2J"'
    with pytest.raises(ConfigError, match="NUL"):
        exec_quote("a\0b")


@needs_analyze
def test_a_unit_with_control_characters_in_its_argv_verifies(tmp_path):
    _, _, units = _pair(tmp_path, same_host=False, arg="line one\nline two\t\x1b")
    assert verify_units(units["native"]) == []


UNIT = "pairctl-lab-llama-server.service"


def test_readback_parses_and_checks_what_the_host_printed():
    text = "[Service]\nExecStart=/bin/true\n"
    sha = sha256_bytes(text.encode())
    out = (
        f"pid=12\nproc=llama-server:12:x:y\nunit={UNIT}:{sha}:enabled:active:2\nunit_source=ok:none:no\nlinger=ops:no\n"
    )
    rb = check_readback("h", out, UNIT, text)
    assert (rb.enabled, rb.active, rb.restarts, rb.linger, rb.user) == ("enabled", "active", 2, False, "ops")
    assert not rb.starts_at_boot and "loginctl enable-linger ops" in str(rb.boot()["warning"])
    assert "warning" not in parse_readback(out.replace("linger=ops:no", "linger=ops:yes")).boot()  # type: ignore[union-attr]
    with pytest.raises(HostError, match="not the one pairctl rendered"):
        check_readback("h", out, UNIT, text + "# edited on the host\n")
    with pytest.raises(HostError, match="disabled and active"):
        check_readback("h", out.replace(":enabled:", ":disabled:"), UNIT, text)
    with pytest.raises(HostError, match="did not read back"):
        check_readback("h", "pid=12\n", UNIT, text)
    with pytest.raises(HostError, match="drop-in files"):
        check_readback("h", out.replace("unit_source=ok:none:no", "unit_source=ok:some:no"), UNIT, text)
    with pytest.raises(HostError, match="another file"):
        check_readback("h", out.replace("unit_source=ok:none:no", "unit_source=other:none:no"), UNIT, text)
    with pytest.raises(HostError, match="not reloaded"):
        check_readback("h", out.replace("unit_source=ok:none:no", "unit_source=ok:none:yes"), UNIT, text)
    with pytest.raises(HostError, match="not read back"):
        check_readback("h", out.replace("unit_source=ok:none:no\n", ""), UNIT, text)


@pytest.mark.parametrize(
    "line",
    [
        f"unit={UNIT}:{'a' * 63}:enabled:active:0",  # short hash
        f"unit=other.service:{'a' * 64}:enabled:active:0",  # not a pairctl unit
        f"unit={UNIT}:{'a' * 64}:enabled:active:0\x1b[2J",  # terminal escapes
        f"unit={UNIT}:{'a' * 64}:enabled:active:99999999999",  # absurd count
        f"unit={UNIT}/../x:{'a' * 64}:enabled:active:0",
    ],
)
def test_readback_from_an_untrusted_host_reads_as_absent(line):
    assert parse_readback(line) is None
