"""The package's bytecode, written once per session where Python writes none itself (issue 45).

With PYTHONDONTWRITEBYTECODE set (this machine's environment sets it) no process writes
`__pycache__`, so every Python child a test starts (the pairctl deploys of the fault matrix and of
the CLI tests, the matrix's shards) compiled again, from source, each orchestrator module it
imported: 0.2 CPU-s of the 1.0 s a deploy's imports take (farm-bench, docs/results/suite-cpu-profile.md).
The variable stops the writing only; a `.pyc` that is there is read, and ignored once its source
changes (timestamp check). So the session's first process compiles orchestrator/ and tests/
(compileall: only what changed since the last run, a stat per file when nothing did). Where
Python writes its own caches this does nothing.
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    if not sys.dont_write_bytecode or hasattr(config, "workerinput"):  # an xdist worker: its controller did it
        return
    for d in ("orchestrator", "tests"):
        compileall.compile_dir(REPO / d, quiet=1)
