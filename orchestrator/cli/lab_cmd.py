"""`pairctl lab up|status|down`: the embedded default (local sshd hosts, source, tiny models)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli.context import Ctx, get_ctx

if TYPE_CHECKING:
    from orchestrator.lab.lab import Lab, LabStatus


app = typer.Typer(
    help="The lab: real sshd hosts on loopback, the pinned llama.cpp source, tiny GGUF models.", no_args_is_help=True
)


def _lab(c: Ctx) -> Lab:
    from orchestrator.lab.lab import Lab

    return Lab(c.home, c.inventory())


def _show(c: Ctx, st: LabStatus) -> None:
    from rich.table import Table

    if c.json_output:
        c.emit_json(st.as_dict())
        return
    t = Table("host", "address", "pid", "state", title="lab hosts")
    for h in st.hosts:
        t.add_row(h.name, f"{h.address}:{h.port}", str(h.pid or "-"), h.state + (" (started)" if h.started else ""))
    c.console.print(t)
    c.line(f"models: {'ok' if st.models_ok else 'missing'} ({st.models['target']} ...)")
    c.line(f"source: {st.source or 'missing'}")
    c.line(f"known_hosts: {st.known_hosts}")


@app.command("up")
def up(
    ctx: typer.Context,
    no_source: bool = typer.Option(False, "--no-source", help="Skip preparing the pinned llama.cpp source."),
) -> None:
    """Start (idempotently) every loopback host of the inventory; write keys, known_hosts, models, source."""
    c = get_ctx(ctx)
    _show(c, _lab(c).up(source=not no_source))


@app.command("status")
def status(ctx: typer.Context) -> None:
    """Per host: running, pid, port answering; and whether models and source are present."""
    c = get_ctx(ctx)
    _show(c, _lab(c).status())


@app.command("down")
def down(ctx: typer.Context) -> None:
    """Stop every process this home's lab started (sshd hosts, servers under host roots), by pid."""
    from orchestrator.lab.lab import down_all

    c = get_ctx(ctx)
    report = down_all(c.home)
    if c.json_output:
        c.emit_json(report.as_dict())
        return
    if not report.stopped:
        c.console.print("lab: nothing was running")
    for s in report.stopped:
        pids = s.get("pids")  # an @reboot crontab line removed has none
        what = f"stopped {s['what']} on {s['host']}" if pids else f"removed the {s['what']} on {s['host']}"
        c.line(what + (f": pids {', '.join(map(str, pids))}" if pids else ""))
