"""`pairctl build`: thin; parse options, call `orchestrator.build.builder.build`, print results."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.context import get_ctx, resolve_path


def build(
    ctx: typer.Context,
    rev: str = typer.Option(..., "--rev", help="Revision to build (commit, tag, branch); must resolve to a commit."),
    target: list[str] = typer.Option(
        ..., "--target", "-t", metavar="NAME|PATH", help="Target name (manifests/targets) or YAML path; repeatable."
    ),
    source: Path | None = typer.Option(
        None, "--source", metavar="DIR", help="Git repository to build from (default: the lab source)."
    ),
    expect_tree: str | None = typer.Option(
        None, "--expect-tree", metavar="REV", help="Refuse unless REV's tree equals this revision's tree."
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        metavar="NAME",
        help="The route profile the packages are for (must exist on the config search path); its name is the "
        "package id prefix (default 'pkg').",
    ),
    patch: str | None = typer.Option(
        None,
        "--patch",
        metavar="NAME|DIR",
        help="Kernel patch committed on top of REV: a name from `pairctl kernels list` (also as kernels/NAME) "
        "or a patch folder.",
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", min=1, metavar="N", help="Parallel compile jobs (default: ninja's)."
    ),
) -> None:
    """Build one immutable package per target from an exact, clean git revision.

    The working copy is never compiled: REV's blobs are written as committed (no .gitattributes
    filter, ident or eol conversion), each proven by its blob id, configured with the target's
    flags (GGML_RPC=ON, build info from REV) and compiled; the
    package is hashed file by file and renamed read-only into the store. Building an existing id
    verifies it instead of overwriting it.
    """
    from orchestrator.build.builder import BuildRequest
    from orchestrator.build.builder import build as run_build
    from orchestrator.config import search
    from orchestrator.config.kernels import kernel_dir

    c = get_ctx(ctx)
    if profile is not None:
        search.resolve("profile", profile)  # a typo would name packages after a profile nobody can deploy
    src = resolve_path(source) if source else c.home.lab / "source"
    req = BuildRequest(
        source=src, rev=rev, targets=tuple(target), expect_tree=expect_tree, profile=profile,
        patch=kernel_dir(patch) if patch else None, jobs=jobs,
    )  # fmt: skip
    results = run_build(c.home, req, interactive=None if not c.json_output else False)
    if c.json_output:
        c.emit_json([r.as_dict() for r in results])
        return
    for r in results:
        m = r.package.manifest
        what = "already present, verified" if r.status == "verified" else "built"
        cache = " (build cache hit)" if r.cached else ""
        c.line(f"{what}: {m.id}{cache}  build_info {m.build_info}  tree {c.short(m.tree)}  "
                        f"{len(m.files)} files  {r.duration_s:.1f}s")  # fmt: skip
        c.line(f"  {r.package.path}")
    if results and results[0].receipt:
        c.line(f"receipt {results[0].receipt}")
