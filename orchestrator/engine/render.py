"""Rich output for deploy / rollback / status (people); `--json` bypasses all of this."""

from __future__ import annotations

from typing import Any, Callable

from rich.console import Console
from rich.table import Table


def print_plan(console: Console, plan: list[dict[str, Any]]) -> None:
    table = Table("#", "step", "hosts", "on failure", "what it does", title="deploy plan (dry run: nothing changed)")
    for i, s in enumerate(plan, 1):
        desc = s["description"]
        for host, argv in s.get("argv", {}).items():
            desc += f"\n  {host}$ " + " ".join(argv if argv[:2] != ["sh", "-c"] else argv[:1] + ["…"])
        table.add_row(str(i), s["name"], ", ".join(s["hosts"]), s["on_failure"], desc)
    console.print(table)


def progress_printer(console: Console) -> Callable[[Any], None]:
    def show(o: Any) -> None:
        mark = "ok " if o.ok else "FAIL"
        console.print(f"  [{mark}] {o.step.name:<14} {', '.join(o.step.hosts):<24} {o.seconds:7.3f} s"
                      + (f"  {o.error}" if o.error else ""), markup=False, highlight=False)

    return show


def print_result(console: Console, result: Any) -> None:
    sent = sum(u.get("bytes_sent", 0) for u in result.uploads.values())
    console.print(f"{result.command} {result.pair}: {result.outcome} in {result.wall_s:.2f} s; "
                  f"package bytes sent: {sent}; receipt {result.receipt}", markup=False)
    if result.active:
        console.print(f"active: {result.active['native_package']} + {result.active['rpc_package']} "
                      f"({result.active['profile_name']})", markup=False)


def print_status(console: Console, out: dict[str, Any]) -> None:
    table = Table("host", "role", "current", "previous", "service", "pid", "matches manifest", "leases",
                  title=f"pair {out['pair']}")
    for host, h in out["hosts"].items():
        leases = "; ".join(str(l.get("holder") or l.get("owner") or l) for l in h["leases"]) or "-"
        table.add_row(host, h["role"], h["current"] or "-", h["previous"] or "-", h["service"],
                      str(h["pid"] or "-"), {True: "yes", False: "NO", None: "-"}[h["matches_manifest"]], leases)
    console.print(table)
    r = out.get("route")
    if r:
        console.print(f"route: revision {r['revision']} active {r['active']} previous {r['previous']} "
                      f"(updated {r['updated_at']} by {r['updated_by']})", markup=False)
    else:
        console.print("route: no record", markup=False)
    console.print(f"health: {out.get('health')}", markup=False)
    for p in out["problems"]:
        console.print(f"problem: {p}", markup=False)
    if out.get("aborted_runs_sealed"):
        console.print(f"sealed {len(out['aborted_runs_sealed'])} killed run(s) as aborted receipts", markup=False)
