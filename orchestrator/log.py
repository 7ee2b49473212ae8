"""structlog, configured once at start-up: console lines for people, JSON lines to a file.

Modules never configure logging and keep no logger globals with state; commands bind
`host`, `pair`, `lease`, `step` on a logger and pass it down.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import structlog
from structlog.typing import EventDict, Processor

# The key's last word names a secret (`api_key`, `token`), not `n_tokens` or `tokens_predicted`.
_SECRET_KEYS = re.compile(r"(^|[_-])(api[_-]?key|token|secret|password|passphrase|nonce)$", re.I)


def mask_secrets(_logger: Any, _name: str, event: EventDict) -> EventDict:
    """Never let a value under a secret-looking key reach a log line."""
    for key in list(event):
        if _SECRET_KEYS.search(key) and event[key] is not None:
            event[key] = "***"
    return event


def drop_tracebacks(_logger: Any, _name: str, event: EventDict) -> EventDict:
    """Console only: a traceback (with its locals, which may hold secrets) never reaches a
    person's terminal; the JSON log file keeps it."""
    for key in ("exc_info", "exception", "stack"):
        event.pop(key, None)
    return event


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
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(level)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                drop_tracebacks,
                structlog.processors.JSONRenderer() if json_console else structlog.dev.ConsoleRenderer(colors=False),
            ],
            foreign_pre_chain=shared,
        )
    )
    root.addHandler(console)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.dict_tracebacks,
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
    return structlog.get_logger("pairctl").bind(**bind)
