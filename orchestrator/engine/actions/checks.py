"""Actions that check and change nothing: preflight (local), kernel-check, verify (identity), accept."""

from __future__ import annotations

from typing import Any

from orchestrator.build.store import PackageStore
from orchestrator.engine.actions.base import Action
from orchestrator.engine.activate import before_change
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Exec, Planning, Step
from orchestrator.engine.targets import preflight_checks
from orchestrator.errors import CheckFailed, PackageError
from orchestrator.hosts.identity import verify_identity


class Preflight(Action, name="preflight", local=True):
    """Local: packages exist and verify, one revision, profile flags in --help."""

    def execute(self, ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
        return preflight_checks(ctx, PackageStore(ctx.home.store))


class KernelCheck(Action, name="kernel-check", uses_pair=True):
    """The packages' own kernel validation harness on both hosts, before anything running changes."""

    def execute(self, ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
        from orchestrator.checks import kernels

        return kernels.deploy_step(ctx, role)


class Verify(Action, name="verify", uses_pair=True, uses_key=True):
    """Identity: exe sha256, argv, /props build_info, /slots, rpc bind, alive."""

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        tgt = step.pair
        if tgt is None:
            return {"skipped": "no previous pair: nothing runs"}
        if tgt.expected is None:
            raise PackageError(
                f"cannot verify {tgt.activation.native_package} / {tgt.activation.rpc_package}: "
                "their manifests are not in the local package store"
            )
        ident = ctx.hosts.identity(role)
        seen = {role: ident} if ident is not None else None
        rep = verify_identity(
            {role: ctx.t(role)},
            ctx.view.layouts,
            ctx.view.hosts,
            tgt.expected,
            base_url=ctx.view.base_url,
            api_key=step.key.value if step.key is not None else None,
            roles=(role,),
            seen=seen,
        )
        ctx.journal.identity(ctx.host(role), {**rep.data, "problems": rep.problems, "label": tgt.activation.label})
        if rep.problems:
            raise CheckFailed("identity does not match: " + "; ".join(rep.problems))
        return {"identity": "verified", **{k: v for k, v in rep.data.items() if k == "server"}}


class Accept(Action, name="accept", local=True, uses_pair=True, uses_key=True):
    """Acceptance checks (orchestrator.checks.suite) or identity only."""

    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        return "acceptance checks: " + (", ".join(p.checks) if p.checks else "the suite's defaults"), {}

    def execute(self, ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
        from orchestrator.engine import acceptance

        tgt = step.pair
        if tgt is not None and not ctx.inputs.options.skip_accept:
            # the suite's requests are bounded (checks/budget.py): the next heartbeat comes within
            # the whole suite's bound, announced in the lease so nobody judges this run dead meanwhile
            bound = acceptance.suite_bound_s(tgt.entry.profile)
            for r in ("native", "rpc"):
                before_change(ctx, r, step, next_within_s=bound)
        return acceptance.run(ctx, step)
