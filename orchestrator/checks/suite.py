"""The acceptance suite: identity first and last, telemetry around, the checks in between.

`run_suite` is what `pairctl accept` and deploy's acceptance step call. Every check's result
becomes one journal step `check:<name>`; the suite summary is the receipt field `acceptance`.
`SuiteResult.passed` is True only if every required check passed; the caller decides what that means.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from pydantic import BaseModel, Field

from orchestrator import faults, interrupt, progress
from orchestrator.checks import (
    answer_fixtures,
    budget,
    cached_continuation,
    cancellation,
    contract,
    exactly_full,
    identity,
    long_prefix,
    near_full,
    reference,
    reference_logprobs,
    rpc_consistency,
    sampling,
    speculative,
    telemetry,
)
from orchestrator.checks.base import CheckContext, CheckResult, result
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.errors import ConfigError

CheckFn = Callable[[CheckContext], CheckResult]

# Run order. identity and telemetry wrap the others and are handled by the suite itself.
CHECKS: dict[str, CheckFn | None] = {
    identity.NAME: None,
    near_full.TWO_LANE: near_full.run_two_lane,
    near_full.ONE_LANE: near_full.run_one_lane,
    exactly_full.NAME: exactly_full.run,
    speculative.NAME: speculative.run,
    sampling.NAME: sampling.run,
    contract.NAME: contract.run,
    cached_continuation.NAME: cached_continuation.run,
    cancellation.NAME: cancellation.run,
    long_prefix.NAME: long_prefix.run,
    answer_fixtures.NAME: answer_fixtures.run,
    reference_logprobs.NAME: reference_logprobs.run,
    rpc_consistency.NAME: rpc_consistency.run,
    telemetry.NAME: None,
}
STEP_PREFIX = "check:"
SPEED = "speed"  # the probe that sizes every bound; a result of its own only when it fails


class SuiteResult(BaseModel):
    pair: str
    profile: str
    results: list[CheckResult]
    passed: bool
    sampler_faults: list[dict[str, Any]] = Field(default_factory=list)
    client_retries: list[str] = Field(default_factory=list)  # HTTP requests resent after a dropped connection
    request_budget: dict[str, Any] = Field(default_factory=dict)  # measured bounds (checks/budget.py), if probed
    request_surface: dict[str, Any] = Field(default_factory=dict)  # declared request fields checked or not
    duration_s: float = 0.0

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def result(self, name: str) -> CheckResult | None:
        return next((r for r in self.results if r.name == name), None)

    def summary(self) -> dict[str, Any]:
        """Small enough for a receipt field and `--json`: verdicts and figures, no raw data."""
        return {
            "pair": self.pair,
            "profile": self.profile,
            "passed": self.passed,
            "duration_s": self.duration_s,
            "sampler_faults": len(self.sampler_faults),
            "client_retries": len(self.client_retries),
            "request_budget": self.request_budget,
            "request_surface": self.request_surface,
            "checks": [r.model_dump(exclude={"raw"}) for r in self.results],
        }


def select(only: Iterable[str] | None = None, skip: Iterable[str] | None = None) -> list[str]:
    """Check names to run, in suite order; unknown names are a usage error naming the known ones."""
    only, skip = list(only or []), list(skip or [])
    unknown = sorted(set(only + skip) - set(CHECKS))
    if unknown:
        raise ConfigError(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    return [n for n in CHECKS if (not only or n in only) and n not in skip]


def _guarded(name: str, fn: Callable[[], CheckResult]) -> CheckResult:
    t0 = time.monotonic()
    try:
        r = fn()
    except Exception as exc:  # an unexpected exception is an `error` verdict, never a crash of the suite
        r = result(name, "error", f"{type(exc).__name__}: {exc}", raw={"exception": f"{type(exc).__name__}: {exc}"})
    if not r.duration_s:
        r.duration_s = round(time.monotonic() - t0, 4)
    return r


def _record(ctx: CheckContext, r: CheckResult, *, not_run: bool = False) -> None:
    """`not_run`: skipped because the suite stopped, not by the check's own judgement (a derived
    record must still cover it: evidence/derived.py)."""
    j = ctx.journal
    if j is None:
        return
    host = ctx.host_names.get("native")
    with j.step(STEP_PREFIX + r.name, host=host) as st:
        st.data.update(r.model_dump(mode="json"))
        if not_run:
            st.data["not_run"] = True
        if r.verdict in ("failed", "error"):
            st.fail(r.message)
        elif r.verdict == "skipped":
            st.skip(r.message)


def measure_budget(ctx: CheckContext) -> CheckResult | None:
    """Probe the pair's speed and bound every later request by it (checks/budget.py): sets the
    checks' total bound, the client's progress watch and the idle wait. Returns a failed result
    when the probe fails (the pair is hung, unreachable or slower than the profile's floors)."""
    from orchestrator.server.client import ServerUnreachable

    timer = time.monotonic()
    try:
        prompt_n, _gen = budget.probe_size(ctx.profile)
        prompt = PromptBuilder(ctx.client, ctx.options.seed).exact(prompt_n, variant=11)
        # the services' CPU time on their hosts: the finer progress signal (a stopped server fails in
        # budget.IDLE_S, however long an honest batch at this profile's context may take)
        alive = budget.services_cpu(ctx.transports, ctx.host_roots) if ctx.transports else None
        speeds = budget.measure(ctx.client, ctx.profile, list(prompt), alive)
        limits = budget.from_speeds(ctx.profile, speeds, generation_fraction=ctx.options.generation_fraction,
                                    n_ctx_train=ctx.n_ctx_train)  # fmt: skip
    except (budget.TooSlow, ServerUnreachable) as exc:
        verdict = "failed" if isinstance(exc, budget.TooSlow) else "error"
        msg = str(exc) if isinstance(exc, budget.TooSlow) else f"{type(exc).__name__}: {exc}"
        return CheckResult(name=SPEED, verdict=verdict, message=msg, duration_s=round(time.monotonic() - timer, 3))
    ctx.budget = limits.to_dict()
    ctx.options = dataclasses.replace(ctx.options, request_timeout_s=limits.completion_s)
    ctx.client.watch = limits.watch(alive)
    ctx.stall_s = limits.stall_s
    ctx.log("request budget", **limits.to_dict())
    if ctx.journal is not None:
        ctx.journal.set("request_budget", limits.to_dict())
    if ctx.on_budget is not None:
        ctx.on_budget(limits)
    return None


def _why_stopped(r: CheckResult) -> str:
    return "found the server not answering" if budget.is_transport_failure(r.message) else "stopped the suite"


def wait_idle(ctx: CheckContext, within_s: float | None = None) -> None:
    """Checks assume idle slots (explicit id_slot, cold lanes); wait for leftovers to finish
    (as long as a request may go without progress on this pair)."""
    deadline = time.monotonic() + (within_s if within_s is not None else ctx.stall_s)
    while time.monotonic() < deadline:
        try:
            if not any(s.is_processing for s in ctx.client.slots(timeout=10)):
                return
        except Exception:  # /slots unreachable: the check itself will report it
            return
        time.sleep(0.1)


def _run_one(ctx: CheckContext, name: str, fn: CheckFn, nth: str) -> CheckResult:
    """One check, once the pair is idle, with its start and end on the operator's screen and in the
    log; a signal stops the suite here (the deploy rolls back), never inside a check."""
    interrupt.check(f"before acceptance check {name}")
    wait_idle(ctx)
    faults.at_step(STEP_PREFIX + name)  # test-only boundary for the fault matrix; inert otherwise
    ctx.log("check start", check=name)
    progress.event("check.start", f"check {name} {nth} ...", check=name)
    r = _guarded(name, partial(fn, ctx))
    ctx.log("check done", check=name, verdict=r.verdict)
    # a check that skipped itself says why on the operator's screen (e.g. reference_logprobs in a
    # run limited by --checks: no reference is recorded)
    why = f": {r.message[:300]}" if r.verdict == "skipped" and r.message else ""
    progress.event(
        "check.end", f"check {name} {nth}: {r.verdict} ({r.duration_s:.1f} s){why}", check=name, verdict=r.verdict
    )
    return r


def run_suite(
    ctx: CheckContext,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    *,
    overrides: dict[str, CheckFn] | None = None,
) -> SuiteResult:
    """Run the selected checks against the live pair in `ctx`. `overrides` replaces a check's
    function (tests use it to run a deliberately broken variant through the whole suite)."""
    names = select(only, skip)
    t0 = time.monotonic()
    fns = {**CHECKS, **(overrides or {})}
    results: list[CheckResult] = []
    before = identity.snapshot(ctx) if identity.NAME in names else None
    sampler = None
    if telemetry.NAME in names:
        sampler = telemetry.Sampler(
            transports=ctx.sampler_transports or ctx.transports,
            roots=ctx.host_roots,
            hosts=ctx.host_names,
            interval_s=ctx.options.telemetry_interval_s,
            timeout_s=ctx.options.telemetry_sample_timeout_s,
        )
        sampler.start()
    stopped: CheckResult | None = None
    ctx.whole_suite = names == select()
    if ctx.journal is not None:  # what it set out to run: an interrupted suite's rest is still required
        ctx.journal.set("acceptance_plan", [STEP_PREFIX + n for n in names if n in fns])
        ctx.journal.set(reference.WHOLE_SUITE, ctx.whole_suite)
    try:
        runnable = [n for n in names if fns.get(n) is not None]
        if runnable and ctx.options.measure_speed:
            failed = measure_budget(ctx)
            if failed is not None:
                results.append(failed)
                _record(ctx, failed)
                stopped = failed
        for name in names:
            fn = fns.get(name)
            if fn is None:
                continue
            if stopped is not None:  # the server stopped answering: the rest would only wait on it
                r = result(
                    name, "skipped", f"not run: {stopped.name} {_why_stopped(stopped)} ({stopped.message[:160]})"
                )
                results.append(r)
                _record(ctx, r, not_run=True)
                continue
            # numbered from 1 among the checks run one after another (identity and telemetry wrap them)
            r = _run_one(ctx, name, fn, f"({runnable.index(name) + 1}/{len(runnable)})")
            results.append(r)
            _record(ctx, r)
            if r.required and not r.ok and budget.is_transport_failure(r.message):
                stopped = r
    finally:
        if sampler is not None:
            sampler.stop()
    if sampler is not None:
        r = sampler.result()
        results.append(r)
        _record(ctx, r)
        progress.event("check.end", f"check telemetry (during the suite): {r.verdict}", check=r.name, verdict=r.verdict)
        if ctx.journal is not None and sampler.rows:
            ctx.journal.samples(STEP_PREFIX + telemetry.NAME, sampler.rows)
    if before is not None and stopped is None:
        after = identity.snapshot(ctx)
        r = identity.judge(before, after, probe_configured=ctx.identity_probe is not None)
        results.insert(0, r)
        _record(ctx, r)
        progress.event("check.end", f"check identity (before and after): {r.verdict}", check=r.name, verdict=r.verdict)
        if ctx.journal is not None:
            for when, snap in (("before", before), ("after", after)):
                ctx.journal.identity(ctx.host_names.get("native", "native"), {"when": when, **snap})
    results.sort(key=lambda r: list(CHECKS).index(r.name) if r.name in CHECKS else len(CHECKS))
    suite = SuiteResult(
        pair=ctx.pair,
        profile=ctx.profile.name,
        results=results,
        passed=all(r.ok for r in results) and bool(results),
        sampler_faults=sampler.faults if sampler else [],
        client_retries=list(getattr(ctx.client, "retries", [])),
        request_budget=dict(ctx.budget),
        request_surface=contract.surface_report(ctx.profile, results),
        duration_s=round(time.monotonic() - t0, 3),
    )
    if ctx.journal is not None:
        ctx.journal.set("acceptance", suite.summary())
    return suite
