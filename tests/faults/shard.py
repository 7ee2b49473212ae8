"""One shard of the fault matrix, run in a process of its own (`python -m tests.faults.shard SPEC`).

The matrix's cells are independent: each starts from a verified pair and ends on one. So they
are dealt out to shards, each with a `faults` pair of its own on sshd hosts of its own (the lab's
pair, or one of lab3's three): a fault that stops one shard's sshd, fills its roots or breaks its
leases cannot touch another's. A shard is a process, not a thread, because pairctl's lease-holding
commands install signal handlers, which only a main thread may do.

SPEC is a JSON file: home, base inventory path and pair, the shard pair's name and ports, the two
package ids, the tmpfs size, the cells ([fault, step, operator] triples, longest expected first),
the claims directory and the results file, to which each finished cell is appended as one JSON
line (so a parent sees progress, and a shard that dies keeps what it did).

Every shard gets the whole list and runs the cells it claims: a cell is claimed by creating
`claims/INDEX` exclusively, so each runs once, and a shard that is free takes the next one. Dealt
out in advance, the cells left one shard running for minutes after the others had finished (a
cut-ssh cell takes 70-200 s, a corrupt-release one 10 s).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from orchestrator.config.inventory import load_inventory
from orchestrator.paths import Home
from tests.faults.harness import BY_NAME, Cell, establish, make_pair, run_cell, teardown_pair


def claim(claims: Path, index: int) -> bool:
    """Whether this shard is the first to take cell `index` (O_EXCL: one winner per cell)."""
    try:
        os.close(os.open(claims / str(index), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def run_shard(spec: dict) -> None:
    home = Home.resolve(Path(spec["home"]))
    base = Path(spec["base_inventory"])
    inv = load_inventory(str(base), {"PAIRCTL_HOME": str(home.root)})
    out = Path(spec["results"])
    fp = make_pair(
        home,
        base,
        inv,
        tuple(spec["packages"]),
        root_mb=spec["root_mb"],
        name=spec["name"],
        ports=tuple(spec["ports"]),
        base_pair=spec["base_pair"],
    )
    work = Path(spec["work"])

    def emit(cell: Cell) -> None:
        with out.open("a") as f:
            f.write(json.dumps(asdict(cell), default=str) + "\n")

    try:
        establish(fp, fp.packages[0])
        planned = fp.planned_steps(fp.packages[1])
        claims = Path(spec["claims"])
        for index, (fault_name, step, operator) in enumerate(spec["cells"]):
            if not claim(claims, index):
                continue
            fault = BY_NAME[fault_name]
            if step not in planned:  # e.g. kernel-check, only with --kernel-check: no such boundary here
                emit(Cell(fault_name, step, first="n/a", recovery="not in the plan"))
            elif fault.steps is not None and step not in fault.steps:
                emit(Cell(fault_name, step, first="n/a", recovery="not this fault's step"))
            else:
                t0 = time.monotonic()
                try:
                    cell = run_cell(fp, fault, step, work / f"{fault_name}-{step}", operator=operator)
                except Exception as exc:  # a harness failure is this cell's problem, not the shard's end
                    if fp.in_flight is not None and fp.in_flight.proc.poll() is None:
                        fp.in_flight.kill()
                    fp.in_flight = None
                    cell = Cell(fault_name, step, first="harness error", final="NEITHER")
                    cell.problems.append(f"the harness failed: {type(exc).__name__}: {exc}"[:2000])
                    cell.seconds = time.monotonic() - t0
                emit(cell)
    finally:
        teardown_pair(fp)


if __name__ == "__main__":
    run_shard(json.loads(Path(sys.argv[1]).read_text()))
