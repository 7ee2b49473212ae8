"""`pairctl qualify`'s body: resolve plan, profile and packages, run on the engine, write the report.
Every refusal that needs no host comes first (hashes, fit, packages, calibration, resolvable
gates), so a typo or a hopeless plan costs nothing."""

from __future__ import annotations

from typing import Any

from orchestrator.build.store import PackageStore
from orchestrator.config.profiles import load_profile
from orchestrator.errors import ConfigError
from orchestrator.evidence.store import EvidenceStore
from orchestrator.qualify.calibration import find_calibration, judge, profile_key
from orchestrator.qualify.engine_driver import EngineDriver
from orchestrator.qualify.plan import load_plan
from orchestrator.qualify.report import write_report
from orchestrator.qualify.runner import ArmPackages, Hooks, RunOutcome, run_qualification


def qualify_pair(
    c: Any,
    *,
    pair: str,
    baseline: tuple[str, str],
    candidate: tuple[str, str] | None,
    plan_ref: str,
    profile_ref: str | None,
    argv: list[str],
    hooks: Hooks | None = None,
    calibrate: bool = False,
    calibration_ref: str | None = None,
    candidate_profile_ref: str | None = None,
) -> RunOutcome:
    """`calibrate`: the A/A run (the baseline in both arms; `candidate` ignored). Otherwise the
    plan's calibration is looked up (or `calibration_ref`) and the plan refused, before any host
    is touched, when it cannot resolve its gates at the measured noise."""
    loaded = load_plan(plan_ref)
    inventory = c.inventory()
    spec = inventory.pair(pair)
    profile = load_profile(profile_ref or spec.profile, pair=spec)
    loaded.plan.check_fits(profile)
    cand_profile = load_profile(candidate_profile_ref, pair=spec) if candidate_profile_ref else None
    if cand_profile is not None:
        loaded.plan.check_fits(cand_profile)
    if candidate is None and not calibrate:
        raise ConfigError("qualify needs --candidate (or --calibrate for an A/A run)", hint="pairctl qualify --help")
    cand = baseline if calibrate or candidate is None else candidate
    packages = PackageStore(c.home.store)
    for pid in (*baseline, *cand):
        packages.get(pid)  # PackageError (exit 6) names a missing package before anything runs
    store = EvidenceStore(c.home.evidence)
    base = ArmPackages(*baseline)
    noise = None
    if not calibrate:
        key = profile_key(profile)
        found = find_calibration(
            store, pair=pair, plan=loaded.plan, profile_sha256=key, baseline=base.to_dict(), ref=calibration_ref
        )
        hint = f"pairctl qualify --calibrate --pair {pair} --baseline {' '.join(baseline)} --plan {plan_ref}"
        hint += f" --profile {profile_ref}" if profile_ref else ""
        noise = judge(loaded.plan, found, calibrate_hint=hint)
    driver = EngineDriver(c.home, inventory, pair, argv=argv)
    try:
        return run_qualification(
            store=store,
            loaded=loaded,
            pair=pair,
            baseline=base,
            candidate=ArmPackages(*cand),
            profile=profile,
            driver=driver,
            argv=argv,
            hooks=hooks,
            write_report=lambda h: write_report(store, h)[0],
            candidate_profile=cand_profile,
            calibrate=calibrate,
            noise=noise,
        )
    finally:
        driver.close()
