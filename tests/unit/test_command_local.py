"""Arguments reach the program unchanged through LocalTransport: directly (exec of argv) and
through a POSIX shell given `Cmd.render()` (what sshd does with the line on a remote host).

A control test shows the comparison does catch mangling: naive space-joining breaks it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.remote.command import Cmd
from orchestrator.remote.local import LocalTransport

HOSTILE = [
    "",
    " ",
    "a b",
    "it's",
    '"dq"',
    "x;echo pwned",
    "$(id)",
    "`id`",
    "$HOME",
    "${PATH}",
    "*",
    "?",
    "[a-z]*",
    "~",
    "a\nb",
    "\t",
    "\\",
    "-n",
    "--",
    "é✓中文",
    "'\"'\"'",
    "!",
    "#comment",
    "&&",
    "|",
    ">out",
    "<in",
]

ARG = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24),
)
ARGS = st.lists(ARG, min_size=1, max_size=8)


def printf_args(t: LocalTransport, args: list[str], *, via_shell: bool) -> list[str]:
    cmd = Cmd.of("printf", "%s\\0", *args)
    if via_shell:
        cmd = Cmd.of("sh", "-c", cmd.render())
    out = t.run(cmd).stdout_bytes
    assert out.endswith(b"\0")
    return [a.decode("utf-8") for a in out[:-1].split(b"\0")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ARGS)
def test_args_unchanged_via_exec(args: list[str]) -> None:
    assert printf_args(LocalTransport("local"), args, via_shell=False) == args


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ARGS)
def test_args_unchanged_via_rendered_shell_line(args: list[str]) -> None:
    assert printf_args(LocalTransport("local"), args, via_shell=True) == args


def test_control_naive_join_is_caught() -> None:
    """The same comparison fails for a line built by joining with spaces (no quoting)."""
    t = LocalTransport("local")
    args = ["a b", "$(echo pwned)"]
    naive = "printf '%s\\0' " + " ".join(args)
    out = t.run(Cmd.of("sh", "-c", naive)).stdout_bytes
    assert [a.decode() for a in out[:-1].split(b"\0")] != args


def test_stdin_bytes_exact_and_status(tmp_path) -> None:
    t = LocalTransport("local")
    blob = bytes(range(256)) * 1000
    r = t.run(Cmd.of("cat"), stdin=blob)
    assert r.stdout_bytes == blob and r.exit_status == 0
    r = t.run(Cmd.of("sh", "-c", "echo out; echo err >&2; exit 7"), check=False)
    assert (r.exit_status, r.stdout, r.stderr) == (7, "out\n", "err\n")
    r = t.run(Cmd.of("/nonexistent/prog"), check=False)
    assert r.exit_status == 127
    r = t.run(Cmd.of("pwd", cwd=str(tmp_path)))
    assert r.stdout.strip() == str(tmp_path)
    r = t.run(Cmd.of("printenv", "PAIRCTL_X", env={"PAIRCTL_X": "a b;c"}))
    assert r.stdout == "a b;c\n"


def test_local_timeout_and_check() -> None:
    from orchestrator.errors import RemoteCommandError
    from orchestrator.remote.result import CommandTimeout

    t = LocalTransport("local")
    with pytest.raises(CommandTimeout, match="timed out on local after 0.3 s: sleep 5"):
        t.run(Cmd.of("sleep", "5"), timeout=0.3)
    with pytest.raises(RemoteCommandError, match=r"exit status 1\): false"):
        t.run(Cmd.of("false"))


def test_a_timed_out_command_is_killed_with_its_process_group(tmp_path) -> None:
    """Issue 33 item 4: a step that timed out must not act later. Its children (not started
    under setsid) die with it, a stopped one too, before `run` returns."""
    import time

    from orchestrator.remote.result import CommandTimeout

    late, paused = tmp_path / "late", tmp_path / "paused"
    t = LocalTransport("local")
    with pytest.raises(CommandTimeout) as ei:
        t.run(Cmd.of("sh", "-c", 'sleep 1.5 && touch "$1" & wait', "_", str(late)), timeout=0.3)
    assert "killed on the host" in (ei.value.hint or "")
    with pytest.raises(CommandTimeout):
        t.run(Cmd.of("sh", "-c", 'kill -STOP $$; touch "$1"', "_", str(paused)), timeout=0.3)
    time.sleep(2.0)
    assert not late.exists() and not paused.exists()
