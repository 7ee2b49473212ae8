"""Deploy's view of leases: take / release / describe one host's lease for this run.

A thin adapter over `orchestrator.hosts.leases` (owned by the leases work), so the engine's
handlers do not depend on that module's exact signatures.
"""

from __future__ import annotations

from typing import Any

PURPOSE = "pairctl {command} {pair} (run {run})"
DEFAULT_TTL_S = 1800


def take(ctx: Any, role: str) -> Any:
    from orchestrator.hosts import leases

    return leases.take_lease(
        ctx.t(role),
        ctx.layout(role).root,
        host=ctx.host(role),
        purpose=PURPOSE.format(command=ctx.journal.state.header.get("command", "deploy"), pair=ctx.view.name, run=ctx.run_id),
        ttl_s=DEFAULT_TTL_S,
    )


def release(ctx: Any, role: str, handle: Any) -> None:
    from orchestrator.hosts import leases

    leases.release_lease(ctx.t(role), ctx.layout(role).root, handle)


def describe(handle: Any) -> dict[str, Any]:
    if handle is None:
        return {}
    for attr in ("as_dict", "to_dict", "model_dump"):
        fn = getattr(handle, attr, None)
        if callable(fn):
            d = dict(fn())
            d.pop("nonce", None)  # the nonce proves ownership: keep it out of receipts
            return d
    return {"lease": str(handle)}
