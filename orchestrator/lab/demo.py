"""`python -m orchestrator.lab.demo` (`make demo`): the lab demo, as an ordered list of pairctl
commands run through the real CLI, stopping at the first failure.

Extend it by appending to `STEPS` (build, deploy, accept, roll back ...): each step is exactly
what an operator would type after `pairctl`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Any, Callable

from orchestrator import cli
from orchestrator.build.store import PackageStore
from orchestrator.lab.source import BASELINE_TAG
from orchestrator.paths import Home

STEPS: list[Any] = [
    ("lab", "up"),
    ("lab", "status"),
]


def run_step(argv: tuple[str, ...]) -> int:
    """Run one `pairctl` command in-process; return its exit code."""
    try:
        cli.main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _resolve(step: Any) -> tuple[tuple[str, ...], int]:
    """A step is an argv tuple (must exit 0), or a callable returning (argv, expected exit code)
    for steps that need something only known at run time (a package id) or must fail."""
    if callable(step):
        return step()
    return tuple(step), 0


def main(steps: list[Any] | None = None) -> int:
    for step in steps if steps is not None else STEPS:
        argv, expect = _resolve(step)
        print(f"\n$ pairctl {shlex.join(argv)}" + (f"    # expected to exit {expect}" if expect else ""), flush=True)
        code = run_step(argv)
        if code != expect:
            print(f"demo: `pairctl {shlex.join(argv)}` exited {code}, expected {expect}; stopping", file=sys.stderr)
            return code or 1
    print("\ndemo: all steps passed", flush=True)
    return 0


# -- deploy, status, a forced failed deploy that rolls back, status again (issue 4) -------------

def _baseline_package() -> str:
    """The cpu-lab package `pairctl build` made from the lab source's baseline tag."""
    home = Home.resolve()
    rev = subprocess.run(["git", "-C", str(home.lab / "source"), "rev-parse", f"{BASELINE_TAG}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    pkgs = [p for p in PackageStore(home.store).list() if p.manifest.revision == rev and p.manifest.target.name == "cpu-lab"]
    if not pkgs:
        raise SystemExit("demo: no cpu-lab package of the baseline revision (did the build step run?)")
    return max(pkgs, key=lambda p: p.manifest.finished_at).id


def _deploy(profile: str, expect: int, *, accept: bool = False) -> Callable[[], tuple[tuple[str, ...], int]]:
    def step() -> tuple[tuple[str, ...], int]:
        pid = _baseline_package()
        argv = ("deploy", "--pair", "lab", "--packages", pid, pid, "--profile", profile)
        return argv + (() if accept else ("--skip-accept",)), expect

    return step


STEPS += [
    ("build", "--target", "cpu-lab", "--rev", "baseline", "--profile", "lab"),
    _deploy("lab", 0, accept=True),  # identities, then the acceptance suite
    ("status", "--pair", "lab"),
    ("accept", "--pair", "lab", "--only", "identity,speculative,cancellation"),
    _deploy("lab-unloadable", 7),  # llama-server cannot load: the deploy rolls back to the pair before it
    ("status", "--pair", "lab"),
    ("receipts", "list", "--pair", "lab", "--since", "1h"),
    ("receipts", "verify"),
]


if __name__ == "__main__":
    sys.exit(main())
