"""Where a command's CPU goes, by process kind (issue 45): pytest, pairctl CLI children, ssh, sshd, the
host helper, llama-server, ggml-rpc-server, compilers, git, ...

    python -m benchmarks.cpu_tree [--interval 0.05] [--json OUT] -- COMMAND [ARG ...]
    python -m benchmarks cpu_tree            # run(): the tree of `python -m orchestrator --help`

The command runs in a cpuacct cgroup of its own (cgroup v1, `/sys/fs/cgroup/cpuacct/cpu-tree-PID`,
root only), so everything it starts stays countable, the double-forked daemons too (the lab's sshd,
the supervisors, llama-server): `cpuacct.usage` at the end is the whole tree's CPU, exact. Every
INTERVAL seconds the sampler reads `cgroup.procs` and each pid's `/proc/PID/stat` (comm, ppid, utime,
stime, and the cutime/cstime of the children it reaped) and keeps the last values it saw; the command
line is read once, on first sight. Per pid, `self` is its own utime+stime and `reaped` the part of its
reaped children's CPU that no sampled child accounts for (processes that lived less than one interval:
a bash helper's forks, sshd's per-session children). Both are summed per kind (`kind()`); what is left
of the cgroup's total is `unseen` (children reaped by a process that itself ended between two samples,
and the CPU a process used after its last sample). A lab test has to be run by this sampler from the
start, or the sshd it reuses sits outside the cgroup and its sessions' CPU is not counted.

The sampler's own CPU is not in the tree (it is outside the cgroup) and is printed beside it.
Needs root and cgroup v1's cpuacct mounted at /sys/fs/cgroup/cpuacct; anything else: an error.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")
TOP = 30  # processes listed one by one in the JSON


@dataclass
class Proc:
    pid: int
    ppid: int
    comm: str
    cmd: str
    self_s: float = 0.0
    kids_s: float = 0.0  # cutime + cstime: the children it waited for
    children: list[int] = field(default_factory=list)


def kind(comm: str, cmd: str) -> str:
    """A process's kind, from its comm and command line (first match wins)."""
    low = cmd.lower()
    if "tests.faults.shard" in low:
        return "fault-matrix shard (harness)"
    if "pytest" in low or "exec(eval(sys.stdin.readline()))" in cmd:  # an xdist worker
        return "pytest"
    if "-m orchestrator" in low or "/pairctl " in low or low.endswith("/pairctl") or "orchestrator.cli" in low:
        return "pairctl CLI"
    if "pairctl-svc" in low:
        return "host helper (sh) + forks"
    if comm.startswith("sshd"):
        return "sshd (+ session children)"
    if comm in ("ssh", "scp", "ssh-keygen", "ssh-keyscan"):
        return "ssh client tools"
    if comm.startswith("llama-server"):
        return "llama-server"
    if comm.startswith("ggml-rpc"):
        return "ggml-rpc-server"
    if comm in ("cc1", "cc1plus", "cc", "gcc", "g++", "c++", "ld", "as", "cmake", "make", "ninja", "collect2"):
        return "compilers/cmake"
    if comm.startswith("git"):
        return "git"
    if comm in ("sha256sum", "sha1sum", "md5sum"):
        return "hashing (sha256sum)"
    if comm.startswith("python"):
        return "other python"
    if comm in ("sh", "bash", "dash"):
        return "other shells"
    return f"other ({comm})"


def _stat(pid: int) -> tuple[str, int, float, float] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    f = raw[raw.rindex(")") + 2 :].split()
    # fields after comm: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
    return comm, int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def measure(argv: list[str], interval: float = 0.05) -> dict[str, object]:
    """Run ARGV in a cgroup of its own, sample its processes, and return the breakdown."""
    group = CPUACCT / f"cpu-tree-{os.getpid()}"
    group.mkdir()
    procs: dict[int, Proc] = {}
    t0 = time.monotonic()
    try:
        child = subprocess.Popen(
            argv,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),  # noqa: PLW1509
        )
        while True:
            done = child.poll() is not None
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            for pid in pids:
                st = _stat(pid)
                if st is None:
                    continue
                comm, ppid, self_s, kids_s = st
                p = procs.get(pid)
                if p is None or p.comm != comm and not p.cmd:
                    p = procs[pid] = Proc(pid, ppid, comm, _cmdline(pid))
                elif p.comm != comm:  # exec'd into another program: keep the new name
                    p.comm, p.cmd = comm, _cmdline(pid) or p.cmd
                p.self_s, p.kids_s = self_s, kids_s
            if done and not pids:
                break
            if done:  # daemons the command left in the group: this run's tree ends with the command
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(interval)
        total = int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    wall = time.monotonic() - t0
    for p in procs.values():
        if p.ppid in procs:
            procs[p.ppid].children.append(p.pid)
    by_kind: dict[str, dict[str, float]] = {}
    for p in procs.values():
        k = kind(p.comm, p.cmd)
        row = by_kind.setdefault(k, {"self_s": 0.0, "reaped_s": 0.0, "procs": 0})
        seen_kids = sum(procs[c].self_s + procs[c].kids_s for c in p.children)
        row["self_s"] += p.self_s
        row["reaped_s"] += max(0.0, p.kids_s - seen_kids)
        row["procs"] += 1
    # the top pid's reaped children are already in the cgroup total; the pytest process's own
    # reaped children are counted through the processes sampled under it
    accounted = sum(r["self_s"] + r["reaped_s"] for r in by_kind.values())
    me = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "argv": argv,
        "wall_s": round(wall, 2),
        "tree_cpu_s": round(total, 2),
        "unseen_s": round(total - accounted, 2),
        "sampler_cpu_s": round(me.ru_utime + me.ru_stime, 2),
        "processes": len(procs),
        "top": [
            {"pid": p.pid, "cpu_s": round(p.self_s, 2), "reaped_s": round(p.kids_s, 2), "cmd": p.cmd[:200] or p.comm}
            for p in sorted(procs.values(), key=lambda p: -p.self_s)[:TOP]
        ],
        "kinds": {
            k: {"cpu_s": round(v["self_s"] + v["reaped_s"], 2), **{f: round(v[f], 2) for f in v}}
            for k, v in sorted(by_kind.items(), key=lambda kv: -(kv[1]["self_s"] + kv[1]["reaped_s"]))
        },
    }


def render(r: dict[str, object]) -> str:
    kinds = r["kinds"]
    assert isinstance(kinds, dict)
    argv = " ".join(str(a) for a in r["argv"]) if isinstance(r["argv"], list) else ""
    lines = [
        argv[:110],
        f"  wall {r['wall_s']} s, tree CPU {r['tree_cpu_s']} s, {r['processes']} processes sampled, "
        f"sampler {r['sampler_cpu_s']} s (outside the tree)",
        f"  {'kind':32} {'CPU s':>8} {'self':>8} {'reaped':>8} {'procs':>6}",
    ]
    for k, v in kinds.items():
        lines.append(f"  {k:32} {v['cpu_s']:8.2f} {v['self_s']:8.2f} {v['reaped_s']:8.2f} {int(v['procs']):6}")
    lines.append(f"  {'unseen (short-lived, unattributed)':32} {r['unseen_s']:8.2f}")
    return "\n".join(lines)


def run() -> dict[str, object]:
    """The benchmark runner's entry: the tree of `python -m orchestrator --help` (skipped where no
    cpuacct group can be made: not root, or no cgroup v1)."""
    if os.geteuid() != 0 or not (CPUACCT / "cgroup.procs").is_file():
        return {"skipped": True, "line": "cpu_tree: skipped (needs root and cgroup v1 cpuacct)"}
    r = measure([sys.executable, "-m", "orchestrator", "--help"])
    return {**r, "line": render(r)}


def main(args: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_tree")
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--json", type=Path)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    ns = ap.parse_args(args)
    cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not cmd:
        ap.error("no COMMAND")
    r = measure(cmd, ns.interval)
    print(render(r))
    if ns.json:
        ns.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
