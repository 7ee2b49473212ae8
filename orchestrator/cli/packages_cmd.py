"""`pairctl packages list|show|verify`: read the package store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.context import Ctx, get_ctx

if TYPE_CHECKING:
    from orchestrator.build.store import PackageStore

app = typer.Typer(help="List, show and verify built packages.", no_args_is_help=True)


def _store(ctx: typer.Context) -> tuple[Ctx, PackageStore]:
    from orchestrator.build.store import PackageStore

    c = get_ctx(ctx)
    return c, PackageStore(c.home.store)


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """List packages in the store."""
    c, store = _store(ctx)
    pkgs = store.list()
    if c.json_output:
        c.emit_json([{"id": p.id, "revision": p.manifest.revision, "target": p.manifest.target.name,
                      "build_info": p.manifest.build_info, "content_digest": p.manifest.content_digest,
                      "path": str(p.path)} for p in pkgs])  # fmt: skip
        return
    from rich.table import Column, Table

    table = Table(Column("id", no_wrap=True), Column("build_info", no_wrap=True), "target", "tree", "files",
                  Column("finished", no_wrap=True))  # fmt: skip
    for p in pkgs:
        m = p.manifest
        table.add_row(m.id, m.build_info, m.target.name, c.short(m.tree, 10), str(len(m.files)), m.finished_at[:19])
    c.console.print(table)


def _known(store: Any, package_id: str) -> str:
    """An ID that names no package is a usage error (exit 2), as for a receipt hash; exit 6 stays
    for a package that is there and broken."""
    from orchestrator.errors import PackageError

    try:
        known = store.exists(package_id)
    except PackageError:  # not even a valid id
        known = False
    if not known:
        raise typer.BadParameter(
            f"no package {package_id!r} in {store.root}; `pairctl packages list` shows them", param_hint="ID"
        )
    return package_id


@app.command("show")
def show(ctx: typer.Context, package_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Show a package's manifest."""
    c, store = _store(ctx)
    pkg = store.get(_known(store, package_id))
    m = pkg.manifest
    if c.json_output:
        c.emit_json(m.model_dump(mode="json") | {"path": str(pkg.path)})
        return
    from rich.table import Table

    c.line(f"{m.id}  ({pkg.path})")
    for k in ("revision", "tree", "build_info", "build_host", "started_at", "finished_at", "content_digest"):
        c.line(f"  {k}: {getattr(m, k)}")
    c.line(f"  target: {m.target.name}   toolchain: {m.toolchain}")
    c.line(f"  source_diff: {'(empty)' if not m.source_diff else 'NOT EMPTY'}")
    if m.patch:
        c.line(f"  patch: {m.patch.name} {m.patch.sha256}")
    table = Table("file", "kind", "mode", "size", "sha256")
    for rel, e in sorted(m.files.items()):
        table.add_row(rel, e.kind, e.mode, str(e.size), e.sha256)
    c.console.print(table)


@app.command("verify")
def verify(ctx: typer.Context, package_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Rehash every file of a package against its manifest; any difference fails (exit 6), by file."""
    c, store = _store(ctx)
    report = store.verify(_known(store, package_id), check=False)
    doc = {"id": report.id, "ok": report.ok, "files_checked": report.files_checked, "problems": report.problems}
    ok = [f"ok {report.id}: {report.files_checked} files match the manifest"] if report.ok else []
    c.say(doc, *(f"FAIL {p}" for p in report.problems), *ok)
    if not report.ok:
        from orchestrator.errors import PackageError

        raise PackageError(f"package {package_id} fails verification: " + "; ".join(report.problems))
