"""`pairctl qualify`'s body: resolve plan, profile and packages, run on the engine, write the report.

Everything that can refuse the run without touching a host is checked first (plan and fixture
hashes, fit to the profile, the four packages in the store), so a typo costs nothing.
"""

from __future__ import annotations

from typing import Any

from orchestrator.build.store import PackageStore
from orchestrator.config.profiles import load_profile
from orchestrator.evidence.store import EvidenceStore
from orchestrator.qualify.engine_driver import EngineDriver
from orchestrator.qualify.plan import load_plan
from orchestrator.qualify.report import write_report
from orchestrator.qualify.runner import ArmPackages, Hooks, RunOutcome, run_qualification


def qualify_pair(c: Any, *, pair: str, baseline: tuple[str, str], candidate: tuple[str, str], plan_ref: str,
                 profile_ref: str | None, argv: list[str], hooks: Hooks | None = None) -> RunOutcome:
    loaded = load_plan(plan_ref)
    inventory = c.inventory()
    spec = inventory.pair(pair)
    profile = load_profile(profile_ref or spec.profile, pair=spec)
    loaded.plan.check_fits(profile)
    packages = PackageStore(c.home.store)
    for pid in (*baseline, *candidate):
        packages.get(pid)  # PackageError (exit 6) names a missing package before anything runs
    store = EvidenceStore(c.home.evidence)
    driver = EngineDriver(c.home, inventory, pair, argv=argv)
    try:
        return run_qualification(
            store=store, loaded=loaded, pair=pair, baseline=ArmPackages(*baseline), candidate=ArmPackages(*candidate),
            profile=profile, driver=driver, argv=argv, hooks=hooks, write_report=lambda h: write_report(store, h)[0],
        )
    finally:
        driver.close()
