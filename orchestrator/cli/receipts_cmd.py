"""`pairctl receipts list|show|verify|derive`: read, check and extend the evidence store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from orchestrator.cli import receipts_prune, receipts_remote
from orchestrator.cli.context import evidence_store_for, first_line, get_ctx, usage
from orchestrator.cli.options import EVIDENCE_OPT, names
from orchestrator.errors import EvidenceError, ExitCode

app = typer.Typer(
    help="Receipts: list, show, verify the hash chains, derive recovery records, prune old ones.", no_args_is_help=True
)


@app.command("list")
def list_(
    ctx: typer.Context,
    pair: str | None = typer.Option(
        None, "--pair", "-p", metavar="PAIR", help="Only this pair's receipts (its chain, and its qualifications)."
    ),
    since: str | None = typer.Option(
        None, "--since", metavar="T", help="Only receipts started since: 2h, 3d, 1w or an ISO time."
    ),
    command: list[str] | None = typer.Option(
        None,
        "--command",
        metavar="CMD",
        help="Only receipts of this command (deploy, rollback, accept, qualify, ...); repeatable or comma-separated.",
    ),
    outcome: list[str] | None = typer.Option(
        None,
        "--outcome",
        metavar="OUTCOME",
        help="Only these outcomes (passed, failed, interrupted, aborted, "
        "inconclusive, ...); repeatable or comma-separated.",
    ),
    evidence: Path | None = EVIDENCE_OPT,
) -> None:
    """Receipts, oldest first."""
    from rich.table import Table

    from orchestrator.evidence.receipt import parse_time

    c = get_ctx(ctx)
    cutoff = None
    if since:
        from orchestrator.evidence.timespec import parse_since

        try:
            cutoff = parse_since(since)
        except ValueError as exc:
            usage(str(exc))
    from orchestrator.evidence.receipt import OUTCOMES

    commands, outcomes = set(names(command)), set(names(outcome))
    if outcomes - set(OUTCOMES):
        usage(f"--outcome: unknown {', '.join(sorted(outcomes - set(OUTCOMES)))}; known: {', '.join(OUTCOMES)}")
    store = evidence_store_for(c, evidence)
    everyone = [r | {"home": store.home_id(create=False) or "-"} for r in store.summaries()]
    for home, copy in store.team_stores().items():  # other operators' runs, pulled from the team's remote
        everyone += [r | {"home": home} for r in copy.summaries()]
    everyone.sort(key=lambda s: (s["finished_at"], s["started_at"]))
    rows = [
        r
        for r in everyone
        if (pair is None or pair in (r["pair"], r.get("about_pair")))
        and (not commands or r["command"] in commands or r["command"].split()[0] in commands)
        and (not outcomes or r["outcome"] in outcomes)
        and (cutoff is None or parse_time(r["started_at"]) >= cutoff)
    ]
    if c.json_output:
        c.emit_json(rows)
        return
    table = Table(box=None, pad_edge=False)
    for col in ("hash", "started", "command", "pair", "by", "outcome"):
        table.add_column(col, no_wrap=True)
    table.add_column("reason", min_width=24)
    for r in rows:
        table.add_row(
            c.short(r["hash"]),
            r["started_at"][:16].replace("T", " "),
            r["command"],
            r["pair"] or "-",
            f"{r.get('owner') or '-'} ({r['home']})",
            r["outcome"]
            + (" (derived)" if r["derived_from"] else "")
            + ("" if r.get("in_chain", True) else " (not in its chain: run receipts verify)"),
            first_line(r["reason"]),
        )
    c.console.print(table)
    c.console.print(f"{len(rows)} receipt(s)")
    for u in store.unsealed():
        if pair and u["pair"] != pair:
            continue
        state = "running" if u["alive"] else "on another host" if u["alive"] is None else _KILLED
        c.line(f"unsealed run {u['run_id']} ({u['command']}, pair {u['pair'] or '-'}): {state}")


_KILLED = "killed; sealed as aborted by the next command on its pair"


def resolve_receipt(store: Any, ref: str, param: str) -> str:
    """The full hash of the receipt REF names; none, several, or not a hash: a usage error (exit 2),
    like any argument that names nothing. Exit 10 stays for receipts that exist and do not verify."""
    try:
        return str(store.resolve(ref))
    except EvidenceError as exc:
        raise typer.BadParameter(f"{exc}; `pairctl receipts list` shows the receipts", param_hint=param) from None


@app.command("show")
def show(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="HASH", help="Receipt hash or a unique prefix."),
    evidence: Path | None = EVIDENCE_OPT,
) -> None:
    """A readable summary of one receipt (`--json` for all of it)."""
    from rich.table import Table

    c = get_ctx(ctx)
    store = evidence_store_for(c, evidence)
    r = store.load(resolve_receipt(store, ref, "HASH"))
    if c.json_output:
        c.emit_json({"hash": r.sha256, **r.to_json_obj()})
        return
    p = c.console.print
    p(f"receipt   {r.sha256}")
    p(f"command   {r.command}  {' '.join(r.argv)}", markup=False)
    p(f"pair      {r.pair or '-'}    operator {r.operator or '-'}    on {r.host.hostname} (pid {r.host.pid})")
    p(f"time      {r.started_at} -> {r.finished_at}  ({_seconds(r.started_at, r.finished_at)})")
    p(
        f"outcome   {r.outcome}: {r.reason}" + ("   [recovered from a killed run's journal]" if r.recovered else ""),
        markup=False,
    )
    p(f"previous  {r.previous or '- (first of its chain)'}")
    if r.derived_from:
        p(f"derived from {r.derived_from}")
        for name, ref_ in r.reused_steps.items():
            p(f"  reused  {name}: from {c.short(ref_.from_)} data {c.short(ref_.data_sha256)} ({ref_.samples} samples)")
        p(f"  fresh   {', '.join(r.fresh_steps) or '-'}")
    if r.inputs:
        p("inputs")
        for k, v in sorted(r.inputs.items()):
            p(f"  {k}: {v}", markup=False)
    if r.steps:
        t = Table("step", "host", "outcome", "seconds", "detail", box=None, pad_edge=False)
        for s in r.steps:
            t.add_row(
                s.name,
                s.host or "-",
                s.outcome,
                "-" if s.duration_s is None else f"{s.duration_s:.3f}",
                s.error or s.skip_reason or "",
            )
        p(t)
    if r.identities:
        p("identities")
        for i in r.identities:
            data = json.dumps(i.data, sort_keys=True)
            p(f"  {i.host} @ {i.at}: {data[:200] if c.interactive else data}", markup=False)
    if r.samples:
        p("samples   " + ", ".join(f"{k}: {len(v)}" for k, v in sorted(r.samples.items())))
    extra = r.extra_fields()
    if extra:
        p("fields    " + ", ".join(sorted(extra)))
    for n in r.notes:
        p(f"note {n.at}: {n.text}", markup=False)


def _seconds(a: str, b: str) -> str:
    from orchestrator.evidence.receipt import parse_time

    try:
        return f"{(parse_time(b) - parse_time(a)).total_seconds():.1f} s"
    except ValueError:
        return "?"


@app.command("verify")
def verify(
    ctx: typer.Context,
    evidence: Path | None = EVIDENCE_OPT,
    remote: bool = typer.Option(
        False,
        "--remote",
        help="Also fetch the team's evidence remote: every home's chains and commit signatures (against the "
        "allowed signers), and any receipt here that differs from the remote's copy.",
    ),
) -> None:
    """Rehash every receipt and walk every chain; nonzero exit (10) naming the first broken link."""
    c = get_ctx(ctx)
    store = evidence_store_for(c, evidence)
    rep = store.verify()
    if remote:
        from orchestrator.cli.receipts_remote import verify_remote

        verify_remote(c, store, rep)
    if c.json_output:
        c.emit_json(rep.to_json())
    else:
        chains = ", ".join(f"{k} ({v})" for k, v in sorted(rep.chains.items())) or "none"
        c.line(f"{rep.receipts} receipt(s) in {rep.root}; chains: {chains}")
        for home, who in sorted(rep.signers.items()):
            c.line(f"home {home}: pushes signed by {', '.join(who) or 'no allowed signer'}")
        for home, d in sorted(rep.quarantined.items()):
            c.line(
                f"home {home}: quarantined at {d['tip'][:12]} by {d['by']} (home {d['by_home']}) on {d['at']}: "
                f"{d['reason']} (receipt {d['receipt'][:16]}; {len(d['problems'])} problem(s) set aside)"
            )
        for w in rep.warnings:
            c.line(f"warning: {w}")
        for prob in rep.problems:
            c.line(f"FAIL [{prob.kind}] {prob.message}")
        if rep.ok:
            c.console.print("ok: every receipt matches its hash and every chain is whole")
    first = rep.first
    if first is not None:
        raise EvidenceError(f"{len(rep.problems)} problem(s); first: {first.message}")


@app.command("derive")
def derive(
    ctx: typer.Context,
    original: str = typer.Option(..., "--from", metavar="HASH", help="Hash (or prefix) of the original receipt."),
    reuse: list[str] = typer.Option(
        ..., "--reuse", metavar="STEP", help="Step to reuse by reference (repeat, or comma-separated)."
    ),
    reason: str = typer.Option(
        ..., "--reason", metavar="TEXT", help="Why this derived record exists (kept in the receipt)."
    ),
    fresh: Path | None = typer.Option(
        None,
        "--fresh",
        metavar="FILE",
        help="JSON file: a list of fresh step results [{name, outcome, data, host}] "
        "or {steps: [...], samples: {step: [rows]}}.",
    ),
    evidence: Path | None = EVIDENCE_OPT,
) -> None:
    """A new receipt reusing passed steps of a failed run by hash; the original is never touched."""
    c = get_ctx(ctx)
    steps = names(reuse)
    fresh_steps, fresh_samples, fresh_ids = _read_fresh(fresh)
    store = evidence_store_for(c, evidence)
    argv = ["receipts", "derive", "--from", original, *[a for s in steps for a in ("--reuse", s)], "--reason", reason]
    if fresh:
        argv += ["--fresh", str(fresh)]
    sha = store.derive(
        resolve_receipt(store, original, "--from"),
        reuse=steps,
        reason=reason,
        fresh_steps=fresh_steps,
        fresh_samples=fresh_samples,
        identities=fresh_ids,
        argv=argv,
    )
    r = store.load(sha)
    if c.json_output:
        from orchestrator.evidence.receipt import summary_of

        reused = {k: v.model_dump(by_alias=True) for k, v in r.reused_steps.items()}
        c.emit_json(summary_of(r) | {"reused_steps": reused, "fresh_steps": r.fresh_steps})
    else:
        c.line(f"derived receipt {sha} ({r.outcome}) from {r.derived_from}")
        c.console.print(f"reused: {', '.join(r.reused_steps)}; fresh: {', '.join(r.fresh_steps) or '-'}")
        if r.outcome == "incomplete":
            c.line(r.reason)
    if r.outcome == "incomplete":  # written, but not a pass: scripts must not read exit 0 as one
        raise typer.Exit(int(ExitCode.INCONCLUSIVE))


FreshInput = tuple[list[dict[str, Any]], dict[str, list[Any]] | None, list[tuple[str, dict[str, Any]]]]


def _read_fresh(path: Path | None) -> FreshInput:
    """--fresh FILE: a list of steps, or {steps, samples, identities: [{host, data}]} (the identities
    the fresh steps ran against: a derived record passes only when they match the original's)."""
    if path is None:
        return [], None, []
    try:
        data = json.loads(Path(path).read_text())
    except RecursionError:
        usage(f"--fresh {path}: nested too deeply")
    except (OSError, ValueError) as exc:
        usage(f"--fresh {path}: {exc}")
    if isinstance(data, list):
        return data, None, []
    if isinstance(data, dict) and isinstance(data.get("steps", []), list):
        ids = data.get("identities") or []
        shaped = isinstance(ids, list) and all(
            isinstance(i, dict) and isinstance(i.get("host"), str) and isinstance(i.get("data"), dict) for i in ids
        )
        if not shaped:
            usage(f"--fresh {path}: identities must be a list of {{host, data}}")
        return data.get("steps", []), data.get("samples"), [(i["host"], i["data"]) for i in ids]
    usage(f"--fresh {path}: expected a list of steps or {{steps, samples, identities}}")


receipts_remote.register(app)  # push, pull, init-remote, quarantine
app.command("prune", epilog=receipts_prune.EPILOG)(receipts_prune.prune_cmd)
