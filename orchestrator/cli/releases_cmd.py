"""`pairctl releases list|prune --pair P`: the releases on a pair's hosts (a read), and removing
the oldest beyond `keep_releases` under both hosts' leases, with a receipt."""

from __future__ import annotations

import typer
from rich.table import Table

from orchestrator.cli.context import Ctx, evidence_store_for, get_ctx
from orchestrator.errors import HostError
from orchestrator.hosts import leases as L
from orchestrator.hosts import prune as P
from orchestrator.remote.pool import TransportPool
from orchestrator.terminal import size

app = typer.Typer(help="List a pair's releases on its hosts, and prune the oldest.", no_args_is_help=True)

_PAIR = typer.Option(..., "--pair", help="The pair whose two hosts to look at.")
_KEEP = typer.Option(None, "--keep", min=1, help="Releases to keep per host; default: the inventory's keep_releases.")


def _print(c: Ctx, results: list[P.HostPrune], title: str) -> None:
    t = Table(title=title)
    for col in ("host", "release", "state"):
        t.add_column(col, overflow="fold")
    for r in results:
        if r.plan is None:
            t.add_row(r.host, "-", f"skipped: {r.skipped}")
            continue
        removed = {x["release"]: x["bytes"] for x in r.removed}
        for rel in r.plan.keep:
            t.add_row(r.host, rel, "keep" + (f" ({r.plan.protected[rel]})" if rel in r.plan.protected else ""))
        for rel in r.plan.remove:
            t.add_row(r.host, rel, f"removed ({size(removed[rel])})" if rel in removed else "remove")
    c.console.print(t)


@app.command("list")
def list_releases(ctx: typer.Context, pair: str = _PAIR, keep: int | None = _KEEP) -> None:
    """Every release on the pair's hosts, newest first, with what a prune would keep and remove."""
    c = get_ctx(ctx)
    inv = c.inventory()
    with TransportPool(inv) as pool:
        results = P.prune_pair(inv, pool.get, pair, keep_releases=keep, dry_run=True)
    if c.json_output:
        c.emit_json(P.summary(results))
    else:
        _print(c, results, f"releases of {pair} (keep {keep or inv.keep_releases} per host)")
    _raise_skipped(results)


def _raise_skipped(results: list[P.HostPrune]) -> None:
    if any(r.skipped for r in results):
        raise HostError("; ".join(f"{r.host}: {r.skipped}" for r in results if r.skipped))


@app.command("prune")
def prune(
    ctx: typer.Context,
    pair: str = _PAIR,
    keep: int | None = _KEEP,
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed; change nothing."),
) -> None:
    """Remove the oldest releases beyond keep_releases on both hosts, under their leases; receipted."""
    c = get_ctx(ctx)
    inv = c.inventory()
    if dry_run:
        return list_releases(ctx, pair=pair, keep=keep)

    argv = ["releases", "prune", "--pair", pair] + (["--keep", str(keep)] if keep else [])
    with (
        TransportPool(inv) as pool,
        evidence_store_for(c).begin(command="releases prune", argv=argv, pair=pair, inputs={"pair": pair}) as j,
    ):
        with L.hold_pair_leases(L.targets_of(inv, pool, pair), owner=L.default_owner(), purpose="releases prune"):
            with j.step("prune", host=pair) as step:
                results = P.prune_pair(inv, pool.get, pair, keep_releases=keep)
                step.data.update(P.summary(results))
            j.set("prune", P.summary(results))
        _raise_skipped(results)
    s = P.summary(results)
    if c.json_output:
        c.emit_json({**s, "receipt": j.receipt_hash})
        return
    _print(c, results, f"pruned {pair}: {s['removed']} release(s), {size(s['bytes_freed'])} freed")
    c.line(f"receipt {j.receipt_hash}")
