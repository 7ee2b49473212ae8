"""Deploy's view of leases: take / release / show one host's lease for this run.

A thin adapter over `orchestrator.hosts.leases` (take_lease / release_lease / lease_state):
one nonce per run for both hosts, the run's purpose text, and lease records without nonces
for receipts. A run started under a caller's lease (`ctx.lease_held_by_caller`: qualification
holds the pair across its arms) renews that lease instead of taking one, and leaves releasing
it to the caller.
"""

from __future__ import annotations

from typing import Any

DEFAULT_TTL_S = 1800


def _nonce(ctx: Any) -> str:
    from orchestrator.hosts import leases

    with ctx._lock:
        n = getattr(ctx, "lease_nonce", None)
        if n is None:
            n = leases.new_nonce()
            ctx.lease_nonce = n
        return n


def take(ctx: Any, role: str) -> Any:
    from orchestrator.hosts import leases

    if ctx.lease_held_by_caller:
        return leases.renew_lease(ctx.t(role), ctx.layout(role).root, ctx.lease_nonce, DEFAULT_TTL_S)
    command = ctx.journal.state.header.get("command", "deploy")
    return leases.take_lease(
        ctx.t(role), ctx.layout(role).root, leases.default_owner(),
        f"pairctl {command} {ctx.view.name} (run {ctx.run_id})", DEFAULT_TTL_S, nonce=_nonce(ctx),
    )


def release(ctx: Any, role: str, handle: Any) -> bool:
    """Release this run's lease; False (left held) when the caller holds it."""
    from orchestrator.hosts import leases

    if ctx.lease_held_by_caller:
        return False
    leases.release_lease(ctx.t(role), ctx.layout(role).root, ctx.lease_nonce)
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
