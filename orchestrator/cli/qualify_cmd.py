"""`pairctl qualify` (a qualification or `--calibrate`) and `pairctl qualify report`; exit codes in the app's help."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import Ctx, evidence_store_for, get_ctx
from orchestrator.errors import CheckFailed, ConfigError, Inconclusive

if TYPE_CHECKING:
    from orchestrator.qualify.analysis import QualifyResult

app = typer.Typer(
    help="Paired baseline/candidate TG qualification: declared gates decided by a Student-t interval on the "
    "per-pair log ratios (the exact percentile bootstrap is reported beside it), judged by an A/A "
    "calibration (`--calibrate`) of the pair's noise.\n\n"
    "The pair's two leases are held from the snapshot of what runs until it is restored (every arm's "
    "deploy renews them), so nothing else changes the pair between arms; a pair leased by another run "
    "is waited for up to 5 minutes, then refused (exit 5).\n\n"
    "Exit codes: 0 every gate passed; 1 a gate failed; 3 a fixture does not fit the profile, or no calibration "
    "where the plan needs one; 5 the pair "
    "stayed leased; 6 a package is missing; 8 the pair was not restored (the samples are kept: "
    "`receipts derive` then `qualify report`); 9 inconclusive (missing pairs, or refused before the first sample: "
    "a gate cannot reach its declared power at the calibrated noise; or the run drifted: its baseline moved, or "
    "its noise left the calibration's, and no gate failed beyond doubt).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@app.callback()
def qualify(
    ctx: typer.Context,
    pair: str | None = typer.Option(None, "--pair", metavar="PAIR", help="Pair name in the inventory."),
    baseline: tuple[str, str] | None = typer.Option(
        None, "--baseline", metavar="NATIVE_ID RPC_ID", help="Baseline package ids (an id never starts with '-')."
    ),
    candidate: tuple[str, str] | None = typer.Option(
        None, "--candidate", metavar="NATIVE_ID RPC_ID", help="Candidate package ids (an id never starts with '-')."
    ),
    plan: str | None = typer.Option(
        None, "--plan", metavar="NAME|PATH", help="Plan name (manifests/plans) or YAML path."
    ),
    profile: str | None = opts.PROFILE,
    candidate_profile: str | None = typer.Option(
        None,
        "--candidate-profile",
        metavar="NAME|PATH",
        help="Route profile of the candidate arms only (default: --profile).",
    ),
    calibrate: bool = typer.Option(
        False,
        "--calibrate",
        help="A/A calibration: the baseline in both arms, the plan's calibration pairs; "
        "records the noise floor and the pairs each gate needs (no --candidate).",
    ),
    calibration: str | None = typer.Option(
        None,
        "--calibration",
        metavar="HASH",
        help="Calibration receipt to judge the plan by (default: the newest matching one).",
    ),
) -> None:
    """Run a qualification: alternating fresh arms, warm-up, frozen fixtures; gates decide the exit code."""
    if ctx.invoked_subcommand is not None:
        return
    c = get_ctx(ctx)
    need = [("--pair", pair), ("--baseline", baseline), ("--plan", plan)]
    if not calibrate:
        need.append(("--candidate", candidate))
    missing = [n for n, v in need if not v]
    if missing or pair is None or baseline is None or plan is None:
        raise ConfigError(f"qualify needs {', '.join(missing)}", hint="pairctl qualify --help")
    if calibrate and (candidate or candidate_profile or calibration):
        raise ConfigError(
            "--calibrate runs the baseline against itself: drop --candidate, --candidate-profile and --calibration",
            hint="pairctl qualify --calibrate --pair P --baseline NATIVE RPC --plan PLAN",
        )
    opts.refuse_option_like(baseline, "--baseline")
    if candidate is not None:
        opts.refuse_option_like(candidate, "--candidate")
    # start-up: the engine loads when the command runs, never for `--help`
    from orchestrator.qualify.command import qualify_pair

    argv = ["qualify", "--pair", pair, "--baseline", *baseline, *(["--candidate", *candidate] if candidate else [])]
    argv += ["--plan", plan] + (["--profile", profile] if profile else [])
    argv += ["--candidate-profile", candidate_profile] if candidate_profile else []
    argv += (["--calibrate"] if calibrate else []) + (["--calibration", calibration] if calibration else [])
    out = qualify_pair(
        c,
        pair=pair,
        baseline=(baseline[0], baseline[1]),
        candidate=(candidate[0], candidate[1]) if candidate else None,
        plan_ref=plan,
        profile_ref=profile,
        argv=argv,
        calibrate=calibrate,
        calibration_ref=calibration,
        candidate_profile_ref=candidate_profile,
    )
    _show(c, out.result, out.receipt, out.report_dir, {"restored": out.restored, "restore_error": out.restore_error})
    if not out.restored:
        from orchestrator.errors import RollbackFailed

        raise RollbackFailed(
            f"the pair was not restored after the measurements: {out.restore_error}; receipt {out.receipt} is failed",
            hint=f"check the pair, then `pairctl receipts derive --from {out.receipt} "
            + " ".join(f"--reuse {s}" for s in out.arm_steps)
            + " --reason ...` and `pairctl qualify report --receipt HASH`",
        )
    if isinstance(out.stop_error, ConfigError):  # e.g. a fixture longer than the server's slot: exit 3
        raise ConfigError(f"{out.stop_error.message} (receipt {out.receipt})", hint=out.stop_error.hint)
    if calibrate:
        rec = evidence_store_for(c).load(out.receipt)
        if rec.outcome != "passed":
            raise Inconclusive(
                f"calibration {out.receipt[:16]}: {rec.reason}",
                hint="give the plan the pairs it needs (its calibration stays valid), or widen its gates",
            )
        if not c.json_output:
            c.console.print(f"calibration: {rec.reason}")
        return
    _exit_for(out.result)


@app.command("report")
def report(
    ctx: typer.Context,
    hash_: str | None = typer.Argument(
        None, metavar="HASH", help="Receipt hash (or prefix), as `receipts show HASH` takes it."
    ),
    receipt: str | None = typer.Option(
        None, "--receipt", metavar="HASH", help="The same as HASH (kept for scripts that name it)."
    ),
) -> None:
    """Recompute the result from a receipt (a qualify run or a record derived from one, following
    its references) and write the report: `pairctl qualify report HASH`."""
    c = get_ctx(ctx)
    if (hash_ is None) == (receipt is None):
        from orchestrator.errors import UsageError

        raise UsageError("name one receipt: `pairctl qualify report HASH` (or --receipt HASH)")
    receipt = hash_ or receipt
    assert receipt is not None
    from orchestrator.cli.receipts_cmd import resolve_receipt
    from orchestrator.qualify.report import write_report

    store = evidence_store_for(c)
    out_dir, record, result = write_report(store, resolve_receipt(store, receipt, "--receipt"))
    extra = {"origin": record.origin, "derived": record.derived, "checks": record.checks}
    _show(c, result, record.receipt, out_dir, extra)
    if record.calibration is not None:
        # an A/A run: its gates are the A/A check; its outcome says whether the plan is resolvable
        if record.outcome != "passed":
            raise Inconclusive(f"calibration {record.receipt[:16]}: {record.reason}")
        return
    _exit_for(result)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def _sd(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _exit_for(result: QualifyResult) -> None:
    failed = [g for g in result.gates if g.verdict == "fail"]
    if result.verdict == "fail":
        raise CheckFailed("qualification failed: " + "; ".join(f"{g.kind}[{g.family}]: {g.reason}" for g in failed))
    if result.verdict == "inconclusive":
        raise Inconclusive(
            "qualification inconclusive: "
            + "; ".join(f"{g.kind}[{g.family}]: {g.reason}" for g in result.gates if g.verdict == "inconclusive")
        )


def _show(c: Ctx, result: QualifyResult, receipt: str, report_dir: Path | None, extra: dict[str, Any]) -> None:
    if c.json_output:
        payload = {"receipt": receipt, "report": str(report_dir) if report_dir else None, **extra, **result.to_json()}
        if report_dir is not None:
            rec = evidence_store_for(c).load(receipt)
            payload["outcome"], payload["reason"] = rec.outcome, rec.reason
            payload["calibration"] = rec.extra_fields().get("calibration")
        c.emit_json(payload)
        return
    from rich.table import Table

    decides = f"{result.deciding_method} interval (decides)"
    cols = ("gate", "family", "threshold", "gain", decides, "spread (own / calibrated sd)", "bootstrap", "pairs")
    t = Table(*cols, "verdict", title=f"qualification {result.verdict.upper()} — plan {result.plan_name}")
    for g in result.gates:
        t.add_row(
            g.kind,
            g.family,
            _pct(g.threshold),
            _pct(g.gain),
            f"{_pct(g.low)} .. {_pct(g.high)}",
            f"{g.spread or 'n/a'} ({_sd(g.sd_own)} / {_sd(g.sd_calibrated)})",
            f"{_pct(g.bootstrap_low)} .. {_pct(g.bootstrap_high)}",
            f"{g.valid_pairs}/{g.planned_pairs}",
            g.verdict,
        )
    c.console.print(t)
    if result.drift and result.drift.get("flagged"):
        c.console.print("drift (the run ends inconclusive): " + "; ".join(result.drift["reasons"]))
    q = result.sequential
    if q:
        at = q.get("decided_at_look")
        c.console.print(
            f"sequential ({q['spending']}, looks at {q['pairs_at']} pairs): "
            + ("no look decided" if at is None else f"decided at look {at} of {q['looks']} ({q['pairs_used']} pairs)")
            + (", stopped early" if q.get("stopped_early") else "")
        )
    c.console.print(f"receipt: {receipt}")
    if report_dir:
        c.console.print(f"report: {report_dir / 'report.md'}")
