"""`pairctl accept`: run the acceptance suite against a live pair and write one receipt."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx

if TYPE_CHECKING:
    from orchestrator.checks.runner import AcceptOutcome, AcceptRequest
    from orchestrator.cli.context import Ctx
    from orchestrator.config.inventory import Inventory


def accept(
    ctx: typer.Context,
    pair: list[str] | None = opts.PAIRS,
    all_pairs: bool = opts.ALL_PAIRS,
    parallel: int = opts.parallel(1, "Pairs accepted (each holds its own hosts' leases)"),
    checks: list[str] | None = opts.CHECKS,
    only: list[str] | None = typer.Option(None, "--only", metavar="NAME[,NAME]", help="The same as --checks."),
    skip: list[str] | None = opts.SKIP_CHECKS,
    baseline_receipt: str | None = typer.Option(
        None,
        "--baseline-receipt",
        metavar="HASH",
        help="Compare answer fixtures against this receipt (hash or prefix).",
    ),
    baseline_pair: str | None = typer.Option(
        None,
        "--baseline-pair",
        metavar="PAIR",
        help="Compare against this pair's last passed acceptance (default: the same pair).",
    ),
    fixtures: str | None = typer.Option(
        None,
        "--fixtures",
        metavar="NAME|PATH",
        help="Answer fixture set (manifests/fixtures name or YAML path; default: lab).",
    ),
    isolation: str = typer.Option(
        "solo",
        "--isolation",
        metavar="solo|recall",
        help="Two-lane isolation test: 'solo' (greedy output equals the lane run alone) or 'recall' (answers hold "
        "their own nonce only).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        metavar="NAME|PATH",
        help="Size the checks from this profile (name or YAML) instead of the active one; a pair deployed smaller "
        "than it fails.",
    ),
    scheduled: bool = typer.Option(
        False, "--scheduled", help="Run from a schedule: a leased pair is recorded as skipped (exit 11)."
    ),
) -> None:
    """Run the acceptance checks against PAIR's running llama-server/ggml-rpc-server.

    Every size comes from the active route profile (per-slot context, slack, slots). One receipt
    holds every check's raw data; the table shows verdicts and key figures. Exit 0 only if every
    required check passed, 1 otherwise.
    """
    # start-up: the checks (HTTP client, SSH stack) load when acceptance runs, never for `--help`
    from orchestrator.checks.runner import AcceptRequest, render_table
    from orchestrator.ops.fleet import fan_out, select_pairs

    c = get_ctx(ctx)
    only_names = opts.check_names(checks) + opts.check_names(only, "--only")  # unknown names: exit 2, first
    skip_names = opts.check_names(skip, "--skip")
    inv = c.inventory()
    pairs = select_pairs(inv, pair, all_pairs)

    def one(name: str) -> AcceptOutcome:
        req = AcceptRequest(
            pair=name,
            only=only_names,
            skip=skip_names,
            baseline_receipt=baseline_receipt,
            baseline_pair=baseline_pair,
            fixtures=fixtures,
            isolation=isolation,
            scheduled=scheduled,
            profile=profile,
        )
        return _accept_one(c, inv, req)

    if len(pairs) == 1 and not all_pairs:
        outcome = one(pairs[0])
        if c.json_output:
            c.emit_json(outcome.as_dict())
        else:
            render_table(c.console, outcome)
        outcome.raise_for_verdict()
        return
    # Several pairs: one receipt each, one pair's failure never stops the others.
    results = fan_out(pairs, one, parallel=parallel, ok=lambda o: o.suite.passed)
    if c.json_output:
        c.emit_json(results.as_dict())
    else:
        for o in results.outcomes:
            if o.value is not None:
                render_table(c.console, o.value)
            else:
                c.line(f"pair {o.pair}: {o.error}")
        c.line(", ".join(f"{o.pair}: {'passed' if o.ok else 'FAILED'}" for o in results.outcomes))
    if not results.ok:
        raise typer.Exit(results.exit_code())


def _accept_one(c: Ctx, inv: Inventory, req: AcceptRequest) -> AcceptOutcome:
    """One pair's acceptance. A scheduled run also tells the inventory's hooks when it was skipped
    (a leased pair) or failed, since nobody is watching its output."""
    from orchestrator.checks.runner import accept_pair
    from orchestrator.errors import Skipped
    from orchestrator.ops.hooks import event_document, run_hooks

    if not req.scheduled or not inv.hooks:
        return accept_pair(c.home, inv, req)
    name = req.pair
    try:
        got = accept_pair(c.home, inv, req)
    except Skipped as exc:
        text = f"pairctl scheduled accept {name}: skipped ({exc.message})"
        run_hooks(c.home, inv, event_document("accept.scheduled_skipped", text, pair=name, reason=exc.message))
        raise
    if not got.suite.passed:
        bad = ", ".join(r.name for r in got.suite.failed())
        text = f"pairctl scheduled accept {name}: FAILED ({bad})"
        doc = event_document("accept.scheduled_failed", text, pair=name, failed=bad, receipt=got.receipt)
        run_hooks(c.home, inv, doc)
    return got
