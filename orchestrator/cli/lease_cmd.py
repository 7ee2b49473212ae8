"""`pairctl lease take|show|release HOST|PAIR`: exclusive, expiring holds on hosts.

A pair name means both of its hosts, taken in one fixed order with one nonce; only its holder
releases it, or `release --dead-run RUN_ID` once that run is proven over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli.context import Ctx, evidence_store_for, get_ctx
from orchestrator.errors import LeaseError

if TYPE_CHECKING:
    from orchestrator.evidence.journal import Journal
    from orchestrator.hosts import leases as L


app = typer.Typer(help="Take, show and release host leases (atomic on the host, expiring).", no_args_is_help=True)

_TARGET = typer.Argument(
    None, metavar="HOST|PAIR", help="The same as --pair PAIR or --host HOST: a pair name, or a host name."
)
_PAIR = typer.Option(None, "--pair", metavar="PAIR", help="Both hosts of this pair (as every other command names it).")
_HOST = typer.Option(None, "--host", metavar="HOST", help="This one host.")


def _target(c: Ctx, positional: str | None, pair: str | None, host: str | None) -> str:
    """The pair or host named by --pair / --host, or (the older form) positionally; exactly one."""
    given = [v for v in (positional, pair, host) if v is not None]
    if len(given) != 1:
        raise typer.BadParameter("name one pair (--pair PAIR) or one host (--host HOST)", param_hint="--pair")
    inv = c.inventory()
    if pair is not None:
        inv.pair(pair)  # the inventory's own "no pair named ..." error (exit 3)
    if host is not None:
        inv.host(host)
    # no deprecation note for the positional form: pairctl's own hints print `lease release PAIR ...`
    return given[0]


def _journal(c: Ctx, command: str, argv: list[str], target: str) -> Journal:
    return evidence_store_for(c).begin(command=command, argv=argv, pair=None, inputs={"target": target})


def _table(c: Ctx, states: list[L.LeaseState], title: str) -> None:
    from rich.table import Table

    from orchestrator.hosts import leases as L

    t = Table("host", "state", "owner", "purpose", "taken", "expires", "left", title=title)
    for s in states:
        lease = s.lease
        if lease is None:
            t.add_row(
                s.host, s.state, "-", "-", "-", "-", "-" if s.lock_age_s is None else f"lock age {s.lock_age_s:.0f}s"
            )
        else:
            left = s.remaining_s() or 0.0  # by the host's clock
            t.add_row(
                s.host,
                s.state,
                lease.owner,
                lease.purpose,
                L._iso(lease.taken_at),
                L._iso(lease.expires_at),
                f"{left / 60:.0f} min" if left > 0 else "expired",
            )
    c.console.print(t)


@app.command("take")
def take(
    ctx: typer.Context,
    positional: str | None = _TARGET,
    pair: str | None = _PAIR,
    host: str | None = _HOST,
    purpose: str = typer.Option(..., "--purpose", help="Why you hold it (shown to anyone refused)."),
    ttl: str = typer.Option("2h", "--ttl", help="How long until it expires: 90s, 30m, 2h, 1h30m, 1d."),
    owner: str = typer.Option(None, "--owner", help="Who holds it; default user@machine."),
    break_expired: bool = typer.Option(
        False, "--break-expired", help="Break an EXPIRED (or long half-made) lease first; recorded."
    ),
) -> None:
    """Take the lease of a host or of both hosts of a pair; prints the nonce needed to release it."""
    from orchestrator.durations import parse_duration
    from orchestrator.hosts import leases as L

    c = get_ctx(ctx)
    target = _target(c, positional, pair, host)
    ttl_s = parse_duration(ttl, what="--ttl")
    owner = owner or L.default_owner()
    L.check_request(owner, purpose, ttl_s)  # a bad request reaches no host
    from orchestrator.remote.pool import TransportPool

    inv = c.inventory()
    hosts = L.hosts_of(inv, target)
    argv = ["lease", "take", target, "--purpose", purpose, "--ttl", ttl] + (
        ["--break-expired"] if break_expired else []
    )
    with TransportPool(inv) as pool, _journal(c, "lease take", argv, target) as j:
        with j.step("take", host=",".join(hosts)) as step:
            try:
                leases = L.take_leases(
                    L.targets_of(inv, pool, target), owner, purpose, ttl_s, break_expired=break_expired
                )
            except LeaseError as exc:  # the hint names the pair the holder's run leased, not a literal PAIR
                owner_pair = (n for n, p in inv.pairs.items() if target in (p.native, p.rpc))
                pair = target if target in inv.pairs else next(owner_pair, target)
                if exc.hint:
                    exc.hint = exc.hint.replace("lease release PAIR", f"lease release {pair}")
                raise
            step.data["leases"] = [lease.public() for lease in leases]
            step.data["broken"] = [lease.broken for lease in leases if lease.broken]
    nonce = leases[0].nonce
    if c.json_output:
        c.emit_json({"nonce": nonce, "leases": [lease.public() for lease in leases], "receipt": j.receipt_hash})
        return
    for lease in leases:
        if lease.broken:
            c.line(
                f"broke an {lease.broken['state']} lease on {lease.host} "
                f"(recorded in receipt {c.short(j.receipt_hash)})"
            )
    _table(c, [L.LeaseState(lease.host, "held", lease, now=lease.taken_at) for lease in leases], f"leased {target}")
    c.line(f"nonce: {nonce}")


@app.command("show")
def show(
    ctx: typer.Context, positional: str | None = _TARGET, pair: str | None = _PAIR, host: str | None = _HOST
) -> None:
    """Who holds the host(s), for what, until when (never the nonce)."""
    from orchestrator.hosts import leases as L

    c = get_ctx(ctx)
    target = _target(c, positional, pair, host)
    from orchestrator.remote.pool import TransportPool

    inv = c.inventory()
    with TransportPool(inv) as pool:
        states = L.show_leases(inv, pool, target)
    if c.json_output:
        c.emit_json([s.to_dict() for s in states])
        return
    _table(c, states, f"leases of {target}")


@app.command("release")
def release(
    ctx: typer.Context,
    positional: str | None = _TARGET,
    pair: str | None = _PAIR,
    host: str | None = _HOST,
    nonce: str = typer.Option(None, "--nonce", help="The nonce `lease take` printed."),
    dead_run: str = typer.Option(
        None,
        "--dead-run",
        metavar="RUN_ID",
        help="Release what run RUN_ID (the `(run ...)` in the lease's purpose, as `status` shows it) still holds, "
        "once this home's evidence proves that run over: killed, or ended (a failed rollback keeps its "
        "leases on purpose: release them only after checking the pair). No nonce needed; recorded.",
    ),
) -> None:
    """Release the lease(s) holding NONCE, then read back that they are inactive.

    With --dead-run instead, release the leases a killed or finished pairctl run left behind
    (its nonce died with it), refusing unless the run is over and every lease it names is its own.
    """
    from orchestrator.hosts import leases as L

    c = get_ctx(ctx)
    target = _target(c, positional, pair, host)
    if (nonce is None) == (dead_run is None):
        raise typer.BadParameter("give exactly one of --nonce or --dead-run RUN_ID", param_hint="--nonce/--dead-run")
    if dead_run is not None:
        return _release_dead_run(c, target, dead_run)
    from orchestrator.remote.pool import TransportPool

    inv = c.inventory()
    hosts = L.hosts_of(inv, target)
    with TransportPool(inv) as pool, _journal(c, "lease release", ["lease", "release", target], target) as j:
        with j.step("release", host=",".join(hosts)) as step:
            released = L.release_leases(L.targets_of(inv, pool, target), nonce)
            after = L.show_leases(inv, pool, target)
            step.data["released"] = [lease.public() for lease in released]
            step.data["after"] = [s.to_dict() for s in after]
    out = {
        "released": [lease.public() for lease in released],
        "after": [s.to_dict() for s in after],
        "receipt": j.receipt_hash,
    }
    if c.json_output:
        c.emit_json(out)
        return
    for lease in released:
        c.line(f"released {lease.host} (held by {lease.owner} for {lease.purpose!r})")
    _table(c, after, f"leases of {target} now")


def _release_dead_run(c: Ctx, target: str, run_id: str) -> None:
    """Prove the run over from the evidence store, check every host before touching any, then break
    that run's lease on each host that still has it (atomic rename, re-checked; see leases._break)."""
    from orchestrator.errors import LeaseError, LeaseHeldError
    from orchestrator.hosts import leases as L
    from orchestrator.remote.pool import TransportPool

    inv = c.inventory()
    hosts = L.hosts_of(inv, target)
    state, why, run_owner = evidence_store_for(c).run_record(run_id)
    # another operator's run: this home has no evidence of it, the hosts' heartbeats decide
    if state == "running":
        raise LeaseHeldError(
            f"run {run_id} is not proven over ({why}); its leases are left alone",
            hint="wait for it to end; an expired lease can also be broken with `lease take --break-expired`",
        )
    on_hosts = state not in ("ended", "dead")
    argv = ["lease", "release", target, "--dead-run", run_id]
    with TransportPool(inv) as pool:
        targets = L.targets_of(inv, pool, target)
        L.reach_all(targets)
        states = [L.lease_state(t.transport, t.install_root) for t in targets]
        if on_hosts:
            state, why = "stale", L.stale_proof(states, run_id, evidence_says=why)
        theirs = [s for s in states if s.lease is not None and L.run_of(s.lease) == run_id]
        others = [s for s in states if not s.free and s not in theirs]
        if others:
            detail = "; ".join(s.describe() for s in others)
            raise LeaseError(f"not every lease on {target} is run {run_id}'s; nothing released: {detail}")
        if not theirs:
            raise LeaseError(
                f"run {run_id} holds no lease on {target} (" + "; ".join(s.describe() for s in states) + ")"
            )
        # the run's verified evidence must name the lease's owner, so a receipt planted in this home
        # cannot free someone else's lease (a run proven over by stale heartbeats has no evidence here)
        foreign = [] if on_hosts else [s for s in theirs if s.lease is not None and s.lease.owner != run_owner]
        if foreign:
            raise LeaseHeldError(
                f"run {run_id}'s evidence here names owner {run_owner or '(none)'}, but the lease on "
                + ", ".join(f"{s.host} is held by {s.lease.owner}" for s in foreign if s.lease is not None)
                + "; nothing released",
                hint="release it from the machine and account that ran it",
            )
        with _journal(c, "lease release", argv, target) as j:
            with j.step("release-dead-run", host=",".join(hosts)) as step:
                step.data["run"] = {"run_id": run_id, "state": state, "why": why}
                broken, me, over = [], L.default_owner(), f"run over: {why}"
                for t in targets:
                    b = L.break_run_lease(t.transport, t.install_root, run_id, by=me, why=over, require_stale=on_hosts)
                    if b is not None:
                        broken.append(b)
                after = L.show_leases(inv, pool, target)
                step.data["released"] = broken
                step.data["after"] = [s.to_dict() for s in after]
    out = {
        "run": {"run_id": run_id, "state": state, "why": why},
        "released": broken,
        "after": [s.to_dict() for s in after],
        "receipt": j.receipt_hash,
    }
    if c.json_output:
        c.emit_json(out)
        return
    c.line(f"{why}")
    for b in broken:
        c.line(f"released {b['host']} (left by run {run_id}; recorded in receipt {c.short(j.receipt_hash)})")
    _table(c, after, f"leases of {target} now")
