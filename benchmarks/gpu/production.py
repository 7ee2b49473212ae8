"""The production packages (v100, rtx5060ti) that `pairctl build` made on a machine without a GPU,
gathered as raw files for docs/gpu-validation.md (docs/guides/cuda-toolchain.md says how they are built).

Usage: python3 benchmarks/gpu/production.py HOME RAW_DIR CUOBJDUMP

For each package in HOME's store whose target is v100 or rtx5060ti, writes RAW_DIR/prod-<target>.manifest.json
(the manifest as stored) and RAW_DIR/prod-<target>.cuobjdump.txt (`cuobjdump --list-elf` and `--list-ptx` of
each of its bin/ binaries). report.py renders the section from these files alone: a package that does not
exist has no file, so no row; no run is claimed, since no V100 or RTX 5060 Ti was lent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

TARGETS = ("v100", "rtx5060ti")


def collect(home: Path, out: Path, cuobjdump: str) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    found = []
    for pkg in sorted((home / "packages").iterdir()):
        manifest = pkg / "manifest.json"
        if not manifest.is_file():
            continue
        target = json.loads(manifest.read_text())["target"]["name"]
        if target not in TARGETS:
            continue
        shutil.copy(manifest, out / f"prod-{target}.manifest.json")
        lines = []
        for binary in sorted((pkg / "bin").iterdir()):
            for opt in ("--list-elf", "--list-ptx"):
                proc = subprocess.run([cuobjdump, opt, str(binary)], capture_output=True, text=True, timeout=300)
                lines += [f"$ cuobjdump {opt} bin/{binary.name}", proc.stdout.strip(), proc.stderr.strip()]
        (out / f"prod-{target}.cuobjdump.txt").write_text("\n".join(x for x in lines if x) + "\n")
        found.append(pkg.name)
    return found


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    print("collected:", ", ".join(collect(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])) or "no package")
