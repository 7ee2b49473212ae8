"""`pairctl bisect --pair P --good REV --bad REV (--checks ... | --plan PLAN)`: thin; parse,
call `orchestrator.bisect.run.bisect`, print the range or the answer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx, resolve_path

if TYPE_CHECKING:
    from orchestrator.bisect.state import Judgement


def bisect(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    good: str | None = typer.Option(None, "--good", metavar="REV", help="A revision known good (the baseline)."),
    bad: str | None = typer.Option(None, "--bad", metavar="REV", help="A later revision known bad."),
    checks: list[str] | None = typer.Option(
        None,
        "--checks",
        metavar="NAME[,NAME]",
        help="Judge each step by these acceptance checks on a deploy (reference_logprobs for the reference-logprob "
        "gates; 'all' for the whole suite).",
    ),
    plan: str | None = typer.Option(
        None,
        "--plan",
        metavar="NAME|PATH",
        help="Judge each step by this qualification plan's non-regression gates, baseline = the good revision.",
    ),
    profile: str | None = opts.PROFILE,
    source: Path | None = typer.Option(
        None, "--source", metavar="DIR", help="Git repository of the revisions (default: the lab source)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the range and the number of steps; change nothing."),
    resume: bool = typer.Option(False, "--resume", help="Continue the pair's interrupted bisect (state in the home)."),
    reset: bool = typer.Option(False, "--reset", help="Discard the pair's bisect state (not its receipts)."),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, metavar="N", help="Parallel compile jobs."),
) -> None:
    """Find the first bad revision between --good and --bad on PAIR, with git's own bisect: each
    step builds the pair's packages from the commit git names, deploys them under the pair's
    leases and judges them (--checks: acceptance; --plan: qualification against the good
    revision); a commit that does not build or whose package does not come up is skipped, not
    called bad. Every step writes a receipt; the bisect receipt names the first bad commit and
    the evidence for each verdict. The pair is restored to what ran before, verified, at the end,
    after a failure and after Ctrl-C; the same command (or --resume) then continues.

    \b
    Exit codes: 0 the first bad commit is named (or --dry-run, --reset); 9 only skipped
    commits are left (the receipt lists the candidates); 2 bad command line (an unknown
    revision, --good not an ancestor of --bad, no judgement, another bisect of the pair
    unfinished); 3 invalid config or plan, or a state file too large, too deep or not a
    state; 4 a host unreachable; 5 the pair stayed leased;
    6 the good revision does not build (--plan) or a package differs from its id; 8 the pair
    could not be restored (leases kept); 130 interrupted: the pair was restored, and
    `pairctl bisect --pair P --resume` continues where it stopped.
    """
    from orchestrator.bisect import state as st
    from orchestrator.bisect.run import BisectRequest
    from orchestrator.bisect.run import bisect as run_bisect
    from orchestrator.errors import Inconclusive, UsageError

    c = get_ctx(ctx)
    if reset:
        if good or bad or checks or plan or resume or dry_run:
            raise UsageError("--reset discards the pair's bisect state and takes no other option but --pair")
        folder = st.folder(c.home, pair)
        existed = folder.exists()
        shutil.rmtree(folder, ignore_errors=True)
        c.say(
            {"command": "bisect", "pair": pair, "outcome": "reset", "discarded": existed},
            f"bisect state of {pair} {'discarded' if existed else 'was absent'} ({folder})",
        )
        return
    judgement = _judgement(checks, plan, good, bad, resume)
    src = resolve_path(source) if source else c.home.lab / "source"
    req = BisectRequest(
        pair=pair,
        source=src,
        good=good,
        bad=bad,
        judgement=judgement,
        profile=profile,
        dry_run=dry_run,
        resume=resume,
        jobs=jobs,
        argv=["pairctl", *sys.argv[1:]],
        progress=lambda line: typer.echo(f"bisect {pair}: {line}", err=True),
    )
    result = run_bisect(c.home, c.inventory(), req)
    doc = result.to_dict()
    if result.outcome == "dry-run":
        c.say(doc, _dry_run_text(doc["range"]))
        return
    c.say(doc, _result_text(doc))
    if result.outcome != "found":
        raise Inconclusive(
            f"bisect of {pair}: only skipped commits are left; the first bad commit is one of "
            + ", ".join(x["commit"][:10] for x in result.candidates),
            hint=f"receipt {result.receipt}",
        )


def _judgement(
    checks: list[str] | None, plan: str | None, good: str | None, bad: str | None, resume: bool
) -> Judgement | None:
    """How each step is judged, from --checks or --plan; a usage error (exit 2) for a command line
    that gives both, neither, or a new range with --resume, before anything is built."""
    from orchestrator.bisect.state import Judgement
    from orchestrator.errors import UsageError

    judgement = None
    if checks and plan:
        raise UsageError("give one judgement: --checks or --plan, not both")
    if checks:
        got = opts.names(checks)
        judgement = Judgement("checks", () if got == ["all"] else tuple(opts.check_names(checks)))
    elif plan:
        # a file by its absolute path: `--resume` from another directory judges with the same plan
        judgement = Judgement("plan", plan=str(resolve_path(Path(plan))) if Path(plan).is_file() else plan)
    if resume and (good or bad or judgement):
        raise UsageError("--resume continues the recorded bisect: give only --pair (and --dry-run)")
    if not resume and (good is None or bad is None):
        raise UsageError("bisect needs --good REV and --bad REV (or --resume)", hint="pairctl bisect --help")
    if not resume and judgement is None:
        raise UsageError("bisect needs a judgement: --checks NAME[,NAME] (or all) or --plan NAME|PATH")
    return judgement


def _dry_run_text(r: dict[str, Any]) -> str:
    lines = [
        f"range {r['good'][:10]}..{r['bad'][:10]}: {r['size']} commits that may be the first bad one (oldest first)"
    ]
    lines += [f"  {x['commit'][:10]}  {x['subject']}" for x in r["commits"]]
    lines.append(
        f"steps: about {r['estimated_steps']} (git's estimate), at most {r['max_judged_steps']} judged steps "
        "without skipped commits; each step builds, deploys and judges one commit"
    )
    j = r["judgement"]
    what = f"checks {', '.join(j['checks']) or 'all'}" if j["kind"] == "checks" else f"plan {j['plan']}"
    lines.append(f"judgement: {what}; targets {', '.join(r['targets'])}; profile {r['profile']}")
    return "\n".join(lines)


def _result_text(d: dict[str, Any]) -> str:
    lines = []
    for i, s in enumerate(d["steps"], 1):
        lines.append(f"step {i}: {s['commit'][:10]} {s['verdict']:<4}  {s['reason'][:160]}  (receipt {s['receipt']})")
    if d["first_bad"]:
        fb = d["first_bad"]
        lines.append(f"first bad commit: {fb['commit']} {fb['subject']}")
    else:
        lines.append("only skipped commits left; the first bad commit is one of:")
        lines += [f"  {x['commit']} {x['subject']}" for x in d["candidates"]]
    lines.append(f"judged steps: {d['judged_steps']} of {len(d['steps'])}; range of {d['range']['size']} commits")
    if d.get("restored"):
        lines.append(f"pair restored and verified: {d['restored'].get('native')} / {d['restored'].get('rpc')}")
    lines.append(f"receipt {d['receipt']}")
    return "\n".join(lines)
