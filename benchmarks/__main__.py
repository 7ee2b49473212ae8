"""Run every benchmark module in this folder; write `benchmarks/results/<name>.json`.

`python -m benchmarks [name ...]` — each module exposes `run() -> dict` and prints one line.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def discover() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = argv or discover()
    RESULTS.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        mod = importlib.import_module(f"benchmarks.{name}")
        t0 = time.time()
        try:
            result = mod.run()
        except Exception as exc:  # one broken benchmark must not hide the others
            print(f"{name}: ERROR {type(exc).__name__}: {exc}")
            failed += 1
            continue
        result = {"benchmark": name, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), **result}
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(result.get("line") or f"{name}: {json.dumps(result, sort_keys=True)}")
        if result.get("passed") is False:
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
