"""Start-up cost of `pairctl`: `--version`, `--help` and `COMMAND --help` for every command.

Each is run REPEATS times as a fresh process (the console script beside this interpreter); the
figure is the median CPU time (user + system) of the child, which a loaded machine inflates far
less than wall time (also reported). `python -c pass` is measured alongside as the floor.
Budget (issue 20): `--version` and `--help` under 0.15 s, `COMMAND --help` under 0.25 s.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.cli.commands import COMMANDS

BUDGET_ROOT_S = 0.15
BUDGET_COMMAND_S = 0.25
REPEATS = 7


def _pairctl() -> list[str]:
    exe = Path(sys.executable).parent / "pairctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "orchestrator"]


def _measure(argv: list[str]) -> dict[str, float]:
    cpu, wall = [], []
    env = {**os.environ, "COLUMNS": "100"}
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False, timeout=60)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return {
        "cpu_s": round(statistics.median(cpu), 4),
        "cpu_min_s": round(min(cpu), 4),
        "wall_s": round(statistics.median(wall), 4),
    }


def run() -> dict[str, object]:
    exe = _pairctl()
    floor = _measure([sys.executable, "-c", "pass"])
    root = {"--version": _measure([*exe, "--version"]), "--help": _measure([*exe, "--help"])}
    commands = {name: _measure([*exe, name, "--help"]) for name in COMMANDS}
    worst_root = max(v["cpu_s"] for v in root.values())
    worst_name, worst = max(((n, v["cpu_s"]) for n, v in commands.items()), key=lambda x: x[1])
    passed = worst_root < BUDGET_ROOT_S and worst < BUDGET_COMMAND_S
    line = (
        f"startup: --version {root['--version']['cpu_s']:.3f} s, --help {root['--help']['cpu_s']:.3f} s CPU "
        f"(budget {BUDGET_ROOT_S}); slowest COMMAND --help: {worst_name} {worst:.3f} s "
        f"(budget {BUDGET_COMMAND_S}); "
        f"python floor {floor['cpu_s']:.3f} s; median of {REPEATS}, {os.cpu_count()} cpus"
    )
    return {
        "line": line,
        "passed": passed,
        "repeats": REPEATS,
        "cpus": os.cpu_count(),
        "python_floor": floor,
        "root": root,
        "commands": commands,
        "budget_root_s": BUDGET_ROOT_S,
        "budget_command_s": BUDGET_COMMAND_S,
    }
