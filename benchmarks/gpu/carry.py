"""Get the lab's inputs onto the device machine, whose calls carry at most 64 MiB each.

The pinned sdist (37 MB) and the real model (98 MB) do not fit one call with the repo, so they
travel smaller and in parts, and are checked where they land:

    python3 benchmarks/gpu/carry.py pack SRC_REPO MODEL DEST_DIR N   # here: source tree + model in N parts
    python3 benchmarks/gpu/carry.py source HOME TREE_TAR_XZ           # there: lab source, same baseline commit
    python3 benchmarks/gpu/carry.py model HOME PART...                # there: join, sha256 against the pin

`source` rebuilds `HOME/lab/source` the way `pairctl lab up` does (orchestrator.lab.source), from
the baseline tree as `git archive | xz` (23 MB instead of the 37 MB sdist) instead of the sdist;
the commit's identity and dates are fixed there, so the same tree gives the same baseline commit,
and that commit id is checked against the one recorded at pack time (a package built from any
other tree would carry another build_info). `model` refuses parts that do not join into the
pinned SmolLM2 GGUF, so nothing else is ever served under its name.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

from orchestrator.lab import source as src
from orchestrator.lab.real_model import MODEL_SHA256, MODEL_SIZE, REAL_FILE, ensure_real_model


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(repo: Path, model: Path, dest: Path, parts: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{src.BASELINE_TAG}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    (dest / "baseline.commit").write_text(commit + "\n")
    tree = dest / "tree.tar.xz"
    if not tree.exists():
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
        with tree.open("wb") as out:
            subprocess.run(["xz", "-9", "-T2"], stdin=archive.stdout, stdout=out, check=True)
        archive.wait()
    data = model.read_bytes()
    if len(data) != MODEL_SIZE or hashlib.sha256(data).hexdigest() != MODEL_SHA256:
        sys.exit(f"carry: {model} is not the pinned model (size {len(data)}, want {MODEL_SIZE})")
    step = -(-len(data) // parts)
    for i in range(parts):
        (dest / f"model.part{i}").write_bytes(data[i * step : (i + 1) * step])
    print(f"packed {commit[:10]} tree {tree.stat().st_size} bytes, model in {parts} parts of <= {step} bytes")


def source(home: Path, tree: Path) -> None:
    """HOME/lab/source from the tree archive, through ensure_source's own git steps."""
    want = (tree.parent / "baseline.commit").read_text().strip()

    def extract(_tarball: Path, dest: Path) -> None:
        with tarfile.open(tree, "r:xz") as tf:
            tf.extractall(dest, filter="tar")

    src.download_sdist = lambda _home, **_kw: tree  # type: ignore[assignment]
    src._extract_tree = extract  # type: ignore[assignment]
    repo = src.ensure_source(home)
    got = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{src.BASELINE_TAG}^{{commit}}"],
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    if got != want:
        sys.exit(f"carry: rebuilt baseline is {got}, the packed tree's was {want}: refusing to build from it")
    print(f"lab source {repo} baseline {got}")


def model(home: Path, parts: list[Path]) -> None:
    folder = home / "lab" / "models"
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / REAL_FILE
    tmp = dest.with_suffix(".joining")
    with tmp.open("wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    got = sha256(tmp)
    if tmp.stat().st_size != MODEL_SIZE or got != MODEL_SHA256:
        tmp.unlink()
        sys.exit(f"carry: the joined model has sha256 {got}, not the pinned {MODEL_SHA256}: refused")
    tmp.replace(dest)
    rm = ensure_real_model(folder)  # finds the pinned model; writes the draft and the F16 form
    print(f"real model {dest} sha256 {got} ({MODEL_SIZE} bytes); draft {rm.records['smollm2_draft']['sha256'][:16]}")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["help"]
    if cmd == "pack" and len(args) == 4:
        pack(Path(args[0]), Path(args[1]), Path(args[2]), int(args[3]))
    elif cmd == "source" and len(args) == 2:
        source(Path(args[0]), Path(args[1]))
    elif cmd == "model" and len(args) >= 2:
        model(Path(args[0]), [Path(a) for a in args[1:]])
    else:
        sys.exit(__doc__)
