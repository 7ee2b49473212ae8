"""structlog, configured once at start-up: console lines for people, JSON lines to a file.

Modules never configure logging and keep no logger globals with state; commands bind
`host`, `pair`, `lease`, `step` on a logger and pass it down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import structlog
from structlog.typing import EventDict, Processor

from orchestrator.errors import ConfigError
from orchestrator.evidence.masking import MASK, is_secret_key, mask_data
from orchestrator.terminal import before_output, visible

# The key's last word names a secret (`api_key`, `token`), not `n_tokens` or `tokens_predicted`.
_SECRET_KEYS = re.compile(r"(^|[_-])(api[_-]?key|token|secret|password|passphrase|nonce)$", re.I)
# Raw exception objects: structlog renders them later (without frame locals, see configure).
_RAW = ("exc_info", "stack")


def mask_secrets(_logger: Any, _name: str, event: EventDict) -> EventDict:
    """Never let a secret reach a log line: secret-looking keys at any depth, secret flags in
    argv-like lists, bearer tokens and URL passwords inside strings (evidence/masking.py)."""
    for key in list(event):
        if key in _RAW:
            continue
        value = event[key]
        if (_SECRET_KEYS.search(key) or is_secret_key(key)) and value is not None:
            event[key] = MASK
        else:
            event[key] = mask_data(value)
    return event


# File log: tracebacks as data, never with frame locals (a local can be a header holding the key).
_file_tracebacks = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


# The JSON log rotates when a command starts and finds it past this size (about 10 KB per deploy
# at info level: some 1,600 deploys a file); the newest LOG_KEEP rotated files are kept (.1 newest).
LOG_MAX_BYTES = 16 << 20
LOG_KEEP = 3


def rotate_if_large(path: Path, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> bool:
    """Shift `path` to `path.1` (and on, `keep` kept) when past `max_bytes`, under a lock so two
    commands rotate once; a writer keeps its open file (now `.1`). True when it rotated."""
    from orchestrator.filelock import file_lock

    def large() -> bool:
        try:
            return path.stat().st_size > max_bytes
        except FileNotFoundError:
            return False

    if not large():
        return False
    with file_lock(path.with_name(f".{path.name}.rotate.lock")):
        if not large():  # another command rotated it meanwhile
            return False
        path.with_name(f"{path.name}.{keep}").unlink(missing_ok=True)
        for i in range(keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                path.with_name(f"{path.name}.{i}").rename(path.with_name(f"{path.name}.{i + 1}"))
        path.rename(path.with_name(f"{path.name}.1"))
        return True


def _private_file(path: Path) -> None:
    """Create the log file 0600 (O_EXCL-free: it is appended to across runs), and tighten an old one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def drop_tracebacks(_logger: Any, _name: str, event: EventDict) -> EventDict:
    """Console only: a traceback (its locals may hold secrets) stays in the JSON log file, off the terminal."""
    for key in ("exc_info", "exception", "stack"):
        event.pop(key, None)
    return event


def visible_strings(_logger: Any, _name: str, event: EventDict) -> EventDict:
    """Console only: a control character in a logged value is written as its escape, never sent raw."""
    return {k: visible(v) if isinstance(v, str) else v for k, v in event.items()}


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """stderr lines for people; a live progress display is cleared first (terminal.before_output)."""

    def emit(self, record: logging.LogRecord) -> None:
        before_output()
        super().emit(record)


class _LogFileHandler(logging.FileHandler):
    """The JSON log file. A write it cannot make prints one line once and drops the rest of this
    run's lines: a run's outcome never depends on its log (the receipt is the record)."""

    failed: str | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if self.failed is not None:
            return
        exc = sys.exc_info()[1]
        self.failed = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__) if exc else "unknown error"
        try:
            before_output()
            sys.stderr.write(f"pairctl: warning: cannot write the log {self.baseFilename}: {self.failed}; "
                             "its lines are dropped for the rest of this run\n")  # fmt: skip
            sys.stderr.flush()
        except Exception:  # stderr itself gone: nothing left to tell
            pass

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            if self.failed is None:
                self.handleError(logging.makeLogRecord({}))

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # buffered lines that found no room: already said once
            pass


def configure(*, log_file: Path | None, verbosity: int = 0, json_console: bool = False) -> None:
    """Console output (stderr) for people plus JSON lines appended to `log_file`."""
    level = logging.WARNING - 10 * verbosity
    level = max(logging.DEBUG, min(level, logging.WARNING))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.setLevel(logging.DEBUG)

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        mask_secrets,
    ]
    console = _ConsoleHandler(sys.stderr)
    console.setLevel(level)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                drop_tracebacks,
                visible_strings,
                structlog.processors.JSONRenderer() if json_console else structlog.dev.ConsoleRenderer(colors=False),
            ],
            foreign_pre_chain=shared,
        )
    )
    root.addHandler(console)
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            rotate_if_large(log_file)
            _private_file(log_file)
        except (NotADirectoryError, FileExistsError):
            raise ConfigError(
                f"{log_file.parent.parent}: pairctl's home must be a directory, and a file is in the way",
                hint="pass --home (or PAIRCTL_HOME) naming a directory",
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"{log_file}: cannot write pairctl's log: {exc.strerror}",
                hint="pass --home (or PAIRCTL_HOME) naming a writable directory",
            ) from None
        fh = _LogFileHandler(log_file, encoding="utf-8")
        # info: one event per step, check, outcome, rollback, refusal and interrupt (audit, alerting);
        # the debug lines of every SSH exec and HTTP request only with -v
        fh.setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
        fh.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    _file_tracebacks,
                    mask_secrets,  # again: exception messages rendered just now
                    structlog.processors.JSONRenderer(),
                ],
                foreign_pre_chain=shared,
            )
        )
        root.addHandler(fh)
    for noisy in ("paramiko", "invoke", "fabric", "httpx", "httpcore", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def get_logger(**bind: Any) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger("pairctl").bind(**bind)


def audit(event: str, **fields: Any) -> None:
    """An info event of the run's record for the JSON log; nothing where logging was never
    configured (library use, a test's child process), so it never writes to someone else's stdout."""
    if structlog.is_configured():
        get_logger().info(event, **fields)
