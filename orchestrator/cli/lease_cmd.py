"""`pairctl lease take|show|release HOST|PAIR`: exclusive, expiring holds on hosts.

A pair name means both of its hosts, taken in one fixed order with one nonce (the first is
given back if the second is held). `take` prints the nonce: only its holder can release.
`take` and `release` write a receipt (without the nonce); breaking an expired lease is in it.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from orchestrator.cli.context import Ctx, get_ctx
from orchestrator.hosts import leases as L

app = typer.Typer(help="Take, show and release host leases (atomic on the host, expiring).", no_args_is_help=True)

_TARGET = typer.Argument(..., metavar="HOST|PAIR", help="A host name, or a pair name (both of its hosts).")
_JSON = typer.Option(False, "--json", help="Machine-readable output on stdout.")


def _journal(c: Ctx, command: str, argv: list[str], target: str):
    from orchestrator.evidence.store import EvidenceStore

    return EvidenceStore(c.home.evidence).begin(command=command, argv=argv, pair=None, inputs={"target": target})


def _table(c: Ctx, states: list[L.LeaseState], title: str) -> None:
    t = Table(title=title)
    for col in ("host", "state", "owner", "purpose", "taken", "expires", "left"):
        t.add_column(col)
    for s in states:
        l = s.lease
        if l is None:
            t.add_row(s.host, s.state, "-", "-", "-", "-",
                      "-" if s.lock_age_s is None else f"lock age {s.lock_age_s:.0f}s")
        else:
            left = l.remaining_s()
            t.add_row(s.host, s.state, l.owner, l.purpose, L._iso(l.taken_at), L._iso(l.expires_at),
                      f"{left / 60:.0f} min" if left > 0 else "expired")
    c.console.print(t)


@app.command("take")
def take(
    ctx: typer.Context,
    target: str = _TARGET,
    purpose: str = typer.Option(..., "--purpose", help="Why you hold it (shown to anyone refused)."),
    ttl: str = typer.Option("2h", "--ttl", help="How long until it expires: 90s, 30m, 2h, 1h30m, 1d."),
    owner: str = typer.Option(None, "--owner", help="Who holds it; default user@machine."),
    break_expired: bool = typer.Option(False, "--break-expired", help="Break an EXPIRED (or long half-made) lease first; recorded."),
    json_output: bool = _JSON,
) -> None:
    """Take the lease of a host or of both hosts of a pair; prints the nonce needed to release it."""
    c = get_ctx(ctx)
    ttl_s = L.parse_duration(ttl)
    owner = owner or L.default_owner()
    from orchestrator.remote.transport import TransportPool

    inv = c.inventory()
    hosts = L.hosts_of(inv, target)
    argv = ["lease", "take", target, "--purpose", purpose, "--ttl", ttl] + (["--break-expired"] if break_expired else [])
    with TransportPool(inv) as pool, _journal(c, "lease take", argv, target) as j:
        with j.step("take", host=",".join(hosts)) as step:
            leases = L.take_leases(L.targets_of(inv, pool, target), owner, purpose, ttl_s, break_expired=break_expired)
            step.data["leases"] = [l.public() for l in leases]
            step.data["broken"] = [l.broken for l in leases if l.broken]
    nonce = leases[0].nonce
    if c.json_output or json_output:
        c.emit_json({"nonce": nonce, "leases": [l.public() for l in leases], "receipt": j.receipt_hash})
        return
    for l in leases:
        if l.broken:
            c.console.print(f"broke an {l.broken['state']} lease on {l.host} (recorded in receipt {j.receipt_hash[:12]})", markup=False)
    _table(c, [L.LeaseState(l.host, "held", l) for l in leases], f"leased {target}")
    c.console.print(f"nonce: {nonce}", markup=False)


@app.command("show")
def show(ctx: typer.Context, target: str = _TARGET, json_output: bool = _JSON) -> None:
    """Who holds the host(s), for what, until when (never the nonce)."""
    c = get_ctx(ctx)
    from orchestrator.remote.transport import TransportPool

    inv = c.inventory()
    with TransportPool(inv) as pool:
        states = L.show_leases(inv, pool, target)
    if c.json_output or json_output:
        c.emit_json([s.to_dict() for s in states])
        return
    _table(c, states, f"leases of {target}")


@app.command("release")
def release(
    ctx: typer.Context,
    target: str = _TARGET,
    nonce: str = typer.Option(..., "--nonce", help="The nonce `lease take` printed."),
    json_output: bool = _JSON,
) -> None:
    """Release the lease(s) holding NONCE, then read back that they are inactive."""
    c = get_ctx(ctx)
    from orchestrator.remote.transport import TransportPool

    inv = c.inventory()
    hosts = L.hosts_of(inv, target)
    out: dict[str, Any] = {}
    with TransportPool(inv) as pool, _journal(c, "lease release", ["lease", "release", target], target) as j:
        with j.step("release", host=",".join(hosts)) as step:
            released = L.release_leases(L.targets_of(inv, pool, target), nonce)
            after = L.show_leases(inv, pool, target)
            step.data["released"] = [l.public() for l in released]
            step.data["after"] = [s.to_dict() for s in after]
    out = {"released": [l.public() for l in released], "after": [s.to_dict() for s in after], "receipt": j.receipt_hash}
    if c.json_output or json_output:
        c.emit_json(out)
        return
    for l in released:
        c.console.print(f"released {l.host} (held by {l.owner} for {l.purpose!r})", markup=False)
    _table(c, after, f"leases of {target} now")
