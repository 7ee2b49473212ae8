"""`pairctl deploy`: activate a matched pair, verify it, accept it; roll back on failure.

With `--rev REV` it is a rollout (orchestrator/ops/rollout.py): the packages of REV per pair,
canary first, in waves, each pair through the same single-pair deploy."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import Ctx, get_ctx, resolve_path


def deploy(
    ctx: typer.Context,
    pair: list[str] | None = opts.PAIRS,
    all_pairs: bool = opts.ALL_PAIRS,
    rev: str | None = typer.Option(
        None,
        "--rev",
        metavar="REV",
        help="Deploy the packages built from REV (per pair: its native and RPC targets and profile); a rollout.",
    ),
    source: Path | None = typer.Option(
        None, "--source", metavar="DIR", help="Git repository REV is resolved in (default: the lab source)."
    ),
    canary: str | None = opts.CANARY,
    serial: int = opts.SERIAL,
    max_fail: int = opts.MAX_FAIL,
    pause: float = opts.PAUSE,
    waves: int = opts.WAVES,
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
    """Deploy --native ID + --rpc ID (one revision) on PAIR (playbooks/deploy.yaml), or with --rev REV
    across --pair A --pair B ... | --all: --canary first and alone, then --serial N pairs at a time,
    no new pair after --max-fail K failures; pairs already on REV and accepted are skipped, so a re-run
    continues. Exit 7: failed and rolled back; 8: the rollback failed too (hosts stopped, leases kept).

    \b
    With --rev (a fleet): 0 every pair on REV; 7 some rolled back; 8 any rollback failed;
    5 some skipped because leased; 6 a package of REV is missing (nothing started);
    otherwise the exit code of a pair refused before any change.
    """
    c = get_ctx(ctx)
    if rev is not None:
        if native or rpc or packages:
            raise typer.BadParameter("give --rev or package ids, not both", param_hint="--rev")
        from dataclasses import replace

        from orchestrator.cli.fleet_cmd import run_fleet  # start-up: the engine loads only when a rollout runs
        from orchestrator.ops.rollout import RolloutOptions

        o = RolloutOptions(canary=canary, serial=serial, max_fail=max_fail, pause_s=pause, waves=waves)
        o = replace(o, skip_accept=skip_accept, checks=tuple(opts.check_names(checks)), kernel_check=kernel_check)
        src = resolve_path(source) if source else None
        run_fleet(c, "deploy", pair, all_pairs, o, rev=rev, source=src, profile=profile, dry_run=dry_run)
        return
    if all_pairs or len(pair or []) != 1 or canary:
        raise typer.BadParameter(
            "package ids deploy one pair (--pair P); several pairs or --all deploy a revision (--rev REV)",
            param_hint="--pair",
        )
    ids = opts.package_ids(native, rpc, packages)
    only = tuple(opts.check_names(checks))
    _deploy_one(c, (pair or [""])[0], ids, profile, dry_run, skip_accept, only, kernel_check)


def _deploy_one(c: Ctx, name: str, ids: tuple[str, str], profile: str | None, dry_run: bool, skip_accept: bool,
                checks: tuple[str, ...], kernel_check: bool) -> None:  # fmt: skip
    """One pair onto package ids: the inventory's pre-deploy veto and deploy hook around the
    engine's run (neither for a dry run, which changes nothing), then its plan or its result."""
    # start-up: the engine (SSH stack) loads when a deploy runs, never for `deploy --help`
    from orchestrator.cli.fleet_cmd import failed_run_json, fire_deploy_hook, pre_deploy_veto
    from orchestrator.engine.deploy import deploy as run_deploy
    from orchestrator.engine.render import print_plan, print_result

    inv = c.inventory()
    if not dry_run:
        pre_deploy_veto(c, inv, name, ids, profile)
    with failed_run_json(c, "deploy", name), fire_deploy_hook(c, inv, name, ids, enabled=not dry_run) as hook:
        result = run_deploy(
            c.home,
            inv,
            name,
            ids,
            profile_name=profile,
            dry_run=dry_run,
            skip_accept=skip_accept,
            checks=checks,
            kernel_check=kernel_check,
            argv=["pairctl", *sys.argv[1:]],
        )
        hook["receipt"] = result.receipt
    if c.json_output:
        c.emit_json(result.to_dict())
    elif dry_run:
        print_plan(c.console, result.plan)
    else:
        print_result(c.console, result)
