"""`pairctl build`: from an exact, clean revision to one verified package per target.

Refuse a dirty tree or a non-commit, check `--expect-tree` and the toolchain; per target, the build
cache or export + prove + configure + compile; assemble in a temporary folder, hash, rename into the
store (or verify the existing package of that id).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from orchestrator.build import git, patching
from orchestrator.build.git import Revision
from orchestrator.build.harness import build_harness
from orchestrator.build.manifest import (
    PackageManifest,
    PatchRecord,
    TargetRecord,
    content_digest,
    diff_entries,
    package_id,
)
from orchestrator.build.plan import BuildPlan, make_plan
from orchestrator.build.progress import Reporter, make_reporter, parse_ninja_status
from orchestrator.build.store import Package, PackageStore, entries_for, remove_tree, verify_tree
from orchestrator.build.toolchain import Toolchain, check_toolchain, configured_toolkit_mismatch
from orchestrator.config.targets import Target, load_target
from orchestrator.errors import BuildError, PackageError
from orchestrator.evidence.journal import Journal
from orchestrator.evidence.store import EvidenceStore
from orchestrator.filelock import file_lock
from orchestrator.log import get_logger
from orchestrator.paths import Home

HELP_TIMEOUT_S = 60
OUTPUTS_MARKER = "outputs.json"


@dataclass(frozen=True)
class BuildRequest:
    source: Path
    rev: str
    targets: tuple[str, ...]
    expect_tree: str | None = None
    profile: str | None = None
    patch: Path | None = None
    jobs: int | None = None


@dataclass(frozen=True)
class BuildResult:
    package: Package
    status: Literal["built", "verified"]  # verified = the id existed and matched file for file
    cached: bool  # cmake was skipped: outputs came from the build cache
    duration_s: float
    log_path: Path | None
    receipt: str | None = None  # evidence receipt hash of the `pairctl build` run

    def as_dict(self) -> dict[str, object]:
        m = self.package.manifest
        return {
            "id": m.id, "status": self.status, "cached": self.cached, "duration_s": round(self.duration_s, 2),
            "path": str(self.package.path), "revision": m.revision, "tree": m.tree, "build_info": m.build_info,
            "target": m.target.name, "content_digest": m.content_digest,
            "log": str(self.log_path) if self.log_path else None,
            "receipt": self.receipt,
        }  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_logged(argv: list[str], *, env: dict[str, str], log_path: Path, cwd: Path | None = None,
               on_line: Callable[[str], None] | None = None) -> None:  # fmt: skip
    """Run argv (no shell), append its output to log_path, feed each line to on_line."""
    with open(log_path, "a", encoding="utf-8", buffering=1) as log:  # line-buffered: `tail -f` works
        log.write(f"$ {subprocess.list2cmdline(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if on_line:
                on_line(line)
        rc = proc.wait()
        log.write(f"[exit {rc}]\n")
    if rc != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        raise BuildError(f"{argv[0]} {argv[1]} failed (exit {rc}); full log: {log_path}\n{tail}")


def _apply_patch(repo: Path, rev: Revision, patch_dir: Path) -> tuple[Revision, PatchRecord]:
    """`--patch kernels/<name>`: the kernels module commits the patch on top of REV."""
    new_rev = patching.apply_patch_commit(repo, rev.commit, patch_dir)
    record = PatchRecord(name=patch_dir.name, sha256=patching.patch_digest(patch_dir), base_revision=rev.commit)
    return git.resolve(repo, new_rev), record


def _find_output(build_dir: Path, name: str) -> Path:
    direct = build_dir / "bin" / name
    if direct.is_file():
        return direct
    for p in build_dir.rglob(name):
        if p.is_file() and os.access(p, os.X_OK):
            return p
    raise BuildError(f"the build finished but produced no {name} under {build_dir}")


def compile_outputs(plan: BuildPlan, repo: Path, outputs: Path, *, log_path: Path, reporter: Reporter) -> None:
    """Export, prove, configure and compile; copy the binaries to `outputs` (written last = complete)."""
    log = get_logger(step="build.compile", target=plan.target.name, rev=plan.revision.short)
    for d in (plan.src_dir, plan.build_dir):
        remove_tree(d)  # a stable path, fresh content: ccache reuses objects, ninja never sees stale state
    reporter.phase("export")
    git.export_tree(repo, plan.revision.commit, plan.src_dir)
    diff = git.export_differences(repo, plan.revision.commit, plan.src_dir)
    if diff:
        raise BuildError(f"exported tree differs from {plan.revision.commit}: {diff[0]}"
                         + (f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""))  # fmt: skip
    env = plan.env(dict(os.environ))
    reporter.phase("configure")
    log.info("configure", argv=plan.configure_argv())
    run_logged(plan.configure_argv(), env=env, log_path=log_path)
    nvcc = plan.defines.get("CMAKE_CUDA_COMPILER")
    if nvcc and (why := configured_toolkit_mismatch(_read(plan.build_dir / "CMakeCache.txt"), nvcc)):
        raise BuildError(why, hint=f"nothing was compiled; full log: {log_path}")
    reporter.phase("compile")
    log.info("compile", argv=plan.build_argv())

    def on_line(line: str) -> None:
        st = parse_ninja_status(line)
        if st:
            reporter.update(*st)

    run_logged(plan.build_argv(), env=env, log_path=log_path, on_line=on_line)
    tmp = outputs.with_name(outputs.name + ".tmp")
    remove_tree(tmp)
    for name in plan.target.build_targets:
        _copy(_find_output(plan.build_dir, name), tmp / "bin" / name)
    for name in plan.target.test_targets:
        _copy(_find_output(plan.build_dir, name), tmp / "tests" / "bin" / name)
    # The kernel validation harness, linked exactly like the package's ggml-rpc-server (kernels/harness).
    if plan.target.kernel_harness:
        reporter.phase("harness")
        build_harness(plan.build_dir, plan.src_dir, tmp / "tests" / "bin", plan.target)
    libs = sorted(p for p in (plan.build_dir / "bin").glob("*.so*") if p.is_file())
    for lib in libs:
        _copy(lib, tmp / "lib" / lib.name)
    (tmp / OUTPUTS_MARKER).write_text(json.dumps({"key": plan.key, "revision": plan.revision.commit,
                                                  "tree": plan.revision.tree, "defines": plan.defines,
                                                  "finished_at": _now()}, indent=2))  # fmt: skip
    remove_tree(outputs)
    tmp.rename(outputs)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)


def _run_capture(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=HELP_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise BuildError(f"{argv[0]} {argv[1]} did not finish in {HELP_TIMEOUT_S}s") from None


def assemble(plan: BuildPlan, outputs: Path, tmp: Path, *, reporter: Reporter) -> dict[str, str]:
    """Copy outputs into the package folder `tmp`, capture --help/--version; return {relpath: kind}."""
    kinds: dict[str, str] = {}
    for sub, kind in (("bin", "runtime"), ("lib", "runtime"), ("tests/bin", "test")):
        d = outputs / sub
        if d.is_dir():
            for f in sorted(d.iterdir()):
                _copy(f, tmp / sub / f.name)
                kinds[f"{sub}/{f.name}"] = kind
    env = plan.env(dict(os.environ))
    if (tmp / "lib").is_dir():
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(tmp / "lib"), env.get("LD_LIBRARY_PATH")) if p)
    server = tmp / "bin" / "llama-server"
    _check_libs(tmp, env)
    reporter.phase("capture --help")
    helped = _run_capture([str(server), "--help"], env)
    help_text = helped.stdout if helped.stdout.strip() else helped.stderr
    if helped.returncode != 0 or "--rpc" not in help_text:
        raise BuildError(
            f"{server} --help failed (exit {helped.returncode}) or lists no --rpc:\n"
            f"{(helped.stderr or help_text)[-1500:]}"
        )
    version = _run_capture([str(server), "--version"], env)
    version_text = (version.stdout + version.stderr).strip() + "\n"
    if f"commit {plan.revision.short}" not in version_text or f"build {plan.revision.count}," not in version_text:
        raise BuildError(
            f"{server} --version does not name build {plan.revision.count}, commit {plan.revision.short}:\n"
            f"{version_text}"
        )
    (tmp / "meta").mkdir(exist_ok=True)
    (tmp / "meta" / "llama-server.help.txt").write_text(help_text, encoding="utf-8")
    (tmp / "meta" / "version.txt").write_text(version_text, encoding="utf-8")
    kinds["meta/llama-server.help.txt"] = "meta"
    kinds["meta/version.txt"] = "meta"
    return kinds


def _check_libs(pkg: Path, env: dict[str, str]) -> None:
    """Each binary must find every shared library it needs from the package itself or the system."""
    if not shutil.which("ldd"):
        return
    for b in sorted((pkg / "bin").iterdir()):
        out = subprocess.run(["ldd", str(b)], capture_output=True, text=True, env=env).stdout
        missing = [line.strip() for line in out.splitlines() if "not found" in line]
        if missing:
            raise BuildError(f"{b.name} needs shared libraries the package does not carry: {missing}")


def build_target(req: BuildRequest, target: Target, rev: Revision, toolchain: Toolchain, *, home: Home,
                 store: PackageStore, patch: PatchRecord | None, interactive: bool | None) -> BuildResult:  # fmt: skip
    t0 = time.monotonic()
    started = _now()
    plan = make_plan(target, rev, toolchain, home.build_cache, jobs=req.jobs)
    pid = package_id(req.profile, rev.commit, target.name)
    log = get_logger(step="build", target=target.name, rev=rev.short, package=pid)
    outputs = home.build_cache / "outputs" / plan.key
    reporter = make_reporter(target.name, interactive=interactive)
    log_path: Path | None = None
    cached = True
    status: Literal["built", "verified"]
    try:
        with file_lock(home.build_cache / "work" / f"{target.name}.lock"):
            if not (outputs / OUTPUTS_MARKER).is_file():
                cached = False
                log_dir = home.logs / "build"
                log_dir.mkdir(parents=True, exist_ok=True)
                log_path = log_dir / f"{pid}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.log"
                compile_outputs(plan, req.source, outputs, log_path=log_path, reporter=reporter)
            else:
                log.info("build cache hit: skipping cmake", key=plan.key)
        tmp = store.new_temp_dir()
        try:
            kinds = assemble(plan, outputs, tmp, reporter=reporter)
            reporter.phase("hash", len(kinds))
            done = itertools.count(1)
            files = entries_for(tmp, kinds, on_done=lambda _p: reporter.update(next(done), len(kinds)))
            manifest = PackageManifest(
                id=pid, revision=rev.commit, tree=rev.tree, build_number=rev.count, build_info=rev.build_info,
                source_diff="", target=TargetRecord(name=target.name, spec=target.model_dump(mode="json")),
                cmake_flags=plan.defines, toolchain=toolchain.versions(), build_host=socket.gethostname(),
                build_cache_key=plan.key, started_at=started, finished_at=_now(), files=files,
                content_digest=content_digest(files), patch=patch,
            )  # fmt: skip
            with file_lock(store.root / f".{pid}.lock"):
                if store.exists(pid):
                    status = "verified"
                    existing = store.get(pid)
                    problems = diff_entries(existing.manifest.files, files)
                    problems += [
                        f"existing package: {p}" for p in verify_tree(existing.path, existing.manifest).problems
                    ]
                    if problems:
                        raise PackageError(
                            f"package {pid} already exists and differs from this build; nothing was replaced:\n"
                            + "\n".join(f"  {p}" for p in problems),
                            hint="a package is never modified in place; remove it explicitly if it is known bad",
                        )
                    package = existing  # tmp goes below
                    log.info("package already present, verified", path=str(package.path))
                else:
                    status = "built"
                    package = store.install(tmp, manifest)
                    log.info("package built", path=str(package.path), digest=manifest.content_digest)
        finally:
            remove_tree(tmp)
    finally:
        reporter.close()
    return BuildResult(
        package=package, status=status, cached=cached, duration_s=time.monotonic() - t0, log_path=log_path
    )


def build(
    home: Home, req: BuildRequest, *, interactive: bool | None = None, argv: list[str] | None = None
) -> list[BuildResult]:
    """Build one package per requested target from an exact, clean revision; write a receipt."""
    home.ensure()
    journal = _begin_receipt(home, req, argv)
    try:
        results = _build(home, req, interactive=interactive, journal=journal)
    except BaseException as exc:
        journal.finish("aborted" if isinstance(exc, KeyboardInterrupt) else "failed", str(exc)[:2000])
        raise
    receipt = journal.finish("passed", ", ".join(f"{r.package.id} {r.status}" for r in results))
    return [replace(r, receipt=receipt) for r in results]


def _begin_receipt(home: Home, req: BuildRequest, argv: list[str] | None) -> Journal:
    """The build's receipt, opened before anything is built."""
    argv = argv or ["build", "--source", str(req.source), "--rev", req.rev, *(f"--target={t}" for t in req.targets)]
    return EvidenceStore(home.evidence).begin(command="build", argv=argv, pair=None, inputs={})


def _build(home: Home, req: BuildRequest, *, interactive: bool | None, journal: Journal) -> list[BuildResult]:
    repo = git.require_repo(req.source)
    git.require_clean(repo)
    rev = git.resolve(repo, req.rev)
    if req.expect_tree:
        git.require_tree(repo, rev, req.expect_tree)
    patch = None
    if req.patch is not None:
        rev, patch = _apply_patch(repo, rev, req.patch)
        git.require_clean(repo)
    journal.set(
        "source",
        {
            "repo": str(repo),
            "rev": req.rev,
            "commit": rev.commit,
            "tree": rev.tree,
            "expect_tree": req.expect_tree,
            "patch": patch.model_dump() if patch else None,
        },
    )
    targets = [load_target(t) for t in req.targets]
    if not targets:
        raise BuildError("no --target given")
    toolchains = {t.name: check_toolchain(t) for t in targets}  # all checked before the first compile
    store = PackageStore(home.store)
    results = []
    for t in targets:
        with journal.step(f"build {t.name}") as step:
            r = build_target(
                req, t, rev, toolchains[t.name], home=home, store=store, patch=patch, interactive=interactive
            )
            step.data.update(r.as_dict())
            step.data["files"] = {k: v.sha256 for k, v in r.package.manifest.files.items()}
        results.append(r)
    return results
