"""What every acceptance check shares: its result model, the context it runs in, and sizing.

A check is a function `run(ctx) -> CheckResult`; a failed condition is a `failed` verdict, never an
exception (an unexpected one becomes an `error` verdict). Every size derives from the route profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.checks.reference import ReferenceState
from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import RouteProfile
from orchestrator.evidence.journal import Journal
from orchestrator.remote.transport import Transport
from orchestrator.server.client import ServerClient

Verdict = Literal["passed", "failed", "error", "skipped"]


class CheckResult(BaseModel):
    """One check's outcome as written into the receipt: verdict, key figures and raw data."""

    model_config = ConfigDict(extra="forbid")

    name: str
    verdict: Verdict
    required: bool = True
    message: str = ""
    figures: dict[str, Any] = Field(default_factory=dict, description="key numbers for the table")
    raw: dict[str, Any] = Field(default_factory=dict, description="the server's own answers, for the receipt")
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when this result does not block acceptance."""
        return self.verdict == "passed" or (not self.required and self.verdict in ("skipped", "failed", "error"))


def verdict_of(problems: list[str]) -> Verdict:
    return "failed" if problems else "passed"


def judged(
    name: str,
    problems: list[str],
    ok: str,
    timer: Timer,
    *,
    figures: dict[str, Any],
    raw: dict[str, Any],
    failed: str | None = None,
) -> CheckResult:
    """`failed` with the problems (or `failed`, which names them) as its message, else `passed` with `ok`."""
    message = (failed if failed is not None else "; ".join(problems)) if problems else ok
    return result(name, verdict_of(problems), message or ok, timer, figures=figures, raw=raw)


def result(
    name: str,
    verdict: Verdict,
    message: str,
    timer: Timer | None = None,
    *,
    figures: dict[str, Any] | None = None,
    raw: dict[str, Any] | None = None,
    required: bool | None = None,
) -> CheckResult:
    """A check's result timed by `timer`; a skipped one never blocks acceptance unless `required` says so."""
    return CheckResult(
        name=name,
        verdict=verdict,
        message=message,
        duration_s=timer.elapsed() if timer else 0.0,
        figures=figures or {},
        raw=raw or {},
        required=verdict != "skipped" if required is None else required,
    )


@dataclass(frozen=True)
class CheckOptions:
    """Knobs with defaults that fit both the lab and the production pair."""

    isolation: Literal["solo", "recall"] = "solo"  # tiny random models cannot recall a nonce
    generation_fraction: float = 0.125  # near-full lanes: share of the target that is generated
    cancel_after_tokens: int = 8
    cancel_idle_bound_s: float = 2.0  # the server's own test waits 2 s
    speculative_n_predict: int = 64
    continuation_fraction: float = 0.25  # cached continuation: first prompt as share of the slot
    long_prefix_fraction: float = 0.75  # long-prefix: prompt as share of the lane's budget
    long_prefix_shared: float = 0.75  # share of that prompt the second request shares
    long_prefix_generate: int = 64
    request_timeout_s: float = 1800.0  # replaced by the measured budget when measure_speed is on
    measure_speed: bool = True  # probe this pair's speed first and bound requests by it (checks/budget.py)
    slots_poll_interval_s: float = 0.02
    telemetry_interval_s: float = 1.0
    telemetry_sample_timeout_s: float = 10.0
    seed: int = 20260421


@dataclass(frozen=True)
class IdentitySnapshot:
    """What deploy's `verify_identity` saw: the facts compared across the suite and its problems."""

    data: Mapping[str, Any]
    problems: tuple[str, ...] = ()


@dataclass
class CheckContext:
    """Everything a check may use. Built once per `accept` (or by deploy's acceptance step)."""

    client: ServerClient
    profile: RouteProfile
    pair: str
    inventory: Inventory | None = None
    transports: Mapping[str, Transport] = field(default_factory=dict)  # role ("native"/"rpc") -> its host
    sampler_transports: Mapping[str, Transport] | None = None  # separate connections for telemetry (else `transports`)
    host_roots: Mapping[str, str] = field(default_factory=dict)  # role -> install_root on that host
    host_names: Mapping[str, str] = field(default_factory=dict)  # role -> inventory host name
    packages: Mapping[str, Any] = field(default_factory=dict)  # role -> PackageManifest (active)
    journal: Journal | None = None
    api_key: Any = None
    identity_probe: Callable[[], IdentitySnapshot] | None = None
    baseline: BaselineRef | None = None  # answer fixtures are compared against this
    weights_sha256: Mapping[str, str] = field(default_factory=dict)  # model name -> sha256, from the active route entry
    fixtures: Any = None  # orchestrator.checks.fixtures.FixtureSet | None (None: the default set)
    reference: ReferenceState | None = None  # the route's reference pair and its answers (checks.reference)
    oracle_fixtures: str | None = None  # reference fixture set name or path (None: oracle-lab)
    options: CheckOptions = field(default_factory=CheckOptions)
    n_ctx_train: int | None = None
    logger: Any = None
    # told the measured request budget before the checks run (deploy renews its lease by it)
    on_budget: Callable[[Any], None] | None = None
    stall_s: float = 30.0  # how long an idle wait between checks may last (the measured stall bound)
    # set by run_suite when no check is left out: only such a run may record reference answers
    whole_suite: bool = False
    budget: dict[str, Any] = field(default_factory=dict)  # the measured request budget, once probed
    # two_lane_near_full's solo run of lane 0 (a near_full.LaneOutcome): one_lane_near_full judges it
    solo_near_full: Any = None
    # the batch-variance tolerance (a parting.Tolerance), measured once by the first check that needs it
    batch_tolerance: Any = None

    def per_slot(self) -> int:
        return self.profile.per_slot_ctx(self.n_ctx_train)

    def near_full(self) -> int:
        return self.profile.near_full_tokens(self.n_ctx_train)

    def drafting(self) -> bool:
        return self.profile.draft is not None and self.profile.draft.n_max > 0

    def log(self, event: str, **kw: Any) -> None:
        if self.logger is not None:
            self.logger.info(event, **kw)


@dataclass(frozen=True)
class BaselineRef:
    """Results of an earlier accept run this one is compared against (answer fixtures)."""

    receipt: str | None  # hash of the receipt these came from, None when given directly
    checks: Mapping[str, Mapping[str, Any]]  # check name -> its `raw` dict in that receipt

    def raw(self, check: str) -> Mapping[str, Any] | None:
        return self.checks.get(check)


def lane_split(target: int, fraction: float, *, min_generate: int = 16) -> tuple[int, int]:
    """(prompt tokens, generated tokens) that sum to `target`; generation is `fraction` of it."""
    if target < 2 * min_generate:
        raise ValueError(f"a lane of {target} tokens is too small to split")
    gen = max(min_generate, int(round(target * fraction)))
    return target - gen, gen


class Timer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 4)
