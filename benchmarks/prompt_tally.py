"""Prompt tokens each acceptance check makes llama-server process (issue 42: the 4x-context suite
processed 5.3x what its two slots hold). A pytest plugin, `-p benchmarks.prompt_tally`, for the
lab's e2e runs: around every check of every suite run it reads the server's own counter
`llamacpp:prompt_tokens_total` (/metrics: tokens evaluated, cache hits not counted) and appends
one JSON line per check to $PROMPT_TALLY (`speed`: the probe that sizes the bounds, first in
every suite run). rpc_consistency's native-only probe server is another process: not counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from orchestrator.checks import suite

COUNTER = "prompt_tokens_total"  # parse_metrics keeps the llamacpp: prefix off


def _count(ctx: Any) -> float:
    try:
        return float(ctx.client.metrics().get(COUNTER, 0.0))
    except Exception:  # a stopped server: the check's own result says so
        return float("nan")


def _counted(name: str, ctx: Any, run: Callable[[], Any]) -> Any:
    before = _count(ctx)
    try:
        return run()
    finally:
        n = _count(ctx) - before
        row = {"profile": ctx.profile.name, "check": name, "prompt_tokens": int(n) if n == n else None}
        with open(os.environ.get("PROMPT_TALLY", "prompt-tally.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


_guarded, _measure = suite._guarded, suite.measure_budget


def _guarded_counted(name: str, fn: Any) -> Any:
    return _counted(name, fn.args[0], lambda: _guarded(name, fn))


def _measure_counted(ctx: Any) -> Any:  # the first of every suite run: `speed` starts a run's lines
    return _counted("speed", ctx, lambda: _measure(ctx))


suite._guarded, suite.measure_budget = _guarded_counted, _measure_counted
