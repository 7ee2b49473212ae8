"""What the actions share before a change (the lease re-check, the refusal of a host lost just
before the first change) and what a failed rollback does after (links back, both services stopped).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.engine import leasing
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Step
from orchestrator.errors import HostError
from orchestrator.hosts import services
from orchestrator.hosts.layout import SERVICE_OF_ROLE, switch_links
from orchestrator.roles import ROLES


class UnreachableBeforeChange(HostError):
    """A host did not answer just before the first change (RPC probe, or a native stop never started)."""

    nothing_changed = True


def before_change(
    ctx: RunEnv, role: str, step: Step | None = None, *, next_within_s: float = leasing.HEARTBEAT_S
) -> None:
    """Immediately before a change on `role`'s host: the lease is still this run's (renewed), else LeaseLost."""
    leasing.recheck(ctx, role, next_within_s=next_within_s, restores=step is not None and "restore" in step.may)


def links_back(ctx: RunEnv, restore_links: Mapping[str, tuple[str | None, str | None]]) -> dict[str, str]:
    """Best effort after a failed rollback of a deploy: the links it switched go back as found (by
    rename, under its lease), only when every such host answers, never leaving a mixed pair."""
    switched = ctx.recorder.switched_roles()
    changed = [r for r in ROLES if r in switched and restore_links.get(r, (None, None))[0]]
    if not changed:
        return {"links": "none switched by this deploy"}
    for role in changed:
        try:
            leasing.recheck(ctx, role, restores=True)  # after a failed rollback
        except Exception as exc:
            return {"links": f"left as they are ({ctx.host(role)} did not answer: {str(exc)[:200]})"}
    out = {}
    for role in changed:
        cur, prev = restore_links[role]
        try:
            switch_links(ctx.t(role), ctx.layout(role), cur, prev)
            out[ctx.host(role)] = f"current {cur}, previous {prev}"
        except Exception as exc:  # keep going: the other host must get its links back too
            out[ctx.host(role)] = f"links left: {exc}"
    return out


def stop_everything(ctx: RunEnv) -> dict[str, str]:
    """Best effort, native first: used when a rollback fails (never leave a half-running pair)."""
    out = {}
    for role in ROLES:
        try:
            out[ctx.host(role)] = services.stop(ctx.t(role), ctx.layout(role), SERVICE_OF_ROLE[role])[0]
        except (HostError, OSError, Exception) as exc:  # keep going: the other host must stop too
            out[ctx.host(role)] = f"stop failed: {exc}"
    return out
