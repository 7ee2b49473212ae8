"""`pairctl schedule install|list|remove`: acceptance on a timer."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx
from orchestrator.errors import PairctlError

app = typer.Typer(
    help="Run acceptance on a schedule (systemd timers; a crontab line where systemd is absent).", no_args_is_help=True
)


def _pairctl_exe() -> str:
    """The pairctl of this installation (next to this interpreter, venv symlinks kept)."""
    beside = Path(sys.executable).absolute().parent / "pairctl"
    if beside.exists():
        return str(beside)
    exe = shutil.which("pairctl")
    if exe:
        return str(Path(exe).absolute())
    raise PairctlError("cannot find the pairctl executable to schedule")


@app.command("install")
def install(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    every: str = typer.Option("6h", "--every", metavar="DURATION", help="Interval: 30m, 6h, 1d ..."),
    checks: list[str] | None = opts.CHECKS,
    system: bool = typer.Option(False, "--system", help="System units in /etc/systemd/system instead of user units."),
    unit_dir: Path | None = typer.Option(
        None, "--unit-dir", metavar="DIR", help="Write the units here (and do not enable them)."
    ),
) -> None:
    """Write a service + timer that run `pairctl accept --scheduled` for PAIR every interval.

    A scheduled run that finds the pair leased by someone else records `skipped: leased by ...`
    and exits 11, which the unit treats as success. Without systemd, prints the crontab line.
    """
    from orchestrator.config import search
    from orchestrator.ops import schedule as sched

    c = get_ctx(ctx)
    c.inventory().pair(pair)  # the pair must exist
    inventory = search.resolve_ref("inventory", c.inventory_ref).resolve()  # the file the search path finds now
    s = sched.Schedule(
        pair=pair,
        every_s=sched.parse_every(every),
        argv=sched.accept_argv(
            _pairctl_exe(),
            home=str(c.home.root),
            inventory=str(inventory),
            pair=pair,
            checks=opts.check_names(checks),
        ),
        home=str(c.home.root),
    )
    if unit_dir is None and not sched.systemd_running():
        line = s.crontab_line()
        if c.json_output:
            c.emit_json({"mode": "cron", "line": line})
        else:
            c.line("systemd is not running here; add this line to the crontab (crontab -e):")
            typer.echo(line)
        return
    directory = unit_dir or sched.unit_dir(system)
    paths = sched.write_units(s, directory)
    sched.verify_units(paths)
    enabled = False
    if unit_dir is None:
        sched.systemctl(system, "daemon-reload")
        sched.systemctl(system, "enable", "--now", f"{s.unit_name}.timer")
        enabled = True
    c.say(
        {"mode": "systemd", "units": [str(p) for p in paths], "enabled": enabled},
        *(f"wrote {p}" for p in paths),
        "enabled and started the timer" if enabled else "units written (not enabled: --unit-dir)",
    )


@app.command("list")
def list_(
    ctx: typer.Context,
    system: bool = typer.Option(False, "--system", help="System units instead of user units."),
    unit_dir: Path | None = typer.Option(None, "--unit-dir", metavar="DIR", help="Look in this folder instead."),
) -> None:
    """List the schedules pairctl installed."""
    from rich.table import Table

    from orchestrator.ops import schedule as sched

    c = get_ctx(ctx)
    rows = sched.list_units(unit_dir or sched.unit_dir(system))
    if c.json_output:
        c.emit_json(rows)
        return
    t = Table("unit", "every", "timer file")
    for r in rows:
        t.add_row(r["unit"], r["every"], r["timer"])
    c.console.print(t)


@app.command("remove")
def remove(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    system: bool = typer.Option(False, "--system", help="System units instead of user units."),
    unit_dir: Path | None = typer.Option(None, "--unit-dir", metavar="DIR", help="Remove from this folder instead."),
) -> None:
    """Stop and remove the schedule of PAIR."""
    from orchestrator.ops import schedule as sched

    c = get_ctx(ctx)
    name = sched.Schedule(pair=pair, every_s=3600, argv=("x",), home="").unit_name
    if unit_dir is None and sched.systemd_running():
        with contextlib.suppress(Exception):
            sched.systemctl(system, "disable", "--now", f"{name}.timer")
    removed = sched.remove_units(name, unit_dir or sched.unit_dir(system))
    c.say(
        {"removed": [str(p) for p in removed]},
        f"removed {len(removed)} unit file(s)" if removed else f"no schedule for pair {pair}",
    )
