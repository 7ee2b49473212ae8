"""One root exception; each subclass carries the exit code the CLI maps it to.

Like pyinfra, subclasses also inherit the builtin they resemble, so callers can catch
either. Messages are written for an operator: what went wrong, where, and what to do.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """pairctl's documented exit codes (docs/reference/exit-codes.md, `pairctl --help`)."""

    OK = 0
    FAILURE = 1  # a check, gate or verification failed; the run completed and says why
    USAGE = 2  # bad command line (typer/click's own code)
    CONFIG = 3  # a manifest, inventory, profile, plan or playbook is invalid
    HOST = 4  # a host could not be reached, or its key is unknown or changed
    LEASED = 5  # a host is leased by someone else
    BUILD = 6  # a build or package problem (dirty tree, toolchain, hash mismatch)
    ROLLED_BACK = 7  # the run failed after activation began; previous pair restored and verified
    ROLLBACK_FAILED = 8  # rollback failed: hosts left stopped, leases kept, see the message
    INCONCLUSIVE = 9  # not enough valid data to decide (qualification)
    EVIDENCE = 10  # a receipt or chain does not verify
    SKIPPED = 11  # a scheduled run found nothing to do (e.g. leased)
    INTERRUPTED = 130


class PairctlError(Exception):
    """Root of every error pairctl reports to a user (never a traceback)."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class UsageError(PairctlError, ValueError):
    """A bad command line that pairctl itself judges (click judges the rest): exit 2."""

    exit_code = ExitCode.USAGE


class ConfigError(PairctlError, ValueError):
    exit_code = ExitCode.CONFIG


class HostError(PairctlError, ConnectionError):
    exit_code = ExitCode.HOST
    # The host refused a write for its permissions or a read-only filesystem, as remote/ssh.py
    # host_file_error reads the host's own answer (never a path's spelling); an SFTP server's bare
    # "Failure" counts, though it may also mean a full disk, so a caller quotes it.
    write_refused: bool = False


class DiskFull(HostError):
    """A host's disk could not take a write ("no space left on HOST:PATH"). Exit 6, the host's
    state, not 4: the host answered, and reaching it again would not help."""

    exit_code = ExitCode.BUILD


class HostKeyError(HostError):
    """Unknown or changed host key: stop before any change on any host."""


class RemoteCommandError(HostError):
    """A remote command returned a nonzero exit status where success was required."""

    def __init__(self, message: str, *, exit_status: int, stdout: str = "", stderr: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.stdout = stdout
        self.stderr = stderr


class LeaseHeldError(PairctlError, RuntimeError):
    exit_code = ExitCode.LEASED


class LeaseError(PairctlError, RuntimeError):
    exit_code = ExitCode.FAILURE


class LeaseLost(LeaseError):
    """The lease this run holds is gone, changed hands, or is about to expire: nothing more may
    change on the host (the run stops before its next change). Exit 5: the host is someone else's."""

    exit_code = ExitCode.LEASED
    nothing_changed = True  # raised by the re-check before a change, never after one


class BuildError(PairctlError, RuntimeError):
    exit_code = ExitCode.BUILD


class PackageError(BuildError):
    """A package is missing, mismatched, or fails verification."""


class HostStateError(PackageError):
    """What pairctl keeps on a host is damaged or disagrees between the hosts: refused before any
    change (exit 6), naming host, path and the command that repairs it."""


class CheckFailed(PairctlError, AssertionError):
    exit_code = ExitCode.FAILURE


class RolledBack(PairctlError, RuntimeError):
    exit_code = ExitCode.ROLLED_BACK


class RollbackFailed(PairctlError, RuntimeError):
    exit_code = ExitCode.ROLLBACK_FAILED


class Inconclusive(PairctlError, RuntimeError):
    exit_code = ExitCode.INCONCLUSIVE


class EvidenceError(PairctlError, RuntimeError):
    exit_code = ExitCode.EVIDENCE


class Skipped(PairctlError, RuntimeError):
    exit_code = ExitCode.SKIPPED


class Interrupted(PairctlError, RuntimeError):
    """A signal (SIGTERM, SIGINT, SIGHUP) stopped the run at a bounded point (orchestrator/interrupt.py)."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self, message: str, *, signal_name: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.signal_name = signal_name
