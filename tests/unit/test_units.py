"""systemd units for a pair: rendered (pure) and checked by the real `systemd-analyze verify`
(the lab has no systemd as PID 1, so units are verified, never started, here)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from orchestrator.config.inventory import Supervision
from orchestrator.errors import ConfigError
from orchestrator.hosts.units import exec_quote, render_pair_units, verify_units

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
    return (
        native,
        rpc,
        render_pair_units(
            pair="lab",
            native_argv=native,
            rpc_argv=rpc,
            native_root=root,
            rpc_root=root,
            same_host=same_host,
            supervision=s,
        ),
    )


def _exec_argv(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    # systemd's quoting of these words is the shell's double quotes, with $$ and %% for $ and %
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(line.removeprefix("ExecStart="))]


@needs_analyze
def test_units_verify_and_carry_the_exact_argv(tmp_path):
    native, rpc, units = _pair(tmp_path, same_host=True)
    files = {**units["rpc"], **units["native"]}
    assert verify_units(files) == []
    n, r = units["native"]["pairctl-lab-llama-server.service"], units["rpc"]["pairctl-lab-ggml-rpc-server.service"]
    assert _exec_argv(n) == native and _exec_argv(r) == rpc
    for text in (n, r):
        assert "Restart=on-failure" in text and "StartLimitBurst=4" in text and "StartLimitIntervalSec=20" in text
        assert "Environment=PATH=/usr/local/bin:/usr/bin:/bin" in text
    # sharing a host: llama-server after its RPC peer, and restarted with it
    assert "After=pairctl-lab-ggml-rpc-server.service" in n and "BindsTo=pairctl-lab-ggml-rpc-server.service" in n
    assert "BindsTo" not in r


@needs_analyze
def test_units_on_two_hosts_have_no_cross_host_ordering(tmp_path):
    _, _, units = _pair(tmp_path, same_host=False)
    n = units["native"]["pairctl-lab-llama-server.service"]
    assert "BindsTo" not in n and verify_units(units["native"]) == []


@needs_analyze
def test_verify_fails_on_a_broken_unit(tmp_path):
    native, _, units = _pair(tmp_path, same_host=False)
    os.remove(native[0])  # the release's binary is gone
    problems = verify_units(units["native"])
    assert problems and any("not executable" in p for p in problems)
    bad = {"pairctl-lab-x.service": "[Service]\nExecStart=/bin/true\nRestart=sometimes\n"}
    assert verify_units(bad)


def test_control_characters_are_refused():
    with pytest.raises(ConfigError, match="control character"):
        exec_quote("a\nExecStartPre=/bin/sh -c id")
    assert exec_quote('a"b$c%d\\e') == '"a\\"b$$c%%d\\\\e"'
