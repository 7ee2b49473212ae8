"""Run one operation over many pairs with a bound, collecting each pair's result or error. Like
fabric's `GroupResult`: one pair's failure never stops the others, and the caller decides the
exit code from the whole map (exclusivity comes from each operation's leases)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.errors import ConfigError, ExitCode, PairctlError


@dataclass
class PairOutcome:
    pair: str
    ok: bool
    value: Any = None
    error: str | None = None
    exit_code: int = 0
    duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        v = self.value.as_dict() if hasattr(self.value, "as_dict") else self.value
        head = {k: getattr(self, k) for k in ("pair", "ok", "exit_code", "error")}
        return {**head, "duration_s": round(self.duration_s, 3), "result": v}


@dataclass
class FleetResult:
    outcomes: list[PairOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def failed(self) -> list[PairOutcome]:
        return [o for o in self.outcomes if not o.ok]

    def exit_code(self) -> int:
        """0 when every pair passed; the single failure's code when all failures agree; else 1."""
        codes = {o.exit_code for o in self.failed()}
        if not codes:
            return int(ExitCode.OK)
        return codes.pop() if len(codes) == 1 else int(ExitCode.FAILURE)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "pairs": [o.as_dict() for o in self.outcomes]}


def select_pairs(inventory: Inventory, pairs: Iterable[str] | None, all_pairs: bool) -> list[str]:
    chosen = list(dict.fromkeys(pairs or []))
    if all_pairs and chosen:
        raise ConfigError("give --pair or --all, not both")
    if all_pairs:
        chosen = sorted(inventory.pairs)
    if not chosen:
        raise ConfigError("name a pair with --pair (repeatable) or use --all")
    for p in chosen:
        inventory.pair(p)  # unknown names fail before anything runs
    return chosen


def fan_out(
    pairs: list[str], fn: Callable[[str], Any], *, parallel: int = 1, ok: Callable[[Any], bool] = lambda v: True
) -> FleetResult:
    """Call fn(pair) for every pair, at most `parallel` at once; keep input order in the result."""
    if parallel < 1:
        raise ConfigError("--parallel must be at least 1")

    def one(pair: str) -> PairOutcome:
        t0 = time.monotonic()
        value: Any = None
        try:
            value = fn(pair)
            good, error = ok(value), None
            code = 0 if good else int(ExitCode.FAILURE)
        except PairctlError as exc:
            value, good, error, code = None, False, str(exc), int(exc.exit_code)
        except Exception as exc:  # one pair's bug must not hide the others' results
            value, good, error, code = None, False, f"{type(exc).__name__}: {exc}", int(ExitCode.FAILURE)
        return PairOutcome(pair, good, value=value, error=error, exit_code=code, duration_s=time.monotonic() - t0)

    if parallel == 1 or len(pairs) == 1:
        return FleetResult([one(p) for p in pairs])
    with ThreadPoolExecutor(max_workers=min(parallel, len(pairs)), thread_name_prefix="pair") as pool:
        return FleetResult(list(pool.map(one, pairs)))
