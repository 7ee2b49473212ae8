"""`pairctl kernels list|verify|check`: kernel patches, and their CPU-reference cases on a pair."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from orchestrator.cli import options as opts
from orchestrator.cli.context import Ctx, get_ctx
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.checks.kernels import KernelCheckResult

app = typer.Typer(
    help="Kernel patches (kernels/<name>) and their CPU-reference validation cases.", no_args_is_help=True
)


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """Every kernel patch folder: scope, base blobs, patch sha256 (verified) and case names."""
    from orchestrator.config.kernels import describe_all

    c = get_ctx(ctx)
    rows = describe_all()
    if c.json_output:
        c.emit_json(rows)
        return
    t = Table("name", "scope", "cases", "patch sha256", title="kernel patches")
    for r in rows:
        t.add_row(
            str(r["name"]),
            str(r.get("scope_line", r.get("error", ""))),
            ", ".join(r.get("cases") or []),
            c.short(str(r.get("patch_sha256") or ""), 16),
        )
    c.console.print(t)


@app.command("verify")
def verify(
    ctx: typer.Context,
    kernel: str = typer.Argument("mmvf-warp-per-row", help="Kernel folder name or path."),
    source: Path | None = typer.Option(
        None, help="Source git repo; default: the lab source (PAIRCTL_HOME/lab/source)."
    ),
    rev: str = typer.Option("baseline", help="Revision the patch must apply to."),
) -> None:
    """Metadata and hash match the diff, REV has the base blobs, and `git apply --check` passes."""
    from orchestrator.build.patching import verify_patch

    c = get_ctx(ctx)
    repo = source or (c.home.lab / "source")
    out = verify_patch(kernel, repo, rev)
    c.say(
        out,
        f"ok   {out['kernel']} applies to {c.short(out['base'])} in {out['repo']} "
        f"(patch sha256 {c.short(out['patch_sha256'], 16)})",
    )


@app.command("check")
def check(
    ctx: typer.Context,
    pair: list[str] | None = opts.PAIRS,
    all_pairs: bool = opts.ALL_PAIRS,
    parallel: int = opts.parallel(1, "Pairs checked"),
    kernel: str = typer.Option("mmvf-warp-per-row", "--kernel", help="Kernel folder whose cases.yaml to run."),
    port: int | None = typer.Option(
        None, "--port", help="Port of the second rpc-server (default: the pair's rpc_port + 1)."
    ),
    package: list[str] | None = typer.Option(
        None, "--package", metavar="HOST=ID", help="HOST=PACKAGE_ID (default: each host's active release)."
    ),
    perturb: list[str] | None = typer.Option(
        None,
        "--perturb",
        metavar="CASE",
        help="Perturb this case's CPU reference on purpose (proves the check can fail).",
    ),
) -> None:
    """Run the active packages' kernel harness on both hosts of the pair; write a receipt.

    On CPU hosts the backend under test is the pair's RPC device, through a second rpc-server
    started on --port (never the one a live llama-server holds) and stopped afterwards.
    """
    from orchestrator.checks.kernels import KernelCheckFailed, run_kernel_check

    c = get_ctx(ctx)
    packages = None
    if package:
        packages = {}
        for item in package:
            host, sep, pid = item.partition("=")
            if not sep or not host or not pid:
                raise ConfigError(f"--package {item!r}: expected HOST=PACKAGE_ID")
            packages[host] = pid
    from orchestrator.ops.fleet import fan_out, select_pairs

    inv = c.inventory()
    pairs = select_pairs(inv, pair, all_pairs)
    if packages and len(pairs) > 1:
        raise ConfigError("--package names hosts of one pair; give one --pair with it")

    def one(name: str) -> KernelCheckResult:
        argv = ["pairctl", "kernels", "check", "--pair", name, "--kernel", kernel]
        return run_kernel_check(
            inv, name, home=c.home, kernel=kernel, packages=packages, port=port, perturb=perturb or (), argv=argv
        )

    if len(pairs) == 1 and not all_pairs:
        try:
            result = one(pairs[0])
        except KernelCheckFailed as exc:
            if exc.result is not None:
                _show(c, exc.result)
            raise
        _show(c, result)
        return
    results = fan_out(pairs, one, parallel=parallel)
    if c.json_output:
        c.emit_json(
            {
                "ok": results.ok,
                "pairs": [
                    {
                        "pair": o.pair,
                        "ok": o.ok,
                        "exit_code": o.exit_code,
                        "error": o.error,
                        "result": o.value.to_dict() if o.value is not None else None,
                    }
                    for o in results.outcomes
                ],
            }
        )
    else:
        for o in results.outcomes:
            if o.value is not None:
                _show(c, o.value)
            else:
                c.line(f"pair {o.pair}: {o.error}")
    if not results.ok:
        raise typer.Exit(results.exit_code())


def _show(c: Ctx, result: KernelCheckResult) -> None:
    if c.json_output:
        c.emit_json(result.to_dict())
        return
    cols = ("host", "case", "backend", "nmse", "max err", "µs/run", "cpu µs/run", "ok")
    t = Table(*cols, title=f"kernel cases {result.plan.kernel} on pair {result.plan.pair}")
    for v in result.verdicts:
        for r in v.rows:
            t.add_row(
                v.host,
                str(r.get("case")),
                str(r.get("backend")),
                _num(r.get("nmse")),
                _num(r.get("max_err")),
                _num(r.get("us_per_run")),
                _num(r.get("cpu_us_per_run")),
                ("yes" if r.get("passed") else "NO") + (" (perturbed)" if r.get("perturbed") else ""),
            )
    c.console.print(t)
    for p in result.problems:
        c.line(f"FAIL {p}")
    c.line(f"{'passed' if result.passed else 'failed'}; receipt {result.receipt}")


def _num(x: object) -> str:
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)
