"""The `pairctl` console script. Only `main()` turns exceptions into exit codes and messages, so
no traceback reaches a user; with `--json` it prints the run's one JSON document (with `error` on
failure). Start-up: this module imports typer and the command registry only (cli/lazy.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from orchestrator import __version__, interrupt, terminal
from orchestrator.cli.commands import COMMANDS
from orchestrator.cli.lazy import LazyGroup
from orchestrator.cli.options import Globals
from orchestrator.errors import ExitCode, PairctlError, UsageError

EXIT_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILURE: "a check, gate or verification failed (status: a mismatch; diff: a difference)",
    ExitCode.USAGE: "bad command line (also an id, hash or check name that names nothing)",
    ExitCode.CONFIG: "invalid manifest, inventory, profile, plan or playbook (or a name it does not define)",
    ExitCode.HOST: "a host could not be reached, or its host key is unknown or changed",
    ExitCode.LEASED: "a host is leased by someone else (or another pairctl run holds the pair)",
    ExitCode.BUILD: "build or package problem, damaged host state, a pair never deployed, or a host short of space",
    ExitCode.ROLLED_BACK: "failed after activation began; previous pair restored and verified",
    ExitCode.ROLLBACK_FAILED: "rollback (or restart/start/stop) failed: hosts left stopped, leases kept",
    ExitCode.INCONCLUSIVE: "inconclusive (not enough valid data)",
    ExitCode.EVIDENCE: "a receipt or chain does not verify",
    ExitCode.SKIPPED: "skipped (a scheduled run found the pair leased)",
    ExitCode.INTERRUPTED: "interrupted",
}

# "\b" keeps click from re-wrapping the table into one paragraph.
EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(f"  {c.value:>3}  {EXIT_MEANINGS[c]}" for c in ExitCode)


class RootGroup(LazyGroup):
    registry = COMMANDS


app = typer.Typer(
    name="pairctl",
    cls=RootGroup,
    help=(
        "Build, deploy, accept, qualify and roll back matched llama.cpp native/RPC GPU pairs.\n\n"
        "State (packages, receipts, lab) lives under PAIRCTL_HOME (or --home). The options "
        "--json, -i/--inventory, --home and -v are accepted before or after any command.\n\n" + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pairctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """The global options live in cli/options.py and are attached to every command."""


def _meaning(code: int) -> str:
    return next((text for c, text in EXIT_MEANINGS.items() if c == code), f"exit {code}")


def _error(
    code: int, message: str, *, kind: str, hint: str | None = None, receipt: str | None = None
) -> dict[str, Any]:
    """The `error` object of a failed run's JSON document (schema: cli/outputs.py ErrorInfo)."""
    return dict(exit_code=code, kind=kind, message=message, hint=hint, receipt=receipt, meaning=_meaning(code))


def _print_document(g: Globals, code: int, error: dict[str, Any] | None) -> None:
    """Exactly one JSON document: the command's own, with `error` added when the run failed."""
    doc: Any = g.document if g.has_document else None
    if error is not None:
        if isinstance(doc, dict):
            if error.get("receipt") is None and isinstance(doc.get("receipt"), str):
                error = {**error, "receipt": doc["receipt"]}  # e.g. a failed acceptance: its receipt
            doc = {**doc, "error": error}
        else:
            doc = {"error": error} if doc is None else {"result": doc, "error": error}
    elif doc is None:
        doc = {"exit_code": code}
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


# Commands that take leases: a signal during them stops the run at its next bounded point and
# ends it like a failure (rollback, leases released; orchestrator/interrupt.py). Others keep
# Python's default handling (SIGTERM kills, SIGINT is a KeyboardInterrupt: exit 130).
GUARDED_COMMANDS = frozenset(
    {"deploy", "rollback", "accept", "qualify", "lease", "releases", "repair", "kernels", "restart", "start", "stop"}
    | {"bisect"}  # holds the pair's leases across its steps
)


def _command_word(args: list[str]) -> str | None:
    return next((a for a in args if a in COMMANDS), None)


def _check_text(args: list[str]) -> None:
    """Every argument must be text: bytes that are not UTF-8 reach Python as lone surrogates,
    which no receipt, lease file or terminal can carry (a `--purpose` of them was an internal
    error after the leases were asked for). Refused as a usage error before anything runs."""
    for i, a in enumerate(args, 1):
        try:
            a.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(
                f"argument {i} ({a.encode('utf-8', 'backslashreplace').decode('ascii', 'backslashreplace')!s}) "
                "is not valid UTF-8 text",
                hint="pass it as UTF-8 text",
            ) from None


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        # Text read from hosts and from evidence can hold a lone surrogate (a non-UTF-8 argv or
        # lease field read back): it is shown escaped, never an internal error while printing.
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            reconfigure(errors="backslashreplace")
    g = Globals()
    if (ev := sys.modules.get("orchestrator.evidence.store")) is not None:
        ev.WRITTEN.clear()  # only this run's receipts are pushed after it (in-process callers: tests)
    error: dict[str, Any] | None = None
    code = 0
    if _command_word(args) in GUARDED_COMMANDS and argv is None:  # the console script, in its main thread
        interrupt.guard()
    try:
        _check_text(args)
        rv = app(args=args, standalone_mode=False, obj=g, prog_name="pairctl")
        code = int(rv) if isinstance(rv, int) else 0
    except PairctlError as exc:
        code = int(exc.exit_code)
        typer.echo(f"pairctl: error: {terminal.visible(str(exc))}", err=True)
        error = _error(code, exc.message, kind=type(exc).__name__, hint=exc.hint, receipt=getattr(exc, "receipt", None))
    except KeyboardInterrupt as exc:
        code = int(ExitCode.INTERRUPTED)
        typer.echo("pairctl: interrupted", err=True)
        error = _error(code, "interrupted", kind="KeyboardInterrupt", receipt=getattr(exc, "receipt", None))
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        code = int(ExitCode.INTERRUPTED)
        typer.echo("pairctl: aborted", err=True)
        error = _error(code, "aborted", kind="Abort")
    except typer.TyperException as exc:  # click's usage errors (typer bundles its own click)
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        code = int(exc.exit_code)
        error = _error(code, exc.format_message(), kind=type(exc).__name__, hint="pairctl COMMAND --help")
    except Exception as exc:  # anything unexpected: one line here, the traceback in the JSON log
        code = int(ExitCode.FAILURE)
        typer.echo(f"pairctl: internal error: {type(exc).__name__}: {terminal.visible(str(exc))}", err=True)
        where = _log_internal_error(g)
        if where:
            typer.echo(f"(details in {where})", err=True)
        error = _error(code, f"internal error: {type(exc).__name__}: {exc}", kind="InternalError")
    code, error = _after_signal(code, error)
    _push_receipts(g)
    _log_end(g, args, code, error)
    # A usage error can stop parsing before --json is read: the word on the command line counts.
    if (g.json_output or "--json" in args) and (g.ran or error is not None):
        if code != 0 and error is None:  # the command chose its exit code (typer.Exit)
            error = _error(code, _meaning(code), kind="Exit")
        _print_document(g, code, error)
    sys.exit(code)


def _push_receipts(g: Globals) -> None:
    """Receipts this run sealed go to the team's evidence remote, if the inventory names one."""
    if g.context is None:
        return
    from orchestrator.cli.context import Ctx
    from orchestrator.cli.receipts_remote import push_after_run

    try:
        if isinstance(g.context, Ctx):
            push_after_run(g.context)
    except Exception as exc:  # never fail a command that already ended over its push
        typer.echo(f"pairctl: warning: receipts not pushed: {type(exc).__name__}: {exc}", err=True)


def _after_signal(code: int, error: dict[str, Any] | None) -> tuple[int, dict[str, Any] | None]:
    """A run a signal stopped exits INTERRUPTED (130) after its cleanup, whatever failure path it
    took (rolled back: 7; refused before any change); a failed rollback keeps 8, which names the
    kept leases. A run that had passed its last bounded point finishes with its own code."""
    sig = interrupt.received()
    if sig is None:
        return code, error
    if code == 0:
        typer.echo(f"pairctl: {sig} arrived after the last point the run could stop at; it completed", err=True)
        return code, error
    if code == int(ExitCode.ROLLBACK_FAILED):
        return code, error
    code = int(ExitCode.INTERRUPTED)
    if error is not None:
        message = error["message"] if sig in error["message"] else f"interrupted by {sig}: {error['message']}"
        error = {**error, "exit_code": code, "meaning": _meaning(code), "message": message}
    else:
        error = _error(code, f"interrupted by {sig}", kind="Interrupted")
    typer.echo(f"pairctl: interrupted by {sig}; cleanup done (exit {code})", err=True)
    return code, error


# Exit codes that mean "refused before any change" (docs/reference/exit-codes.md): the log calls them refusals.
_REFUSALS = frozenset({ExitCode.USAGE, ExitCode.CONFIG, ExitCode.HOST, ExitCode.LEASED, ExitCode.BUILD})


def _log_end(g: Globals, args: list[str], code: int, error: dict[str, Any] | None) -> None:
    """One info event in the JSON log for how the command ended (also a refusal before any run
    began, an interrupt, a usage error), with its pair and receipt, so alerting needs no stderr."""
    if g.context is None:  # logging was never set up (`--help`, a usage error before the command ran)
        return
    try:
        from orchestrator import log

        sig = interrupt.received()
        if code == int(ExitCode.INTERRUPTED) or (sig is not None and code != 0):
            name = "interrupted"
        elif code in {int(c) for c in _REFUSALS}:
            name = "refused"
        else:
            name = "command finished"
        doc = g.document if g.has_document and isinstance(g.document, dict) else {}
        log.get_logger().info(
            name,
            command=_command_word(args),
            pair=_pair_of(args) or doc.get("pair"),
            exit_code=code,
            meaning=_meaning(code),
            receipt=(error or {}).get("receipt") or doc.get("receipt"),
            error_kind=(error or {}).get("kind"),
            error=(error or {}).get("message"),
            signal=sig,
        )
    except Exception:  # the log must never change an exit code
        pass


def _pair_of(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--pair" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--pair="):
            return a.split("=", 1)[1]
    return None


def _log_internal_error(g: Globals) -> str | None:
    try:
        # start-up: the logging stack is loaded only when a command runs (or fails)
        from orchestrator.cli.context import log_internal_error

        return str(log_internal_error(g))
    except Exception:
        return None
