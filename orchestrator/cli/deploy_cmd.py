"""`pairctl deploy`: activate a matched pair, verify it, accept it; roll back on failure."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx


def deploy(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    native: str | None = opts.NATIVE,
    rpc: str | None = opts.RPC,
    packages: tuple[str, str] | None = opts.PACKAGES,
    profile: str | None = opts.PROFILE,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every step and its host; change nothing."),
    skip_accept: bool = typer.Option(False, "--skip-accept", help="Identity checks only, no acceptance suite."),
    checks: list[str] | None = opts.CHECKS,
    kernel_check: bool = typer.Option(
        False,
        "--kernel-check",
        help="Run the packages' kernel validation cases on both hosts after upload, before anything running changes.",
    ),
) -> None:
    """Deploy --native ID + --rpc ID (one revision) on PAIR (playbooks/deploy.yaml). Exit 7: failed
    and rolled back; 8: the rollback failed too (hosts stopped, leases kept)."""
    ids = opts.package_ids(native, rpc, packages)
    # start-up: the engine (SSH stack) loads when a deploy runs, never for `deploy --help`
    from orchestrator.engine.deploy import deploy as run_deploy
    from orchestrator.engine.render import print_plan, print_result, progress_printer

    c = get_ctx(ctx)
    result = run_deploy(
        c.home,
        c.inventory(),
        pair,
        ids,
        profile_name=profile,
        dry_run=dry_run,
        skip_accept=skip_accept,
        checks=tuple(opts.names(checks)),
        kernel_check=kernel_check,
        argv=["pairctl", *sys.argv[1:]],
        on_step=None if c.json_output else progress_printer(c.console),
    )
    if c.json_output:
        c.emit_json(result.to_dict())
    elif dry_run:
        print_plan(c.console, result.plan)
    else:
        print_result(c.console, result)
