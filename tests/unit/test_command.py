"""Cmd rendering and masking (pure, golden)."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from orchestrator.errors import RemoteCommandError
from orchestrator.remote.command import Cmd, Secret, mask_text
from orchestrator.remote.result import Result, command_failed

GOLDEN = {
    "hostile": (
        Cmd.of("printf", "%s\\0", "a b", "it's", "x;rm -rf /", "$(id)", "`id`", "*", "new\nline", "é✓"),
        "printf '%s\\0' 'a b' 'it'\"'\"'s' 'x;rm -rf /' '$(id)' '`id`' '*' 'new\nline' 'é✓'",
    ),
    "cwd_env": (
        Cmd.of(
            "llama-server", "--port", "8080", cwd="/r/current", env={"LD_LIBRARY_PATH": "/r/current/lib", "A": "x y"}
        ),
        "env -C /r/current -- 'A=x y' LD_LIBRARY_PATH=/r/current/lib llama-server --port 8080",
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_render_golden(name: str) -> None:
    cmd, expected = GOLDEN[name]
    assert cmd.render() == expected
    # what renders is exactly what a POSIX shell splits back
    assert shlex.split(cmd.render()) == cmd.real_argv()


def test_secret_masked_everywhere_but_render() -> None:
    cmd = Cmd.of("curl", "-H", Secret("Authorization: Bearer s3cr3t"), "http://127.0.0.2:8080/props")
    assert "s3cr3t" in cmd.render()
    for shown in (cmd.display(), repr(cmd), str(cmd), " ".join(cmd.argv_display()), repr(cmd.argv)):
        assert "s3cr3t" not in shown
        assert "***" in shown
    assert repr(Secret("x")) == "Secret('***')" and str(Secret("x")) == "***"
    assert cmd.secrets() == ("Authorization: Bearer s3cr3t",)


def test_failed_command_error_masks_secret_echoed_in_stderr() -> None:
    cmd = Cmd.of("tool", "--token", Secret("hunter2"))
    res = Result(3, "", "bad token hunter2 given\n", 0.1)
    err = command_failed("lab-native", cmd, res)
    assert isinstance(err, RemoteCommandError)
    text = str(err)
    assert "hunter2" not in text and "hunter2" not in err.stderr
    assert "lab-native" in text and "exit status 3" in text and "tool --token '***'" in text
    assert "bad token *** given" in text
    assert err.exit_status == 3


def test_mask_text() -> None:
    assert mask_text("a s b s", ["s"]) == "a *** b ***"
    assert mask_text("abc", [""]) == "abc"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"argv": "ls -l"}, "not one string"),
        ({"argv": ()}, "empty"),
        ({"argv": ("ls", 3)}, "convert"),
        ({"argv": ("printf", "a\x00b")}, "NUL"),
        ({"argv": ("printf", "\ud800")}, "surrogate"),
        ({"argv": (Secret("x"), "a")}, "program name"),
        ({"argv": ("x",), "env": (("A", Secret("s")),)}, "secrets may not travel"),
        ({"argv": ("x",), "env": (("A B", "1"),)}, "variable name"),
        ({"argv": ("a=b",), "env": (("A", "1"),)}, "cannot follow env"),
        ({"argv": ("x",), "cwd": ""}, "cwd"),
    ],
)
def test_cmd_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        Cmd(**kwargs)


def test_cmd_is_frozen_and_hashable() -> None:
    a = Cmd.of("ls", "-l", env={"B": "2", "A": "1"})
    b = Cmd(argv=["ls", "-l"], env={"A": "1", "B": "2"})  # type: ignore[arg-type]
    assert a == b and hash(a) == hash(b) and a.argv == ("ls", "-l")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.argv = ("rm",)  # type: ignore[misc]


def test_open_transport_picks_local_or_ssh() -> None:
    from orchestrator.config.inventory import Inventory
    from orchestrator.remote.local import LocalTransport
    from orchestrator.remote.pool import open_transport
    from orchestrator.remote.ssh import SshTransport
    from orchestrator.remote.transport import Transport

    inv = Inventory.model_validate(
        {
            "known_hosts": "/nonexistent/known_hosts",
            "hosts": {
                "gpu": {"address": "127.0.0.1", "install_root": "/srv/p", "role": "native", "transport": "local"},
                "far": {"address": "127.0.0.9", "user": "op", "key": "/k", "install_root": "/srv/p", "role": "rpc"},
                "nokey": {"address": "127.0.0.9", "install_root": "/srv/p", "role": "rpc"},
            },
        }
    )
    local = open_transport(inv, "gpu")
    assert isinstance(local, LocalTransport) and local.name == "gpu" and isinstance(local, Transport)
    ssh = open_transport(inv, "far")  # lazy: nothing connects here
    assert isinstance(ssh, SshTransport) and not ssh.connected
    assert (ssh.target.hostname, ssh.target.port, ssh.target.user, ssh.target.key_filename) == (
        "127.0.0.9",
        22,
        "op",
        "/k",
    )
    assert ssh.target.known_hosts == ("/nonexistent/known_hosts",)
    assert not ssh.target.allow_agent and not ssh.target.look_for_keys
    from orchestrator.errors import ConfigError, HostError

    with pytest.raises(HostError, match="no key"):
        open_transport(inv, "nokey")
    with pytest.raises(ConfigError):
        open_transport(inv, "missing")


def test_fingerprint_matches_openssh_format() -> None:
    import base64
    import hashlib

    import paramiko

    from orchestrator.remote.known_hosts import known_hosts_name
    from orchestrator.remote.ssh import fingerprint

    key = paramiko.Ed25519Key.from_private_key  # noqa: F841  (type exists)
    blob = base64.b64decode("AAAAC3NzaC1lZDI1NTE5AAAAINdAtgoDoLT7QfYZCr0fiWlLl91q0DA5D2zMyskL3uQw")
    pk = paramiko.PKey.from_type_string("ssh-ed25519", blob)
    fp = fingerprint(pk)
    assert fp == "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert fp == pk.fingerprint  # paramiko's own OpenSSH-compatible form
    assert known_hosts_name("127.0.0.2", 2222) == "[127.0.0.2]:2222" and known_hosts_name("h", 22) == "h"


def test_never_ran_and_retry_classes_of_transport_errors():
    """A command that never started changed nothing (deploy's first change turns that into a
    refusal); only a broken channel is retried by run_idempotent, since connecting already
    retried on its own."""
    from orchestrator.remote.transport import (
        ConnectionLost,
        NotStarted,
        Unreachable,
        never_ran,
        transient_command_error,
    )

    assert never_ran(Unreachable("cannot connect")) and not transient_command_error(Unreachable("cannot connect"))
    assert never_ran(NotStarted("no channel")) and transient_command_error(NotStarted("no channel"))
    assert not never_ran(ConnectionLost("lost while running")) and transient_command_error(ConnectionLost("lost"))
