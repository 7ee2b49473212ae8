"""Deploy's view of leases: take / release / show one host's lease for this run.

A thin adapter over `orchestrator.hosts.leases` (take_lease / release_lease / lease_state):
one nonce per run for both hosts, the run's purpose text, and lease records without nonces
for receipts. A run started under a caller's lease (`ctx.lease_held_by_caller`: qualification
holds the pair across its arms) renews that lease instead of taking one, and leaves releasing
it to the caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.engine.context import RunContext
    from orchestrator.hosts.leases import Lease

DEFAULT_TTL_S = 1800


def take(ctx: RunContext, role: str) -> Lease:
    from orchestrator.hosts import leases

    if ctx.lease_held_by_caller:
        return leases.renew_lease(ctx.t(role), ctx.layout(role).root, ctx.hosts.lease_nonce(), DEFAULT_TTL_S)
    command = ctx.journal.state.header.get("command", "deploy")
    return leases.take_lease(
        ctx.t(role), ctx.layout(role).root, leases.default_owner(),
        f"pairctl {command} {ctx.view.name} (run {ctx.run_id})", DEFAULT_TTL_S, nonce=ctx.hosts.lease_nonce(),
    )


def release(ctx: RunContext, role: str, handle: Lease) -> bool:
    """Release this run's lease; False (left held) when the caller holds it."""
    from orchestrator.hosts import leases

    if ctx.lease_held_by_caller:
        return False
    leases.release_lease(ctx.t(role), ctx.layout(role).root, ctx.hosts.lease_nonce())
    return True


def describe(handle: Any) -> dict[str, Any]:
    """A lease for receipts and messages: never the nonce (it releases the lease)."""
    if handle is None:
        return {}
    public = getattr(handle, "public", None)
    return dict(public()) if callable(public) else {"lease": str(handle)}


def show(transport: Any, root: str) -> list[dict[str, Any]]:
    from orchestrator.hosts import leases

    st = leases.lease_state(transport, root)
    return [] if st.free else [st.to_dict()]
