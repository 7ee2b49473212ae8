"""`pairctl status`: what runs on a pair, whether it matches, the route record, leases; several
pairs are probed concurrently and shown one row each."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import evidence_store_for, first_line, get_ctx

if TYPE_CHECKING:
    from orchestrator.evidence.store import EvidenceStore


def _age(iso: str | None, now: datetime) -> str:
    if not iso:
        return "-"
    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    s = int((now - then).total_seconds())
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s // n}{unit}"
    return f"{s}s"


# receipts walked back from a pair's head; a longer run since its last acceptance is left to the listing
WALK_MAX = 1000


def last_acceptance(evidence: EvidenceStore, pair: str) -> dict[str, Any] | None:
    """The newest `accept` receipt of the pair, walked back from its chain head (each step's file
    checked against its hash), so a status of many pairs reads only the receipts since each one's
    last acceptance. A link that does not verify, leads to another pair's receipt, or a walk
    longer than WALK_MAX falls back to the full listing of the pair's own receipts."""
    from orchestrator.errors import EvidenceError

    try:
        r = evidence.latest(pair)
        if r is None:
            return None
        s: dict[str, Any] | None = None
        if r.command == "accept":
            s = {"hash": r.sha256, "outcome": r.outcome, "finished_at": r.finished_at}
        prev, steps = r.previous, 0
        if r.pair == pair:
            while s is None and prev and steps < WALK_MAX:
                got = evidence.summary_of(prev)
                if got.get("pair") != pair:
                    break
                s, prev, steps = (got if got["command"] == "accept" else None), got.get("previous"), steps + 1
            if s is not None or not prev:
                return s
    except EvidenceError:
        pass
    for s in evidence.summaries(pair)[::-1]:  # newest first
        if s.get("command") == "accept":
            return s
    return None


def fleet_rows(results: Any, evidence: Any) -> list[dict[str, Any]]:
    from orchestrator.engine.render import lease_text

    now = datetime.now(UTC)
    rows = []
    for out in results.outcomes:
        st = out.value or {}
        route = st.get("route") or {}
        acc = last_acceptance(evidence, out.pair)
        leases = [entry for h in (st.get("hosts") or {}).values() for entry in h.get("leases", [])]
        rows.append(
            {
                "pair": out.pair,
                "ok": out.ok,
                "active": route.get("active_packages"),
                "active_for": _age(route.get("updated_at"), now),
                "health": st.get("health"),
                "last_acceptance": acc["outcome"] if acc else None,
                "last_acceptance_age": _age(acc["finished_at"], now) if acc else "-",
                "leases": [t for t in map(lease_text, leases) if t],
                "problems": st.get("problems", []) if out.ok or out.value else [out.error],
            }
        )
    return rows


def status(
    ctx: typer.Context,
    pair: list[str] | None = opts.PAIRS,
    all_pairs: bool = opts.ALL_PAIRS,
    parallel: int = opts.parallel(4, "Pairs probed"),
    verify_files: bool = typer.Option(
        False,
        "--verify-files",
        help="Also sha256 every file of each host's current release against its manifest (one exec per host; "
        "catches a changed library or model-independent file that the running binaries' hashes cannot).",
    ),
    watch: float = typer.Option(
        0.0,
        "--watch",
        metavar="SECONDS",
        help="Look again every SECONDS (a terminal is redrawn; a pipe gets each look under a time line), "
        "until Ctrl-C (exit 0) or --count looks.",
    ),
    count: int = typer.Option(
        0, "--count", metavar="N", help="With --watch: stop after N looks (default: 1 hour's worth)."
    ),
) -> None:
    """Show current/previous releases, services, route record and leases.

    A read: it changes nothing on the hosts and writes no receipt (it may log). Exit 1 when
    something does not match on any pair (each problem says how to fix it); exit 4 when a host
    does not answer (what the other host says is still shown, the unreachable one named); exit 6
    when a host's current/previous link leaves the install root or names no release. With
    --watch, the exit code of the last look (--json then is a usage error: one document)."""
    if watch < 0 or watch > 3600 or count < 0:
        from orchestrator.errors import UsageError

        raise UsageError("--watch takes 0.1 to 3600 seconds and --count a count of looks (0: an hour's worth)")
    if watch:
        _watch(ctx, lambda: _status_once(ctx, pair, all_pairs, parallel, verify_files), watch, count)
        return
    _status_once(ctx, pair, all_pairs, parallel, verify_files)


def _watch(ctx: typer.Context, look: Callable[[], None], every: float, count: int) -> None:
    """`watch pairctl status`, bounded: COUNT looks (default an hour's), each probe bounded itself."""
    import time

    from orchestrator.errors import PairctlError, UsageError

    c = get_ctx(ctx)
    if c.json_output:
        raise UsageError("--watch prints a look every SECONDS and --json one document: use one of them")
    looks = count or max(1, int(3600 / every))
    code = 0
    try:
        for i in range(looks):
            t0 = time.monotonic()
            if c.interactive:
                c.console.clear()
            stamp = datetime.now(UTC).astimezone().strftime("%H:%M:%S")
            c.line(f"-- {stamp} look {i + 1}/{looks}, every {every:g} s (Ctrl-C stops) --")
            try:
                look()
                code = 0
            except typer.Exit as exc:
                code = exc.exit_code
            except PairctlError as exc:
                code = exc.exit_code
                c.line(f"error: {first_line(exc.message)}")
            if i + 1 < looks:
                time.sleep(max(0.0, every - (time.monotonic() - t0)))
    except KeyboardInterrupt:
        c.line("stopped watching")
        code = 0
    if code:
        raise typer.Exit(code)


def _status_once(
    ctx: typer.Context, pair: list[str] | None, all_pairs: bool, parallel: int, verify_files: bool
) -> None:
    from rich.table import Table

    from orchestrator.engine.render import print_status
    from orchestrator.engine.status import status as run_status
    from orchestrator.ops.fleet import fan_out, select_pairs

    c = get_ctx(ctx)
    inv = c.inventory()
    pairs = select_pairs(inv, pair, all_pairs)
    argv = ["pairctl", *sys.argv[1:]]
    results = fan_out(
        pairs,
        lambda p: run_status(c.home, inv, p, argv=argv, verify_files=verify_files),
        parallel=parallel,
        ok=lambda out: not out["problems"],
    )
    if len(pairs) == 1 and not all_pairs:
        one = results.outcomes[0]
        if one.value is None:
            raise typer.Exit(one.exit_code) if not one.error else _reraise(one)
        if c.json_output:
            c.emit_json(one.value)
        else:
            print_status(c.console, one.value)
        _raise_if_unreachable(one.value)
        if not one.ok:
            raise typer.Exit(1)
        return
    rows = fleet_rows(results, evidence_store_for(c))
    if c.json_output:
        c.emit_json({"pairs": rows, "details": results.as_dict()["pairs"]})
    else:
        from rich.table import Column

        # ids and problems wrap on a narrow terminal instead of being cut: an id's end tells builds apart
        t = Table(
            "pair",
            Column("active packages", overflow="fold"),
            "active for",
            "health",
            "last acceptance",
            Column("leases", overflow="fold"),
            Column("problems", overflow="fold"),
            title="pairs",
            expand=c.interactive,
        )
        for r in rows:
            t.add_row(
                r["pair"],
                " + ".join(r["active"]) if r["active"] else "-",
                r["active_for"],
                str(r["health"] or "-"),
                f"{r['last_acceptance'] or '-'} ({r['last_acceptance_age']} ago)" if r["last_acceptance"] else "-",
                "; ".join(r["leases"]) or "-",
                "; ".join(first_line(p) for p in r["problems"]) or "-",
            )
        c.console.print(t)
    if not results.ok:
        for o in results.outcomes:
            _raise_if_unreachable(o.value or {})
        raise typer.Exit(1 if results.exit_code() == 0 else results.exit_code())


def _raise_if_unreachable(out: dict[str, Any]) -> None:
    """Exit 4 after the partial view: what the reachable host said is shown, the other is named."""
    from orchestrator.errors import HostError

    down = out.get("unreachable") or {}
    if down:
        host, why = next(iter(down.items()))
        raise HostError(
            f"pair {out['pair']}: {', '.join(down)} not reachable ({why}); the view above is partial",
            hint="the other host's state is shown as it answered; fix the host (sshd, network, key) and look again",
        )


def _reraise(one: Any) -> typer.Exit:
    from orchestrator.errors import PairctlError

    err = PairctlError(one.error)
    err.exit_code = one.exit_code
    raise err
