"""`pairctl doctor`: is this machine ready to run pairctl jobs?"""

from __future__ import annotations

import typer

from orchestrator.cli.context import get_ctx
from orchestrator.errors import CheckFailed, ConfigError


def doctor(
    ctx: typer.Context,
    target: list[str] | None = typer.Option(
        None,
        "--target",
        "-t",
        metavar="NAME|PATH",
        help="Targets you plan to build (default cpu-lab); checks their toolchains.",
    ),
    no_inventory: bool = typer.Option(False, "--no-inventory", help="Skip the inventory's keys and known_hosts."),
    hosts: bool = typer.Option(
        False, "--hosts", help="Also connect to each inventory host and name the programs pairctl needs there."
    ),
) -> None:
    """Check SSH keys, known_hosts entries for every host, and toolchains for the targets; say what to fix.
    With --hosts, also the programs pairctl runs on each host (by package, and what each is for)."""
    from rich.table import Table

    from orchestrator.config.targets import load_target
    from orchestrator.ops.doctor import run_doctor

    c = get_ctx(ctx)
    targets = [load_target(t) for t in (target or ["cpu-lab"])]
    inv = None
    if not no_inventory:
        try:
            inv = c.inventory()
        except ConfigError as exc:
            raise ConfigError(f"inventory: {exc}") from None
    if hosts and inv is not None:
        from orchestrator.remote.pool import TransportPool

        with TransportPool(inv) as pool:
            findings = run_doctor(inv, targets, {h: pool.get(h) for h in sorted(inv.hosts)})
    else:
        findings = run_doctor(inv, targets)
    bad = [f for f in findings if not f.ok]
    if c.json_output:
        c.emit_json([f.as_dict() for f in findings])
    else:
        t = Table("check", "ok", "detail", "fix")
        for f in findings:
            t.add_row(f.check, "yes" if f.ok else "NO", f.detail, f.fix)
        c.console.print(t)
    if bad:
        raise CheckFailed(f"{len(bad)} problem(s): " + "; ".join(f"{f.check}: {f.fix or f.detail}" for f in bad))
