"""Rich output for deploy / rollback / status (people); `--json` bypasses all of this."""

from __future__ import annotations

import shlex
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator.terminal import size


def print_plan(
    console: Console, plan: list[dict[str, Any]], *, command: str = "deploy", target: dict[str, Any] | None = None
) -> None:
    """Every step, on which host, what it does and what a failure means (no truncation); a
    rollback's first names the pair it goes back to."""
    console.print(f"{command} plan (dry run: nothing was changed)", markup=False)
    if target:
        console.print(
            f"goes back to: {target['native_package']} + {target['rpc_package']} ({target['profile_name']})",
            markup=False,
            highlight=False,
        )
    for i, s in enumerate(plan, 1):
        console.print(
            f"{i:>2}. {s['name']:<14} on {', '.join(s['hosts']):<26} on failure: {s['on_failure']}",
            markup=False,
            highlight=False,
        )
        console.print(f"      {s['description']}", markup=False, highlight=False)
        for host, argv in s.get("argv", {}).items():
            console.print(f"      {host}$ " + shlex.join(argv), markup=False, highlight=False, soft_wrap=True)


def print_result(console: Console, result: Any) -> None:
    sent = sum(u.get("bytes_sent", 0) for u in result.uploads.values())
    console.print(
        f"{result.command} {result.pair}: {result.outcome} in {result.wall_s:.2f} s; "
        f"package bytes sent: {size(sent)}; receipt {result.receipt}",
        markup=False,
    )
    if result.active:
        console.print(
            f"active: {result.active['native_package']} + {result.active['rpc_package']} "
            f"({result.active['profile_name']})",
            markup=False,
        )


def lease_text(entry: dict[str, Any]) -> str:
    """One lease entry of `status` as a short phrase: who holds it, for what, until when."""
    if entry.get("error"):
        return f"unreadable: {entry['error']}"
    lease = entry.get("lease") or {}
    state = entry.get("state", "held")
    if state == "free":
        return ""
    who = lease.get("owner") or entry.get("holder") or "?"
    until = str(lease.get("expires_at") or "")[:19]
    return (
        f"{state} by {who}"
        + (f" until {until}" if until else "")
        + (f" ({lease['purpose']})" if lease.get("purpose") else "")
    )


def print_status(console: Console, out: dict[str, Any]) -> None:
    table = Table(title=f"pair {out['pair']}")
    for col in ("host", "role", "current", "previous", "service", "pid", "matches manifest", "leases"):
        # a narrow terminal wraps an id instead of cutting it: the end is what tells two builds apart
        table.add_column(col, overflow="fold")
    for host, h in out["hosts"].items():
        if h.get("reachable") is False:  # a partial view: this host said nothing
            table.add_row(host, h["role"], "UNREACHABLE", "-", h["service"], "-", "-", "-")
            continue
        leases = "; ".join(t for t in map(lease_text, h["leases"]) if t) or "-"
        table.add_row(
            host,
            h["role"],
            h["current"] or "-",
            h["previous"] or "-",
            h["service"],
            str(h["pid"] or "-"),
            {True: "yes", False: "NO", None: "-"}[h["matches_manifest"]],
            leases,
        )
    console.print(table)
    r = out.get("route")
    if r:
        console.print(
            f"route: revision {r['revision']} active {r['active'] or '-'} previous {r['previous'] or '-'} "
            f"(updated {r['updated_at']} by {r['updated_by']})"
            + (f" as {r['read_from']} alone has it (not judged)" if r.get("read_from") else ""),
            markup=False,
        )
    else:
        console.print("route: no record", markup=False)
    console.print(f"health: {out.get('health')}", markup=False)
    for host, h in out["hosts"].items():
        sup = h.get("supervisor")
        if sup:
            up = f"{sup['uptime_s']:.0f} s" if sup.get("uptime_s") is not None else "-"
            console.print(
                f"supervisor: {host}: {h['service']} {sup['state']}"
                f"{'' if sup['supervisor_alive'] else ' (supervisor not running)'}, restarts {sup['restarts']}, "
                f"last exit {sup['last_exit'] or '-'}, uptime {up}",
                markup=False,
            )
    for host, h in out["hosts"].items():
        b = h.get("boot")
        if b and b.get("persistence"):
            at_boot = "starts" if b.get("starts_at_boot") else "does not start (stopped deliberately)"
            console.print(
                f"boot: {host}: @reboot crontab line installed; {h['service']} {at_boot} at the next boot",
                markup=False,
            )
    for host, h in out["hosts"].items():
        rf = h.get("release_files") or {}
        if rf.get("verified"):
            console.print(
                f"release files: {host}: all {rf['files']} files of {h['current']} match its manifest", markup=False
            )
    for p in out["problems"]:
        console.print(f"problem: {p}", markup=False)
    for w in out.get("warnings") or []:
        console.print(f"warning: {w}", markup=False)
    if out.get("aborted_runs_sealed"):
        console.print(f"sealed {len(out['aborted_runs_sealed'])} killed run(s) as aborted receipts", markup=False)
    for host, h in out["hosts"].items():
        for name in h.get("upload_leftovers") or []:
            console.print(
                f"leftover upload: {host}: releases/{name} (a killed upload's; the next deploy removes it)",
                markup=False,
            )
    for stale in out.get("stale_leases") or []:
        console.print(
            f"lease left by a finished run: {stale['host']}: {stale['why']}; release it with "
            f"`pairctl lease release {out['pair']} --dead-run {stale['run_id']}`",
            markup=False,
        )
