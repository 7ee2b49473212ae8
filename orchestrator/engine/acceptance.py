"""Deploy's `accept` step: the acceptance suite against the pair just activated, compared with the
same baseline and reference answers as `pairctl accept`, so a regression only the reference answers
see blocks the deploy. A failed suite raises, so the engine rolls the deploy back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.checks import answer_fixtures, budget
from orchestrator.checks.base import CheckContext, CheckOptions, IdentitySnapshot
from orchestrator.checks.live import comparisons
from orchestrator.checks.suite import CHECKS, run_suite
from orchestrator.config.profiles import profile_from_record
from orchestrator.errors import CheckFailed
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.identity import verify_identity
from orchestrator.server.client import ServerClient
from orchestrator.server.tunnel import via_for

if TYPE_CHECKING:
    from orchestrator.engine.context import RunEnv
    from orchestrator.engine.plan import Step, Target


def identity_probe(ctx: RunEnv, target: Target, api_key: str | None) -> Callable[[], IdentitySnapshot]:
    """A zero-argument probe for CheckContext.identity_probe: identity of both hosts, now."""

    expected = target.expected
    if expected is None:  # the verify step before accept refuses this already
        raise CheckFailed(f"no identity to expect for {target.entry.names()}: a manifest is not in the local store")

    def probe() -> IdentitySnapshot:
        rep = verify_identity(
            {r: ctx.t(r) for r in ("native", "rpc")},
            ctx.view.layouts,
            ctx.view.hosts,
            expected,
            base_url=ctx.view.base_url,
            api_key=api_key,
        )
        return IdentitySnapshot(data=rep.data, problems=tuple(rep.problems))

    return probe


def suite_bound_s(profile: dict[str, Any]) -> float:
    """How long deploy's acceptance may take for this profile (checks/budget.py), all checks."""
    return budget.suite_seconds(budget.for_profile(profile_from_record(profile)), len(CHECKS))


def _announce(ctx: RunEnv, measured: budget.RequestBudget) -> None:
    """Once the pair's speed is measured: the lease's next renewal comes within the whole suite's
    bound at that speed (a slow real pair's suite may outlast the planning figure)."""
    from orchestrator.engine import leasing

    bound = budget.suite_seconds(measured, len(CHECKS))
    for role in ("native", "rpc"):
        leasing.recheck(ctx, role, next_within_s=bound)


def run(ctx: RunEnv, step: Step) -> dict[str, Any]:
    """The acceptance suite against the pair the step names, with the step's key and packages."""
    target, api_key = step.pair, step.key.value if step.key is not None else None
    if ctx.inputs.options.skip_accept:
        return {"skipped": "--skip-accept: identity was verified by the verify step; no acceptance checks ran"}
    assert target is not None  # accept follows a verified activation
    profile = profile_from_record(target.entry.profile)
    limits = budget.for_profile(profile)  # a hung server fails within this, not in an hour
    models = dict(target.entry.models)
    key = answer_fixtures.answer_key(profile, models, answer_fixtures.fixture_set_for(profile))
    baseline, reference = comparisons(EvidenceStore(ctx.home.evidence), ctx.view.name, models, answer_key=key)
    via = via_for(ctx.t("native"), api_key)  # the key only inside SSH (server.tunnel)
    with ServerClient(ctx.view.base_url, api_key=api_key, timeout=limits.control_s, via=via) as client:
        cctx = CheckContext(
            client=client,
            profile=profile,
            pair=ctx.view.name,
            inventory=ctx.inventory,
            transports={r: ctx.t(r) for r in ("native", "rpc")},
            host_roots={r: ctx.view.layouts[r].root for r in ("native", "rpc")},
            host_names=dict(ctx.view.hosts),
            packages={r: p.manifest for r, p in step.packages.items()},
            journal=ctx.journal,
            api_key=api_key,
            identity_probe=identity_probe(ctx, target, api_key),
            baseline=baseline,
            reference=reference,
            weights_sha256=models,
            logger=ctx.log,
            options=CheckOptions(request_timeout_s=limits.completion_s),
            on_budget=lambda measured: _announce(ctx, measured),
        )
        suite = run_suite(cctx, only=list(ctx.inputs.options.checks) or None)
    summary = suite.summary()
    if not suite.passed:
        failed = ", ".join(f"{r.name} ({r.verdict}: {r.message[:120]})" for r in suite.failed())
        raise CheckFailed(f"acceptance failed: {failed or 'no check ran'}")
    return {
        "passed": True,
        "checks": [c["name"] for c in summary["checks"]],
        "duration_s": summary["duration_s"],
        "request_budget": suite.request_budget or limits.to_dict(),
        "baseline_receipt": baseline.receipt if baseline else None,
        "reference": reference.pin.as_dict() if reference and reference.pin else None,
    }
