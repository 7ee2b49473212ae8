"""Package hashing throughput of pairctl vs `sha256sum` on the same files, as a ratio from one run.

Files: the newest package in the store when one exists (its real binaries), else synthetic
files of package-like sizes. Both tools read from the page cache (one untimed read first), and
both produce the same digests, which the benchmark checks. Target: ratio >= 0.9.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.build.store import PackageStore, hash_files, list_files
from orchestrator.paths import Home

TARGET_RATIO = 0.9
SYNTHETIC_SIZES_MB = (24, 12, 20, 1)  # llama-server, ggml-rpc-server, test-backend-ops, meta
REPEATS = 3


def _package_files() -> tuple[list[Path], str]:
    store = PackageStore(Home.resolve().store)
    pkgs = sorted(store.list(), key=lambda p: p.manifest.finished_at)
    if pkgs:
        pkg = pkgs[-1]
        return [pkg.path / rel for rel in list_files(pkg.path)], f"package {pkg.id}"
    return [], ""


def _synthetic(tmp: Path) -> list[Path]:
    out = []
    for i, mb in enumerate(SYNTHETIC_SIZES_MB):
        p = tmp / f"file{i}.bin"
        with open(p, "wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
        out.append(p)
    return out


def _sha256sum(files: list[Path]) -> dict[Path, str]:
    out = subprocess.run(["sha256sum", "--", *map(str, files)], check=True, capture_output=True, text=True).stdout
    return {Path(line[66:]): line[:64] for line in out.splitlines()}


def _best(fn, files: list[Path]) -> tuple[float, dict[Path, str]]:  # type: ignore[no-untyped-def]
    best, result = float("inf"), {}
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        result = fn(files)
        best = min(best, time.perf_counter() - t0)
    return best, result


def run() -> dict:
    if not shutil.which("sha256sum"):
        raise RuntimeError("sha256sum not found")
    with tempfile.TemporaryDirectory(prefix="pairctl-bench-") as tmp:
        files, source = _package_files()
        if not files:
            files, source = _synthetic(Path(tmp)), "synthetic"
        total = sum(p.stat().st_size for p in files)
        for p in files:  # warm the page cache for both tools
            with open(p, "rb") as f:
                while f.read(1 << 22):
                    pass
        t_ref, ref = _best(_sha256sum, files)
        t_ours, ours = _best(hash_files, files)
        t_one, _ = _best(lambda fs: hash_files(fs, workers=1), files)
    if {str(k): v for k, v in ours.items()} != {str(k): v for k, v in ref.items()}:
        raise RuntimeError("pairctl and sha256sum disagree on a digest")
    mb = total / 1e6
    ratio = t_ref / t_ours
    return {
        "source": source, "files": len(files), "bytes": total,
        "sha256sum_s": round(t_ref, 4), "pairctl_s": round(t_ours, 4),
        "sha256sum_mb_s": round(mb / t_ref, 1), "pairctl_mb_s": round(mb / t_ours, 1),
        "pairctl_1thread_mb_s": round(mb / t_one, 1), "ratio_1thread": round(t_ref / t_one, 3),
        "ratio": round(ratio, 3), "target_ratio": TARGET_RATIO, "passed": ratio >= TARGET_RATIO,
        "cpus": os.cpu_count(), "repeats": REPEATS,
        "line": f"hashing: pairctl {mb / t_ours:.0f} MB/s vs sha256sum {mb / t_ref:.0f} MB/s on {len(files)} files "
                f"({source}, {mb:.0f} MB): ratio {ratio:.2f} (target >= {TARGET_RATIO}; "
                f"one thread {t_ref / t_one:.2f})",
    }  # fmt: skip
