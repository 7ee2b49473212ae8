"""What a command returned, and the one place a failed command becomes an error."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.errors import RemoteCommandError
from orchestrator.remote.command import Cmd, mask_text

TAIL_CHARS = 2000


@dataclass(frozen=True)
class Result:
    """Exit status, decoded output (`stdout_bytes`: the exact bytes) and wall time."""

    exit_status: int
    stdout: str
    stderr: str
    duration_s: float
    stdout_bytes: bytes = field(default=b"", repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class CommandTimeout(RemoteCommandError):
    """The command did not finish within its timeout (it may still run on the host)."""


def as_text(out: str | bytes) -> str:
    """A command's output or a file read over SFTP as text (UTF-8, undecodable bytes replaced)."""
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else out


def tail(text: str, n: int = TAIL_CHARS) -> str:
    text = text.rstrip()
    return text if len(text) <= n else "..." + text[-n:]


def command_failed(host: str, cmd: Cmd, result: Result) -> RemoteCommandError:
    """The error for a nonzero exit: masked command, host, status and stderr tail."""
    secrets = cmd.secrets()
    err = mask_text(tail(result.stderr), secrets)
    out = mask_text(tail(result.stdout), secrets)
    msg = f"command failed on {host} (exit status {result.exit_status}): {cmd.display()}"
    if err:
        msg += f"\nstderr: {err}"
    elif out:
        msg += f"\nstdout: {out}"
    return RemoteCommandError(
        msg,
        exit_status=result.exit_status,
        stdout=mask_text(result.stdout, secrets),
        stderr=mask_text(result.stderr, secrets),
    )


def command_timed_out(
    host: str, cmd: Cmd, timeout: float, stdout: str = "", stderr: str = "", *, killed_on_host: bool | None = False
) -> CommandTimeout:
    """`killed_on_host`: True, the host's own bound killed its process group (ssh.host_bounded);
    None, the host did not answer past that bound either (its `timeout` kills it there); False,
    nothing on the host bounds it."""
    secrets = cmd.secrets()
    msg = f"command timed out on {host} after {timeout:g} s: {cmd.display()}"
    if killed_on_host:
        msg += "; it was killed there (its process group)"
    err = mask_text(tail(stderr), secrets)
    if err:
        msg += f"\nstderr so far: {err}"
    return CommandTimeout(
        msg,
        exit_status=-1,
        stdout=mask_text(stdout, secrets),
        stderr=mask_text(stderr, secrets),
        hint={
            True: "it was killed on the host at that bound (its process group)",
            None: "the host did not answer after that bound either; its own `timeout` kills the command there",
            False: "the command may still be running on the host",
        }[killed_on_host],
    )
