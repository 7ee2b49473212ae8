"""`pairctl logs`: a pair's server logs (Kamal's `app logs`, `journalctl -u ... -n N -f`)."""

from __future__ import annotations

import typer

from orchestrator.cli import options as opts
from orchestrator.cli.context import get_ctx

FOLLOW_MAX_S = 86400.0


def logs(
    ctx: typer.Context,
    pair: str = opts.PAIR,
    host: str = typer.Option(
        "both", "--host", metavar="native|rpc|both", help="Whose log: llama-server's (native), ggml-rpc-server's (rpc)."
    ),
    lines: int = typer.Option(50, "-n", "--lines", metavar="N", help="How many of the last lines to show (0-100000)."),
    follow_: bool = typer.Option(False, "-f", "--follow", help="Then print lines as they are appended."),
    for_s: float = typer.Option(
        600.0,
        "--for",
        metavar="SECONDS",
        help="How long --follow follows (bounded: default 600 s); Ctrl-C stops it sooner (exit 0).",
    ),
) -> None:
    """Show the last lines of PAIR's service output (run/llama-server.out on the native host,
    run/ggml-rpc-server.out on the RPC host; the host's runtime dir's while a service runs from
    there because run/ is read-only), each line prefixed with its host.

    A read: no lease, no receipt, nothing changes. Each file is read only as a regular file and
    at most 1 MiB at a time. Exit 4 when a host does not answer (the other host's lines are still
    shown, and the host is named); 6 when a log is not a regular file. With --json: one document
    {pair, logs: [{host, role, path, lines, size, error, truncated}]}; --follow then is a usage
    error (exit 2)."""
    from orchestrator.errors import HostError, HostStateError, UsageError
    from orchestrator.ops.logs import follow, roles_of, tail
    from orchestrator.remote.pool import TransportPool

    c = get_ctx(ctx)
    if not 0 <= lines <= 100000:
        raise UsageError(f"-n {lines}: give 0 to 100000 lines")
    if not 1 <= for_s <= FOLLOW_MAX_S:
        raise UsageError(f"--for {for_s:g}: give 1 to {FOLLOW_MAX_S:g} seconds")
    try:
        roles_of(host)
    except ValueError:
        raise UsageError(f"--host {host!r}: say native, rpc or both") from None
    if follow_ and c.json_output:
        raise UsageError("--follow prints lines as they come and --json one document: use one of them")
    inv = c.inventory()
    inv.pair(pair)  # an unknown pair: exit 3 before any connection
    with TransportPool(inv) as pool:
        got = tail(pool, inv, pair, host, lines)
        if c.json_output:
            c.emit_json({"pair": pair, "logs": [g.as_dict() for g in got]})
        else:
            for g in got:
                if g.error is None:
                    head = f"==> {g.host} {g.path}" + (" (no file: never started)" if g.size is None else "")
                    c.line(head + (" (last 1 MiB)" if g.truncated else "") + " <==")
                for line in g.lines:
                    c.line(f"{g.host} | {line}")
        if follow_:
            try:
                for h, line in follow(pool, got, seconds=for_s):
                    c.line(f"{h} | {line}")
            except KeyboardInterrupt:
                pass
    down = [g for g in got if g.error is not None]
    if down:
        err = HostError if any(g.exit_code == 4 for g in down) else HostStateError
        raise err(
            "; ".join(f"{g.host}: {g.error}" for g in down)
            + ("; the other host's lines are shown" if len(down) < len(got) else ""),
            hint="fix the host (sshd, network, key) and look again",
        )
