"""`pairctl diff`: what runs against what the inventory and a profile ask now (a read)."""

from __future__ import annotations

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx


def diff(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    profile: str | None = typer.Option(
        None, "--profile", metavar="NAME|PATH", help="The profile to compare with (default: the pair's own)."
    ),
    native: str | None = typer.Option(
        None, "--native", metavar="ID", help="Compare with this native package (default: the active pair's)."
    ),
    rpc: str | None = typer.Option(
        None, "--rpc", metavar="ID", help="Compare with this RPC package (default: the active pair's)."
    ),
) -> None:
    """Show, per host, the running service's argv against the argv a deploy would start now from
    the inventory and the profile (a unified diff, one flag and its values a line; `-` what runs,
    `+` what would run). What `deploy --dry-run` would change in what runs, before deploying.

    \b
    A read: no lease, no receipt. Exit 0 no difference; 1 they differ (like diff(1));
    3 unknown pair, profile or package; 4 a host unreachable; 6 never deployed and no packages named.
    With --json: {pair, profile, same, hosts: {HOST: {running_argv, wanted_argv, diff, same, ...}}}."""
    from orchestrator.engine.diff import pair_diff
    from orchestrator.errors import UsageError

    c = get_ctx(ctx)
    if (native is None) != (rpc is None):
        raise UsageError("--native and --rpc go together (a pair is two packages of one revision)")
    inv = c.inventory()
    out = pair_diff(c.home, inv, pair, profile=profile, packages=(native, rpc) if native and rpc else None)
    if c.json_output:
        c.emit_json(out)
    else:
        for host, h in out["hosts"].items():
            if h["same"]:
                c.line(f"{host}: {h['service']} runs what {out['profile']} asks: no difference")
                continue
            for line in h["diff"] or [
                f"{host}: current is {h['current']}, {out['profile']} asks {h['wanted_release']}"
            ]:
                c.line(line)
    if not out["same"]:
        raise typer.Exit(1)
