"""What deploy and rollback share: a rollout over several pairs (resolve, roll out, print, exit),
the inventory's hooks, and a failed run's `--json` read back from its receipt.

Imported only when such a run starts (the engine and the SSH stack come with it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from orchestrator import progress
from orchestrator.cli.context import Ctx, evidence_store_for
from orchestrator.config.inventory import HookEvent, Inventory
from orchestrator.errors import PairctlError, RollbackFailed, RolledBack
from orchestrator.ops.fleet import select_pairs
from orchestrator.ops.hooks import check_veto, event_document, run_hooks
from orchestrator.ops.revision import resolve_commit, resolve_packages
from orchestrator.ops.rollout import RolloutOptions, RolloutResult, check_options, rollout


def run_fleet(
    c: Ctx,
    command: str,
    pair: list[str] | None,
    all_pairs: bool,
    options: RolloutOptions,
    *,
    dry_run: bool,
    rev: str | None = None,
    source: Path | None = None,
    profile: str | None = None,
) -> None:
    inv = c.inventory()
    pairs = select_pairs(inv, pair, all_pairs)
    canary = options.canary
    if canary is not None and canary not in pairs:
        if pair:  # --pair lists name the rollout; a canary outside it is a typo, not an addition
            raise typer.BadParameter(f"{canary} is not one of the --pair values", param_hint="--canary")
        inv.pair(canary)
    check_options(options)
    commit = packages = None
    if command == "deploy":
        assert rev is not None
        commit = resolve_commit(c.home, rev, source)
        packages = resolve_packages(c.home, inv, pairs, rev, commit, profile_override=profile, source=source)
    result = rollout(
        c.home,
        inv,
        pairs,
        command=command,
        packages=packages,
        rev=rev,
        commit=commit,
        options=options,
        argv=["pairctl", *sys.argv[1:]],
        dry_run=dry_run,
        say=lambda line: progress.event("fleet", line),  # stderr: a live line on a TTY, a plain line otherwise
    )
    if c.json_output:
        c.emit_json(result.as_dict())
    else:
        print_rollout(c, result)
    code = 0 if dry_run else result.exit_code()
    if code:
        raise typer.Exit(code)


def print_rollout(c: Ctx, r: RolloutResult) -> None:
    out = c.console
    head = f"{'dry run: ' if r.dry_run else ''}fleet {r.command}"
    if r.rev:
        head += f" --rev {r.rev} ({(r.commit or '')[:10]})"
    o = r.options
    out.print(f"{head}; canary {o.canary or 'none'}, serial {o.serial}, max-fail {o.max_fail}", markup=False)
    for i, w in enumerate(r.waves):
        out.print(f"  wave {i + 1}: {', '.join(w)}", markup=False)
    for p in r.pairs:
        pk = " + ".join(p.packages) if p.packages else ""
        line = f"  {p.pair:<12} {p.outcome:<16} {pk}" + (f" ({p.profile})" if p.profile else "")
        if p.reason:
            line += f"  {p.reason}"
        if p.receipt:
            line += f"  receipt {p.receipt}"
        out.print(line, markup=False, highlight=False)
        if p.error:
            out.print(f"      {p.error.splitlines()[0]}", markup=False, highlight=False)
    bad_hooks = [h for p in r.pairs for h in p.hooks if not h["ok"]] + [h for h in r.hooks if not h["ok"]]
    for h in bad_hooks:
        out.print(f"  hook {h['argv0']} on {h['event']} failed: {h['error']}", markup=False)
    if not r.dry_run:
        out.print(f"exit {r.exit_code()}; fleet receipt {r.receipt}; {r.wall_s:.1f} s", markup=False)
        if r.paused():
            out.print(
                f"paused after wave {r.waves_run()} of {len(r.waves)} (--waves {o.waves}): run the same "
                "command again to continue (without --waves: every wave left)",
                markup=False,
            )


@contextmanager
def failed_run_json(c: Ctx, command: str, pair: str) -> Iterator[None]:
    """With --json, a run that fails after it wrote a receipt (exit 1, 7, 8, 130) still prints
    its steps, final state and rollback beside the `error` object: the engine's result never
    reaches the CLI of a run that raised, its sealed receipt holds them."""
    try:
        yield
    except PairctlError as exc:
        if c.json_output:
            doc = failed_run_document(c, command, pair, getattr(exc, "receipt", None))
            if doc is not None:
                c.emit_json(doc)
        raise


def failed_run_document(c: Ctx, command: str, pair: str, receipt: str | None) -> dict[str, Any] | None:
    """steps, final_state and rollback of the run sealed as `receipt` (None if it cannot be read)."""

    try:
        rec = evidence_store_for(c).load(receipt) if receipt else None
    except Exception:  # the error object still names the receipt; `receipts verify` says why
        return None
    if rec is None:
        return None
    steps = [
        {
            "name": s.name,
            "hosts": [h for h in (s.host or "").split(",") if h],
            "ok": s.outcome in ("passed", "skipped"),
            "outcome": s.outcome,
            "seconds": s.duration_s or 0.0,
            "error": s.error,
        }
        for s in rec.steps
    ]
    extra = rec.model_extra or {}
    doc = {"command": command, "pair": pair, "outcome": rec.outcome, "reason": rec.reason, "receipt": receipt}
    return doc | {"steps": steps, "final_state": extra.get("final_state"), "rollback": extra.get("rollback")}


def pre_deploy_veto(c: Ctx, inv: Inventory, pair: str, ids: tuple[str, str], profile: str | None) -> None:
    """Kamal's pre-deploy: the inventory's `pre-deploy` hooks run before any host changes; one
    that fails (exit status, timeout, cannot start) stops the deploy (exit 1, nothing changed)."""
    if inv.hooks:
        doc = event_document(
            "pre-deploy", f"pairctl deploy {pair}: starting", command="deploy", pair=pair, packages=list(ids),
            profile=profile,
        )  # fmt: skip
        check_veto(c.home, inv, doc)


@contextmanager
def fire_rollback_hook(c: Ctx, inv: Inventory, pair: str, *, enabled: bool = True) -> Iterator[dict[str, str | None]]:
    """A manual rollback fires rollback.passed or rollback.failed (any failure: refused, leased,
    rollback failed), with its receipt and exit code; like every hook, it never changes the outcome.
    A dry run (`enabled=False`) fires nothing."""
    box: dict[str, str | None] = {"receipt": None}
    event: HookEvent | None = None
    fields: dict[str, object] = {}
    try:
        yield box
        event, text = "rollback.passed", f"pairctl rollback {pair}: passed"
        fields = {"outcome": "passed", "exit_code": 0}
    except PairctlError as exc:
        event, text = "rollback.failed", f"pairctl rollback {pair}: failed ({exc.message.splitlines()[0][:200]})"
        box["receipt"] = getattr(exc, "receipt", None)
        fields = {"outcome": "failed", "exit_code": int(exc.exit_code), "error": exc.message.splitlines()[0]}
        raise
    finally:
        if enabled and event is not None and inv.hooks:
            run_hooks(c.home, inv, event_document(event, text, command="rollback", pair=pair, receipt=box["receipt"],
                                                  **fields))  # fmt: skip


@contextmanager
def fire_deploy_hook(
    c: Ctx, inv: Inventory, pair: str, ids: tuple[str, str], *, enabled: bool = True
) -> Iterator[dict[str, str | None]]:
    """A single-pair deploy fires deploy.passed / rolled_back / rollback_failed too; a hook's
    failure is recorded in logs/hooks.jsonl and never changes the deploy's outcome."""
    event: HookEvent | None = None
    box: dict[str, str | None] = {"receipt": None}  # the caller puts the passed deploy's receipt here
    text = ""
    try:
        yield box
        event, text = "deploy.passed", f"pairctl deploy {pair}: passed"
    except (RolledBack, RollbackFailed) as exc:
        event = "deploy.rolled_back" if isinstance(exc, RolledBack) else "deploy.rollback_failed"
        box["receipt"] = getattr(exc, "receipt", None)
        text = f"pairctl deploy {pair}: {event.split('.')[1].replace('_', ' ')} ({exc.message.splitlines()[0][:200]})"
        raise
    finally:
        if enabled and event is not None and inv.hooks:
            doc = event_document(event, text, command="deploy", pair=pair, packages=list(ids), receipt=box["receipt"])
            run_hooks(c.home, inv, doc)
