"""The paired runner: alternating fresh arms, one warm-up each, every fixture, then restore.

The receipt's events, in order (a killed run keeps what it had):
1. the plan, its sha256, both arms, noise and rules, BEFORE the first sample; `qualify_leases`:
   the hosts' leases, held (named by run id) until after the restore and renewed by each arm's
   deploy, so nothing else changes the pair between arms (`qualify_leases_end`: how they ended);
2. `snapshot` of what is active; 3. one step per arm, `arm-<k>-p<pair>-<arm>`: fresh activation,
   warm-up, `repeats` rounds over the fixtures, raw rows under the step; 4. `restore`, verified.

A calibration is the same run with the baseline in both arms; its receipt adds `calibration`.
A failed restore fails the receipt, but the arm steps keep their samples, so `receipts derive
--reuse arm-...` rebuilds the result without measuring again.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator import interrupt, progress
from orchestrator.config.profiles import RouteProfile
from orchestrator.errors import ConfigError, PairctlError, RollbackFailed
from orchestrator.evidence.journal import Journal
from orchestrator.evidence.store import EvidenceStore
from orchestrator.log import get_logger
from orchestrator.qualify.analysis import QualifyResult, analyze, rules_for
from orchestrator.qualify.calibration import calibration_of, calibration_outcome, profile_key
from orchestrator.qualify.measure import MemoryProbe, Prompt, measure, prompts_for, request_params, warmup
from orchestrator.qualify.plan import Arm, LoadedPlan, QualifyPlan
from orchestrator.qualify.stats import robust_centre

if TYPE_CHECKING:
    from structlog.stdlib import BoundLogger

ARM_STEP_PREFIX = "arm-"


@dataclass(frozen=True)
class ArmPackages:
    native: str
    rpc: str

    def to_dict(self) -> dict[str, str]:
        return {"native": self.native, "rpc": self.rpc}


@dataclass
class ActiveArm:
    """A freshly activated and verified pair, as the runner needs it."""

    client: Any  # orchestrator.server.client.ServerClient
    identity: dict[str, Any]
    per_slot_ctx: int
    memory: MemoryProbe | None = None


class PairDriver(Protocol):
    """What the runner needs from the deploy engine (see engine_driver.EngineDriver)."""

    def snapshot(self) -> dict[str, Any]:
        """What is active on the pair now (packages, profile, route revision), for restore."""

    def activate(self, packages: ArmPackages, profile: RouteProfile) -> ActiveArm:
        """Stop whatever runs, start these packages fresh with the profile, verify identity."""

    def restore(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """Put the snapshot's pair back and verify it; returns what was verified."""

    def hold(self, run_id: str) -> AbstractContextManager[Any]:
        """Hold the pair's host leases (naming `run_id`) from snapshot to restore; yields an object
        with `keep(reason)`: leases kept on exit (a failed rollback left the pair unknown)."""

    def close(self) -> None: ...


@dataclass
class Hooks:
    """Test seams that change nothing about measurement: called after steps, may raise."""

    after_arm: Callable[[str], None] | None = None
    before_restore: Callable[[], None] | None = None
    after_restore: Callable[[dict[str, Any]], None] | None = None  # e.g. a final read that fails


@dataclass
class RunOutcome:
    receipt: str
    result: QualifyResult
    restored: bool
    restore_error: str | None = None
    arm_steps: list[str] = field(default_factory=list)
    report_dir: Path | None = None
    stop_error: BaseException | None = None  # what ended the measurements early, if anything


def arm_step_name(k: int, pair: int, arm: Arm) -> str:
    return f"{ARM_STEP_PREFIX}{k + 1:02d}-p{pair + 1}-{arm}"


def run_qualification(
    *,
    store: EvidenceStore,
    loaded: LoadedPlan,
    pair: str,
    baseline: ArmPackages,
    candidate: ArmPackages,
    profile: RouteProfile,
    driver: PairDriver,
    argv: list[str],
    hooks: Hooks | None = None,
    write_report: Callable[[str], Path] | None = None,
    candidate_profile: RouteProfile | None = None,
    calibrate: bool = False,
    noise: dict[str, Any] | None = None,
) -> RunOutcome:
    plan = loaded.plan
    if calibrate:
        if plan.calibration is None:
            hint = "add `calibration: {pairs: 8}` to the plan"
            raise ConfigError(f"plan {plan.name} declares no calibration", hint=hint)
        candidate, candidate_profile = baseline, None
        plan = plan.model_copy(update={"pairs": plan.calibration.pairs, "sequential": None})
    hooks = hooks or Hooks()
    log = get_logger(pair=pair, command="qualify", plan=plan.name)
    plan.check_fits(profile)  # declared sizes: a config error before anything runs
    if candidate_profile is not None:
        plan.check_fits(candidate_profile)
    arms = {"baseline": baseline, "candidate": candidate}
    profiles = {"baseline": profile, "candidate": candidate_profile or profile}
    inputs = {"plan": loaded.sha256, **{f"fixture:{f.name}": f.sha256 for f in plan.fixtures}}

    # Not on the pair's chain: each arm's deploy writes its own receipt there (under its lock).
    journal = store.begin(command="qualify", argv=argv, pair=None, inputs=inputs)
    with journal:
        order_seed = _order_seed(plan)
        run = _Run(journal, driver, loaded, plan, hooks, log, noise)
        rules = run.declare(pair, arms, profile, candidate_profile, calibrate, order_seed)
        arm_order = plan.arm_order(order_seed)
        with driver.hold(journal.run_id) as held:
            journal.set("qualify_leases", held.public())
            with journal.step("snapshot") as step:
                before = driver.snapshot()
                step.data["active"] = before

            prompts: list[Prompt] | None = None
            arm_steps: list[str] = []
            stopped_early: str | None = None
            stop_error: BaseException | None = None
            t_arms = time.monotonic()
            for k, (p_idx, arm) in enumerate(arm_order):
                name = arm_step_name(k, p_idx, arm)
                progress.event(
                    "arm.start",
                    f"qualify arm {k + 1}/{len(arm_order)} {name} "
                    f"({progress.eta(k, len(arm_order), time.monotonic() - t_arms)}) ...",
                    arm=name,
                )
                try:
                    base = {"pair": p_idx, "arm": arm, "seq": k}
                    pkgs, prof = arms[arm], profiles[arm]
                    rows, prompts = run.measure_arm(pkgs, prof, base, prompts)
                    arm_steps.append(name)
                    log.info("arm measured", step=name, samples=len(rows))
                    progress.event("arm.end", f"qualify arm {name}: {len(rows)} samples", arm=name, samples=len(rows))
                    if hooks.after_arm:
                        hooks.after_arm(name)
                    look = run.sequential_stop(p_idx, k, arm_order)
                    if look is not None:
                        journal.set("qualify_sequential_stop", look)
                        log.info("sequential design settled; no more pairs", **look)
                        progress.event("qualify.stop", f"qualify: settled at look {look['look']}", **look)
                        break
                except Exception as exc:  # noqa: BLE001 - whatever stops an arm, the pair is restored below
                    # ends the measuring (missing pairs: inconclusive); the step records it, no retry
                    stopped_early = f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    stop_error = exc
                    log.warning("arm failed; stopping measurements", step=name, error=stopped_early)
                    break
            restored, restore_error = run.restore(held, before, stop_error, stopped_early)
        journal.set("qualify_leases_end", held.end())

        result = analyze(plan, run.samples, plan_sha256=loaded.sha256, noise=noise, rules=rules)
        journal.set("qualification", result.to_json())
        outcome, reason = _outcome(result, restored, restore_error, stopped_early)
        if calibrate:
            cal = calibration_of(loaded.plan, result, profile_key(profile), baseline.to_dict(), pair)
            journal.set("calibration", cal)
            if restored:
                outcome, reason = calibration_outcome(cal, stopped_early)
        receipt = journal.finish(outcome, reason)
    report_dir = write_report(receipt) if write_report is not None else None
    return RunOutcome(receipt, result, restored, restore_error, arm_steps, report_dir, stop_error)


@dataclass
class _Run:
    """What the steps of one qualification share: its journal, driver, plan and the samples so far."""

    journal: Journal
    driver: PairDriver
    loaded: LoadedPlan
    plan: QualifyPlan  # loaded.plan, or a calibration's copy of it (its pairs, no sequential design)
    hooks: Hooks
    log: BoundLogger
    noise: dict[str, Any] | None
    rules: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def declare(
        self,
        pair: str,
        arms: dict[str, ArmPackages],
        profile: RouteProfile,
        candidate_profile: RouteProfile | None,
        calibrate: bool,
        order_seed: int | None,
    ) -> dict[str, Any]:
        """Everything the result will be judged by, set before any sample: plan, arms, profiles,
        noise and the decision rules."""
        journal, loaded, plan, noise = self.journal, self.loaded, self.plan, self.noise
        journal.set("qualify_pair", pair)
        journal.set("plan_sha256", loaded.sha256)
        journal.set("plan_text", loaded.path.read_text(encoding="utf-8"))
        journal.set("qualify_arms", {a: p.to_dict() for a, p in arms.items()})
        journal.set("qualify_profile", profile.model_dump(mode="json"))
        if candidate_profile is not None:
            journal.set("qualify_candidate_profile", candidate_profile.model_dump(mode="json"))
        if calibrate:
            key = {
                "pairs": plan.pairs,
                "measurement_key": plan.measurement_key(),
                "profile_sha256": profile_key(profile),
            }
            journal.set("qualify_calibrate", key)
        if noise is not None:
            journal.set("qualify_noise", noise)
        self.rules = rules_for(plan, noise, order_seed)
        journal.set("qualify_rules", self.rules)
        return self.rules

    def measure_arm(
        self, pkgs: ArmPackages, profile: RouteProfile, base: dict[str, Any], prompts: list[Prompt] | None
    ) -> tuple[list[dict[str, Any]], list[Prompt]]:
        """One arm in its own step (fresh activation, tokenize, warm-up, every sample), so the receipt
        holds its identity and rows or the error that ended it. Adds the rows to `samples`; returns
        them and the prompts every later arm sends (the first arm's token ids)."""
        journal, loaded, plan = self.journal, self.loaded, self.loaded.plan
        name = arm_step_name(base["seq"], base["pair"], base["arm"])
        params = request_params(plan.seed, plan.temperature)
        with journal.step(name) as step:
            active = self.driver.activate(pkgs, profile)
            step.data.update(packages=pkgs.to_dict(), identity=active.identity, per_slot_ctx=active.per_slot_ctx)
            try:  # both arms send the first arm's ids; a tokenizer that disagrees is recorded
                mine = prompts_for(loaded, active.client.tokenize, active.per_slot_ctx)
                prompts = prompts or mine
                step.data["prompts"] = {p.fixture: {"tokens": len(p.tokens), "sha256": p.sha256} for p in prompts}
                step.data["tokenizer_agrees"] = [p.sha256 for p in mine] == [p.sha256 for p in prompts]
                step.data["warmup"] = warmup(active.client, loaded, params)
                base = {**base, "package_native": pkgs.native, "package_rpc": pkgs.rpc}
                base["build_info"] = active.identity.get("build_info")
                rows = self.measure_rows(active, prompts, params, base, name)
            finally:
                close = getattr(active.client, "close", None)
                if close:
                    close()
            journal.samples(name, rows)
            self.samples += rows
            step.data["samples"] = len(rows)
            step.data["failed_requests"] = sum(1 for r in rows if not r["ok"])
        return rows, prompts

    def measure_rows(
        self, active: ActiveArm, prompts: list[Prompt], params: dict[str, Any], base: dict[str, Any], name: str
    ) -> list[dict[str, Any]]:
        """Rounds over the fixtures (not one fixture k times), so drift within an arm spreads over
        every fixture alike. A fixture whose repeats spread too much is measured again (attempt
        1, 2, ...); every attempt stays in the receipt."""
        plan = self.loaded.plan

        def rounds(fixtures: list[Prompt], **extra: Any) -> list[dict[str, Any]]:
            return [
                measure(
                    active.client,
                    pr,
                    n_predict=plan.n_predict,
                    params=params,
                    memory=active.memory,
                    base={**base, "rep": r, **extra},
                )
                for r in range(plan.repeats)
                for pr in fixtures
            ]

        rows = rounds(prompts)
        for attempt in range(1, plan.arm_retries + 1):
            redo = [pr for pr in prompts if _too_spread(plan, rows, pr.fixture, attempt - 1)]
            if not redo:
                break
            redone = [pr.fixture for pr in redo]
            self.log.info(
                "arm dispersion above the bound; measuring again", step=name, attempt=attempt, fixtures=redone
            )
            rows += rounds(redo, attempt=attempt)
        return rows

    def restore(
        self, held: Any, before: dict[str, Any], stop_error: BaseException | None, stopped_early: str | None
    ) -> tuple[bool, str | None]:
        """The pair back on what was active before, in the `restore` step; a failure is the run's
        outcome (the samples stay usable), returned, not raised."""
        if isinstance(stop_error, RollbackFailed):  # the pair's state is unknown: nothing goes on it
            held.keep("an arm's rollback failed; the pair's state is unknown")
            return False, f"not attempted, an arm's rollback failed ({stopped_early})"
        hooks = self.hooks
        try:
            # the cleanup after a signal too: it runs to its end (orchestrator/interrupt.py)
            with self.journal.step("restore") as step, interrupt.shielded():
                if hooks.before_restore:
                    hooks.before_restore()
                step.data["verified"] = self.driver.restore(before)
                if hooks.after_restore:
                    hooks.after_restore(step.data["verified"])
        except PairctlError as exc:
            restore_error = str(exc).splitlines()[0]
            self.log.error("restore failed after measurements", error=restore_error)
            return False, restore_error
        return True, None

    def sequential_stop(self, p_idx: int, k: int, arm_order: list[tuple[int, Arm]]) -> dict[str, Any] | None:
        """After the arm completing a look's pairs (not the last look): the look, if it settles every
        gate (the run stops there); else None."""
        design = self.rules.get("sequential")
        if not design or k + 1 >= len(arm_order) or arm_order[k + 1][0] == p_idx:
            return None  # no design, the last arm, or this pair's first arm
        if p_idx + 1 not in design["pairs_at"][:-1]:
            return None
        res = analyze(self.plan, self.samples, plan_sha256=self.loaded.sha256, noise=self.noise, rules=self.rules)
        info = res.sequential or {}
        if not info.get("stopped_early"):
            return None
        return {"look": info["decided_at_look"], "pairs": info["pairs_used"], "verdict": res.verdict}


def _too_spread(plan: QualifyPlan, rows: list[dict[str, Any]], fixture: str, attempt: int) -> bool:
    """Whether this fixture's repeats of `attempt` spread more than the plan's bound."""
    if plan.max_arm_dispersion is None:
        return False
    tg = [
        r["predicted_per_second"]
        for r in rows
        if r["fixture"] == fixture
        and r.get("attempt", 0) == attempt
        and r.get("ok")
        and isinstance(r.get("predicted_per_second"), (int, float))
        and r["predicted_per_second"] > 0
    ]
    spread = robust_centre(tg)[1] if len(tg) >= 2 else None
    return spread is not None and spread > plan.max_arm_dispersion


def _order_seed(plan: QualifyPlan) -> int | None:
    """A random order's seed: the plan's, or drawn now (and recorded in `qualify_rules`)."""
    if plan.order != "random":
        return None
    return plan.order_seed if plan.order_seed is not None else secrets.randbelow(2**31)


def _outcome(
    result: QualifyResult, restored: bool, restore_error: str | None, stopped_early: str | None
) -> tuple[str, str]:
    gates = ", ".join(f"{g.kind}[{g.family}]={g.verdict}" for g in result.gates)
    if result.drift and result.drift.get("flagged"):
        gates += "; drift: " + "; ".join(result.drift["reasons"])
    if not restored:
        return "failed", f"restore failed after measurements: {restore_error}; result {result.verdict} ({gates})"
    if stopped_early:
        outcome = "inconclusive" if result.verdict != "fail" else "failed"
        return outcome, f"stopped early at {stopped_early}; result {result.verdict} ({gates})"
    outcome = {"pass": "passed", "fail": "failed", "inconclusive": "inconclusive"}[result.verdict]
    return outcome, f"qualification {result.verdict} ({gates})"
