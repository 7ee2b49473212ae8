"""`pairctl receipts prune`: bound local evidence without breaking the audit trail
(orchestrator/ops/prune.py does the work; evidence/prune.py decides what may go)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer

from orchestrator.cli.context import evidence_store_for, first_line, get_ctx, usage
from orchestrator.cli.options import EVIDENCE_OPT

EPILOG = (
    "Exit codes: 0 pruned, or nothing to prune (dry run: listed); 2 bad options (DAYS, --archive exists, "
    "no --yes); 10 the evidence does not verify, or the archive did not read "
    "back (nothing removed)."
)


def prune_cmd(
    ctx: typer.Context,
    older_than: float = typer.Option(
        ..., "--older-than", metavar="DAYS", help="Only receipts finished more than DAYS days ago (0 or more)."
    ),
    archive: Path | None = typer.Option(
        None,
        "--archive",
        metavar="FILE",
        help="Write the pruned receipts into this new tar.xz first (0600, never over an existing file); it is "
        "read back and checked by hash before anything is removed.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would go and the bytes freed; change nothing."),
    yes: bool = typer.Option(False, "--yes", help="Remove without asking (needed unless --dry-run)."),
    evidence: Path | None = EVIDENCE_OPT,
) -> None:
    """Remove old receipts that are kept elsewhere (on the team's evidence remote with the same bytes,
    or in --archive), recording what went in a prune receipt so `receipts verify` still passes.

    Never removed: a chain's head, receipts a route record on a pair's hosts anchors (and all newer
    ones), receipts newer than DAYS, reference answers, baselines, calibrations, prune receipts,
    receipts a kept derived record reuses, and any chain with an unsealed run or unreadable hosts."""
    from orchestrator import terminal
    from orchestrator.errors import ConfigError
    from orchestrator.ops import prune

    c = get_ctx(ctx)
    if not older_than >= 0 or older_than != older_than or older_than > 1e6:
        usage(f"--older-than {older_than}: give a number of days, 0 or more")
    if archive is not None:
        archive = archive.expanduser().absolute()
        if archive.exists() or archive.is_symlink():
            usage(f"--archive {archive} exists; name a new file (an archive is never overwritten)")
        if not archive.parent.is_dir():
            usage(f"--archive {archive}: the folder {archive.parent} does not exist")
    if not dry_run and not yes:
        usage("prune removes receipts: add --yes (or --dry-run to see what would go)")
    warnings: list[str] = []
    try:
        inventory = c.inventory()
    except ConfigError as exc:
        inventory = None
        warnings.append(f"the inventory did not load ({exc.message}); no pair's receipts can go")
    access = None
    if inventory is not None:
        from orchestrator.config.evidence_remote import resolve_remote

        access = resolve_remote(inventory)
    store = evidence_store_for(c, evidence)
    res = prune.run(
        store,
        days=older_than,
        inventory=inventory,
        access=access,
        archive=archive,
        dry_run=dry_run,
        argv=["receipts", "prune", "--older-than", f"{older_than:g}"]
        + (["--archive", str(archive)] if archive else [])
        + (["--yes"] if yes else []),
        say=lambda s: typer.echo(s, err=True),
    )
    res.warnings[:0] = warnings
    if c.json_output:
        c.emit_json(res.to_json())
        return
    p = c.console.print
    sel = res.selection
    for w in res.warnings:
        p(f"warning: {w}", markup=False)
    for chain, why in sorted(sel.blocked.items()):
        p(f"chain {chain}: kept whole: {why}", markup=False)
    for why, n in Counter(first_line(why) for why in sel.kept.values()).most_common():
        p(f"kept {n} older receipt(s): {why}", markup=False)
    verb = "would go" if dry_run else "pruned"
    for cand in sel.prune:
        r = cand.receipt
        p(
            f"{verb} {c.short(cand.sha)} {r.started_at[:16].replace('T', ' ')} {r.chain} {r.command} {r.outcome} "
            f"{terminal.size(cand.size)} (kept: {', '.join(cand.kept)})",
            markup=False,
        )
    freed = terminal.size(sel.bytes)
    if dry_run:
        p(f"dry run: {len(sel.prune)} receipt(s) would go, freeing {freed}; nothing changed", markup=False)
    elif res.receipt is None:
        p("nothing to prune", markup=False)
    else:
        where = " and ".join(x for x, on in (("the evidence remote", res.remote), (str(archive), res.archive)) if on)
        p(f"pruned {len(sel.prune)} receipt(s), freed {freed}; kept in {where}", markup=False)
        p(f"prune receipt {res.receipt}", markup=False)
