"""`python -m orchestrator.lab.demo` (`make demo`): the lab demo, as an ordered list of pairctl
commands run through the real CLI, stopping at the first failure.

Extend it by appending to `STEPS` (build, deploy, accept, roll back ...): each step is exactly
what an operator would type after `pairctl`.
"""

from __future__ import annotations

import shlex
import sys

STEPS: list[tuple[str, ...]] = [
    ("lab", "up"),
    ("lab", "status"),
]


def run_step(argv: tuple[str, ...]) -> int:
    """Run one `pairctl` command in-process; return its exit code."""
    from orchestrator.cli import main

    try:
        main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def main(steps: list[tuple[str, ...]] | None = None) -> int:
    for argv in steps if steps is not None else STEPS:
        print(f"\n$ pairctl {shlex.join(argv)}", flush=True)
        code = run_step(argv)
        if code != 0:
            print(f"demo: `pairctl {shlex.join(argv)}` failed with exit code {code}; stopping", file=sys.stderr)
            return code
    print("\ndemo: all steps passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
