"""Deploy's `accept` step: the acceptance suite (orchestrator.checks.suite.run_suite) against
the pair just activated, with `verify_identity` as its identity probe. It is compared with the
same baseline and reference answers as `pairctl accept` (checks.live.comparisons, on the model
hashes of the route entry being activated), so a regression only the reference answers see
blocks the deploy. A failed suite raises, so the engine rolls the deploy back."""

from __future__ import annotations

from typing import Any

from orchestrator.checks.base import CheckContext, IdentitySnapshot
from orchestrator.checks.live import comparisons
from orchestrator.checks.suite import run_suite
from orchestrator.config.profiles import RouteProfile
from orchestrator.engine.identity import verify_identity
from orchestrator.errors import CheckFailed
from orchestrator.evidence.store import EvidenceStore
from orchestrator.server.client import ServerClient


def identity_probe(ctx: Any, target: Any):
    """A zero-argument probe for CheckContext.identity_probe: identity of both hosts, now."""

    def probe() -> IdentitySnapshot:
        rep = verify_identity({r: ctx.t(r) for r in ("native", "rpc")}, ctx.view.layouts, ctx.view.hosts,
                              target.expected, base_url=ctx.view.base_url, api_key=ctx.api_key)
        return IdentitySnapshot(data=rep.data, problems=tuple(rep.problems))

    return probe


def run(ctx: Any) -> dict[str, Any]:
    if ctx.skip_accept:
        return {"skipped": "--skip-accept: identity was verified by the verify step; no acceptance checks ran"}
    target = ctx.activating()
    profile = RouteProfile.model_validate(target.entry.profile)
    models = dict(target.entry.models)
    baseline, reference = comparisons(EvidenceStore(ctx.home.evidence), ctx.view.name, models)
    with ServerClient(ctx.view.base_url, api_key=ctx.api_key) as client:
        cctx = CheckContext(
            client=client,
            profile=profile,
            pair=ctx.view.name,
            inventory=ctx.inventory,
            transports={r: ctx.t(r) for r in ("native", "rpc")},
            host_roots={r: ctx.view.layouts[r].root for r in ("native", "rpc")},
            host_names=dict(ctx.view.hosts),
            packages={r: p.manifest for r, p in ctx.packages.items()},
            journal=ctx.journal,
            api_key=ctx.api_key,
            identity_probe=identity_probe(ctx, target),
            baseline=baseline,
            reference=reference,
            models=models,
            logger=ctx.log,
        )
        suite = run_suite(cctx, only=list(ctx.checks) or None)
    ctx.accept_result = suite
    summary = suite.summary()
    if not suite.passed:
        failed = ", ".join(f"{r.name} ({r.verdict}: {r.message[:120]})" for r in suite.failed())
        raise CheckFailed(f"acceptance failed: {failed or 'no check ran'}")
    return {"passed": True, "checks": [c["name"] for c in summary["checks"]], "duration_s": summary["duration_s"],
            "baseline_receipt": baseline.receipt if baseline else None,
            "reference": reference.pin.as_dict() if reference and reference.pin else None}
