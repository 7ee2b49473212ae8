"""A remote command is data: a frozen argv, rendered with `shlex.join` only at the last moment.

An argv cannot be mis-split by a shell, and a `Secret` argument is masked in every repr, log line
and receipt while the transport still sends its real value. `cwd` and `env` become more argv
(`env -C DIR -- K=V cmd ...`). The rendered line is for a POSIX `sh -c` (csh and fish login shells
are not supported).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MASK = "***"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Secret:
    """An argument whose value must never be shown: repr, str and display all give `***` (argv
    is still visible to `ps` on the host: real credentials go through stdin or a file)."""

    value: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.value, str):
            raise TypeError("Secret value must be a str")
        _check_arg(self.value, "a secret argument")

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK


Arg = str | Secret


def _check_arg(a: str, what: str) -> None:
    if "\x00" in a:
        raise ValueError(f"{what} contains a NUL byte, which no argv can carry")
    try:
        a.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text (lone surrogate)") from None


def _real(a: Arg) -> str:
    return a.value if isinstance(a, Secret) else a


def _shown(a: Arg) -> str:
    return MASK if isinstance(a, Secret) else a


@dataclass(frozen=True)
class Cmd:
    """One program invocation: `argv`, optionally in `cwd` with extra `env` variables (sorted
    pairs, so equal commands compare and hash equal; never secrets)."""

    argv: tuple[Arg, ...]
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        argv = self.argv
        if isinstance(argv, (str, bytes)):
            raise TypeError("Cmd.argv must be a sequence of arguments, not one string (no shell lines)")
        argv = tuple(argv)
        if not argv:
            raise ValueError("Cmd.argv is empty")
        for i, a in enumerate(argv):
            if isinstance(a, Secret):
                continue
            if not isinstance(a, str):
                raise TypeError(f"Cmd.argv[{i}] is {type(a).__name__}; convert paths and numbers with str() first")
            _check_arg(a, f"Cmd.argv[{i}]")
        if isinstance(argv[0], Secret):
            raise ValueError("the program name may not be a secret")
        object.__setattr__(self, "argv", argv)

        env = self.env
        if isinstance(env, Mapping):
            env = tuple(env.items())
        env = tuple(sorted((k, v) for k, v in env))
        for k, v in env:
            if isinstance(v, Secret):
                raise ValueError(f"env {k}: secrets may not travel in the environment; pass them on stdin or in a file")
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise ValueError(f"env name {k!r} is not a valid variable name")
            if not isinstance(v, str):
                raise TypeError(f"env {k}: value must be a str")
            _check_arg(v, f"env {k}")
        if env and "=" in argv[0]:
            raise ValueError("a program name containing '=' cannot follow env assignments")
        object.__setattr__(self, "env", env)

        if self.cwd is not None:
            if not isinstance(self.cwd, str) or not self.cwd:
                raise ValueError("cwd must be a non-empty str")
            _check_arg(self.cwd, "cwd")

    @classmethod
    def of(cls, *argv: Arg, cwd: str | None = None, env: Mapping[str, str] | None = None) -> Cmd:
        return cls(argv=tuple(argv), cwd=cwd, env=tuple((env or {}).items()))

    # -- what runs --------------------------------------------------------------------------

    def full_argv(self) -> tuple[Arg, ...]:
        """The argv that actually runs, with `env -C DIR -- K=V` in front when needed."""
        if self.cwd is None and not self.env:
            return self.argv
        prefix: list[Arg] = ["env"]
        if self.cwd is not None:
            prefix += ["-C", self.cwd]
        prefix.append("--")
        prefix += [f"{k}={v}" for k, v in self.env]
        return (*prefix, *self.argv)

    def real_argv(self) -> list[str]:
        """Real values, for a transport that executes argv directly (no shell)."""
        return [_real(a) for a in self.full_argv()]

    def render(self) -> str:
        """The shell line with real values: for the transport only, never for a log."""
        return shlex.join(self.real_argv())

    # -- what people see --------------------------------------------------------------------

    def argv_display(self) -> list[str]:
        return [_shown(a) for a in self.full_argv()]

    def display(self) -> str:
        """The shell line with secrets masked: for logs, errors and receipts."""
        return shlex.join(self.argv_display())

    def secrets(self) -> tuple[str, ...]:
        """Real secret values, so output that echoes one can be masked too."""
        return tuple(a.value for a in self.argv if isinstance(a, Secret) and a.value)

    def __repr__(self) -> str:
        extra = ""
        if self.cwd is not None:
            extra += f", cwd={self.cwd!r}"
        if self.env:
            extra += f", env={dict(self.env)!r}"
        return f"Cmd({self.argv_display_core()!r}{extra})"

    def argv_display_core(self) -> list[str]:
        return [_shown(a) for a in self.argv]

    def __str__(self) -> str:
        return self.display()


def mask_text(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret value inside `text` (e.g. a stderr tail that echoed one)."""
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    return text
