"""Deploy's view of leases: take / re-check / release one host's lease for this run.

One nonce per run for both hosts, the run's purpose text, nonce-free records for receipts. A run under
a caller's lease (qualification) renews it and leaves releasing it to the caller. The promise written
into the lease (`stale_after_s`): renewed at least every `HEARTBEAT_S`, and re-checked (`recheck`:
own nonce, `SAFETY_S` left by the host's clock) before every change, so a run whose lease was broken
while paused stops before its next change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import HostError, LeaseHeldError
from orchestrator.hosts import leases, space
from orchestrator.remote.transport import Transport

if TYPE_CHECKING:
    from orchestrator.engine.context import RunEnv
    from orchestrator.hosts.leases import Lease

DEFAULT_TTL_S = 1800
HEARTBEAT_S = 600  # longer than any step but acceptance waits (upload 600 s is bounded the same way)
SAFETY_S = 60.0  # a lease with less left could be broken between the re-check and the change


def take(ctx: RunEnv, role: str) -> Lease:
    if ctx.lease_held_by_caller:
        return leases.renew_lease(ctx.t(role), ctx.layout(role).root, ctx.hosts.lease_nonce(), DEFAULT_TTL_S)
    command = ctx.journal.state.header.get("command", "deploy")

    def once() -> Lease:
        return leases.take_lease(
            ctx.t(role),
            ctx.layout(role).root,
            leases.default_owner(),
            f"pairctl {command} {ctx.view.name} (run {ctx.run_id})",
            DEFAULT_TTL_S,
            nonce=ctx.hosts.lease_nonce(),
            stale_after_s=HEARTBEAT_S,
        )

    try:
        return once()
    except LeaseHeldError as exc:  # the hint names the exact command, with this pair's name
        if _free_left_by_unwritable_root(ctx, role):
            return once()
        if exc.hint:
            exc.hint = exc.hint.replace("lease release PAIR", f"lease release {ctx.view.name}")
        raise


def _free_left_by_unwritable_root(ctx: RunEnv, role: str) -> bool:
    """A lease this home's own run left because its root refused the release is freed by this
    home's next run, only when the evidence proves that run over (sealed receipt, in the chain,
    same owner) and records that very refusal on this host; any other lease is left alone."""
    t, root, host = ctx.t(role), ctx.layout(role).root, ctx.host(role)
    st = leases.lease_state(t, root)
    run = leases.run_of(st.lease) if st.lease is not None else None
    if ctx.evidence is None or st.lease is None or run is None:
        return False
    state, why, owner = ctx.evidence.run_record(run)
    if state != "ended" or owner != st.lease.owner:
        return False
    sha = next((s["hash"] for s in ctx.evidence.summaries() if s.get("run_id") == run and s.get("in_chain")), None)
    refused = sha is not None and any(
        s.name == "release-lease" and LEFT_ON_UNWRITABLE in str((s.data.get("errors") or {}).get(host, ""))
        for s in ctx.evidence.load(sha).steps
    )
    if not refused:
        return False
    broken = leases.break_run_lease(
        t, root, run, by=leases.default_owner(), why=f"run over: {why}; {LEFT_ON_UNWRITABLE}"
    )
    ctx.journal.note(f"{host}: freed the lease of this home's run {run} ({why}), which its root refused to release")
    return broken is not None


# what `release` says of a lease the root refused to give back; `take` finds it in that run's receipt
LEFT_ON_UNWRITABLE = "the root refused the release"


def recheck(ctx: RunEnv, role: str, *, next_within_s: float = HEARTBEAT_S, restores: bool = False) -> dict[str, Any]:
    """Immediately before a change on `role`'s host: prove the lease still this run's and renew
    it (heartbeat now, next one within `next_within_s`). LeaseLost (nothing changed) if not."""
    ttl = max(DEFAULT_TTL_S, next_within_s + SAFETY_S)
    t, root, nonce = ctx.t(role), ctx.layout(role).root, ctx.hosts.lease_nonce()
    promise = None if ctx.lease_held_by_caller else int(max(HEARTBEAT_S, next_within_s))
    try:
        lease = leases.renew_lease(t, root, nonce, ttl, min_left_s=SAFETY_S, stale_after_s=promise)
    except HostError as exc:
        if not _unwritable(str(exc), restores):
            raise
        # a full (or, in a rollback, read-only) root cannot take the renewed lease.json, but the
        # lease is still provably this run's (nobody can take one there either): go on, so a rollback is not
        # stopped by the disk it is recovering from (on a read-only RPC root, the rollback of a
        # failed restart-rpc stopped both services although the RPC side never changed)
        st = leases.lease_state(t, root)
        if st.lease is None or st.lease.nonce != nonce or st.state != "held" or (st.remaining_s() or 0) < SAFETY_S:
            raise leases.LeaseLost(
                f"cannot renew on a full or read-only root and the lease is not provably this run's: {st.describe()}"
            ) from None
        return {
            "lease_rechecked": {"expires_at": leases._iso(st.lease.expires_at), "renewed": False, "why": str(exc)[:200]}
        }
    return {"lease_rechecked": {"expires_at": leases._iso(lease.expires_at), "heartbeat": leases._iso(lease.heartbeat)}}


def _unwritable(text: str, restores: bool) -> bool:
    """Full, or (for a rollback) read-only. A deploy on a read-only root stops at its re-check, before the change."""
    return "no space left" in text.lower() or (space.refuses_writes(text) and restores)


def release(ctx: RunEnv, role: str, handle: Lease) -> bool:
    """Release this run's lease; False (left held) when the caller holds it."""
    if ctx.lease_held_by_caller:
        return False
    try:
        leases.release_lease(ctx.t(role), ctx.layout(role).root, ctx.hosts.lease_nonce())
    except HostError as exc:
        if not space.refuses_writes(str(exc)):
            raise
        layout = ctx.layout(role)  # run/ is the state dir's link, or (older layout) a directory in the root
        refused = layout.state if layout.state and ctx.t(role).readlink(layout.run) == layout.state else layout.root
        raise HostError(
            f"{ctx.host(role)}: {layout.leases} takes no new file ({exc.message[:200]}): "
            f"{LEFT_ON_UNWRITABLE}, so run {ctx.run_id}'s lease stays until it is writable again; this "
            f"home's next deploy or rollback of {ctx.view.name} frees it then",
            hint=f"make {refused} writable on {ctx.host(role)} (a read-only "
            f"mount? a full disk?), then `pairctl lease release {ctx.view.name} --dead-run {ctx.run_id}` frees it",
        ) from None
    return True


def describe(handle: Any) -> dict[str, Any]:
    """A lease for receipts and messages: never the nonce (it releases the lease)."""
    if handle is None:
        return {}
    public = getattr(handle, "public", None)
    return dict(public()) if callable(public) else {"lease": str(handle)}


def show(transport: Transport, root: str) -> list[dict[str, Any]]:
    st = leases.lease_state(transport, root)
    return [] if st.free else [st.to_dict()]
