"""Soak (issue 33): deploy/rollback cycles with the full acceptance suite, watched for failures and leaks.

On the lab pair, through the installed CLI as an operator runs it (`pairctl deploy --json`, then
`pairctl rollback --json`, each a fresh process): the pair starts on A (the baseline package, an
untimed warm-up deploy), then every cycle deploys B (revision lab-b) with the whole acceptance
suite and rolls back to A. Recorded per cycle: each command's exit, wall time and step times, the
load average, and leak indicators read after the rollback on both hosts (the lab's hosts are
directories on this machine, so /proc and the install roots are read directly):

  procs        processes under the install root (services + supervisors) and sshd sessions left
               under the host's sshd listener (pairctl must close every connection)
  fds / rss    open fds and RSS of each service and its supervisor
  files        entries under the install root: releases, upload leftovers, temp names (`*tmp*`),
               leases, everything under run/ (rotated logs) and the total
and in the operator home: receipts (2 new per cycle by design), journal/locks/logs/metrics
entries, temp names, the JSON log's bytes and the known_hosts lines.

At the end a trend test: per indicator the least-squares slope over the cycles (after the first,
which settles the second release's files), its projection over the whole run, and the noise
(residual standard deviation). Counts that must stay flat leak when the projection reaches one
whole item (and the last third holds more than the first); RSS, fds and wall times when the
projection is beyond 3 noise and beyond 10% (RSS, wall) or 2 fds. Receipts must grow by exactly
2 per cycle. A failed command stops the soak (the hosts are left as they are, for a look).

Env: SOAK_CYCLES (50), SOAK_PROFILE (the pair's: `lab`, the tiny model; `lab-real` for the real
model), PAIRCTL_HOME (else .state/test), PAIRCTL_BENCH_INVENTORY / PAIRCTL_BENCH_PAIR (lab / lab),
SOAK_OUT (also write the result there, each cycle, so a long run can be watched).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.deploy import INVENTORY, PAIR, _home, _packages
from orchestrator.log import LOG_KEEP, LOG_MAX_BYTES

REPO = Path(__file__).resolve().parent.parent
CYCLES = int(os.environ.get("SOAK_CYCLES", "50"))
PROFILE = os.environ.get("SOAK_PROFILE", "")
LOG_CAP_BYTES = (LOG_KEEP + 1) * LOG_MAX_BYTES + (1 << 20)  # the JSON log and its rotated files (+ hooks.jsonl)
COMMAND_TIMEOUT_S = 1800.0  # one deploy with the whole suite on the real model at load 8: ~450 s


def _pairctl(home: Path, inventory: str, *args: str) -> dict[str, Any]:
    """Run one pairctl command as a fresh process; its exit, wall time and --json document."""
    argv = [sys.executable, "-m", "orchestrator", *args, "--json", "-i", inventory, "--home", str(home)]
    env = {k: v for k, v in os.environ.items() if k not in ("PAIRCTL_CONFIG",)}
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    wall = time.monotonic() - t0
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {"unparsed_stdout": p.stdout[-2000:]}
    steps = {s["name"]: s.get("seconds") for s in doc.get("steps", []) if isinstance(s, dict) and "name" in s}
    out: dict[str, Any] = {"exit": p.returncode, "wall_s": round(wall, 3), "steps_s": steps}
    if args[0] == "status":
        out["doc"] = doc
    if p.returncode != 0:
        out["error"] = doc.get("error") or doc
        out["stderr_tail"] = p.stderr[-3000:]
    return out


# -- leak indicators, read from /proc and the lab hosts' directories ------------------------------


def _procs() -> list[tuple[int, int, str]]:
    """(pid, ppid, cmdline) of every process we can read."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(d), ppid, cmd))
    return out


def _descendants(procs: list[tuple[int, int, str]], root: int) -> int:
    kids: dict[int, list[int]] = {}
    for pid, ppid, _ in procs:
        kids.setdefault(ppid, []).append(pid)
    n, todo = 0, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        n += 1
        todo.extend(kids.get(pid, []))
    return n


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _count(root: Path) -> tuple[int, int]:
    """(entries, temp-named entries) under root, recursively, without following links."""
    n = tmp = 0
    for _dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            n += 1
            if "tmp" in name.lower() or name.startswith(".#"):
                tmp += 1
    return n, tmp


def _entries(path: Path) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def _host(root: Path, host_dir: Path, procs: list[tuple[int, int, str]]) -> dict[str, Any]:
    """Leak indicators of one lab host: its install root and its processes."""
    rootstr = str(root) + "/"
    under = [p for p in procs if rootstr in p[2]]
    listener = next(
        (pid for pid, _, cmd in procs if cmd.startswith("sshd") and str(host_dir) + "/sshd_config" in cmd), None
    )
    services: dict[str, Any] = {}
    for pidfile in sorted((root / "run").glob("*.pid")):
        pid = _pid(pidfile)
        name = pidfile.name[: -len(".pid")]
        services[name] = {"fds": _fds(pid) if pid else None, "rss_kib": _rss_kib(pid) if pid else None}
    total, tmp = _count(root)
    releases = root / "releases"
    return {
        "procs_under_root": len(under),
        "sshd_sessions": _descendants(procs, listener) if listener else None,
        "services": services,
        "releases": sum(1 for n in os.listdir(releases) if not n.startswith(".")) if releases.exists() else 0,
        "uploads": sum(1 for n in os.listdir(releases) if n.startswith(".")) if releases.exists() else 0,
        "temp_names": tmp,
        "leases": _entries(root / "leases"),
        "run_entries": _entries(root / "run"),
        "root_entries_outside_releases": total - (_count(releases)[0] + 1 if releases.exists() else 0),
    }


def _home_indicators(home: Path) -> dict[str, Any]:
    ev = home / "evidence"
    receipts = sum(1 for _ in (ev / "receipts").rglob("*") if _.is_file()) if (ev / "receipts").exists() else 0
    total, tmp = _count(home / "evidence")
    by_design = sum(_entries(ev / d) for d in ("receipts", "index"))  # one file each per receipt
    logs_bytes = (
        sum(f.stat().st_size for f in (home / "logs").rglob("*") if f.is_file()) if (home / "logs").exists() else 0
    )
    try:
        kh = sum(1 for line in (home / "lab" / "known_hosts").read_text().splitlines() if line.strip())
    except OSError:
        kh = 0
    return {
        "receipts": receipts,
        "receipts_index": _entries(ev / "index"),
        "evidence_entries_besides_receipts": total - by_design,
        "temp_names": tmp + _count(home / "logs")[1] + _count(home / "metrics")[1],
        "journal_entries": sum(1 for _ in (ev / "journal").rglob("*")) if (ev / "journal").exists() else 0,
        "locks_entries": sum(1 for _ in (ev / "locks").rglob("*")) if (ev / "locks").exists() else 0,
        "logs_files": sum(1 for _ in (home / "logs").rglob("*")) if (home / "logs").exists() else 0,
        "logs_bytes": logs_bytes,
        "metrics_entries": sum(1 for _ in (home / "metrics").rglob("*")) if (home / "metrics").exists() else 0,
        "known_hosts_lines": kh,
    }


def _indicators(home: Path, inv: Any) -> dict[str, Any]:
    procs = _procs()
    p = inv.pair(PAIR)
    hosts = {}
    for h in (p.native, p.rpc):
        root = Path(inv.host(h).install_root)
        hosts[h] = _host(root, root.parent, procs)
    return {"hosts": hosts, "home": _home_indicators(home)}


# -- the trend test ----------------------------------------------------------------------------


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def _fit(ys: list[float]) -> tuple[float, float]:
    """(slope per cycle, residual standard deviation) of a least-squares line through ys."""
    n = len(ys)
    xs = list(range(n))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    res = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    sd = math.sqrt(sum(r * r for r in res) / (n - 2)) if n > 2 else 0.0
    return slope, sd


def _kind(key: str) -> str:
    if key in ("home.receipts", "home.receipts_index"):
        return "receipts"
    if key.endswith("rss_kib") or key.endswith("wall_s") or key.endswith("logs_bytes"):
        return "relative"
    if key.endswith("fds"):
        return "fds"
    return "count"


def _fit_with_load(ys: list[float], loads: list[float]) -> tuple[float, float]:
    """(slope per cycle, residual sd) of ys ~ a + b*cycle + c*load: a wall time's trend with the
    machine's load (shared, and it came and went) taken out."""
    import numpy as np

    n = len(ys)
    x = np.column_stack([np.ones(n), np.arange(n, dtype=float), np.asarray(loads, dtype=float)])
    coef, *_ = np.linalg.lstsq(x, np.asarray(ys, dtype=float), rcond=None)
    res = np.asarray(ys) - x @ coef
    sd = float(math.sqrt(float(res @ res) / (n - 3))) if n > 3 else 0.0
    return float(coef[1]), sd


def trend(series: dict[str, list[float]], loads: list[float] | None = None) -> dict[str, Any]:
    """Judge each indicator's series (one value per cycle, warm-up excluded): leak or flat."""
    out: dict[str, Any] = {}
    for key, ys in sorted(series.items()):
        if len(ys) < 3:
            continue
        by_load = key.endswith("wall_s") and loads is not None and len(loads) == len(ys) and len(ys) > 4
        slope, sd = _fit_with_load(ys, loads) if by_load and loads is not None else _fit(ys)
        n = len(ys)
        growth = slope * (n - 1)
        third = max(1, n // 3)
        kind = _kind(key)
        mean = statistics.fmean(ys)
        if kind == "receipts":
            steps = {ys[i + 1] - ys[i] for i in range(n - 1)}
            leak = steps != {2.0}
            rule = "exactly +2 per cycle (one deploy and one rollback receipt)"
        elif kind == "count":
            leak = growth >= 1.0 and max(ys[-third:]) > max(ys[:third])
            rule = "projected growth < 1 item, or the last third no higher than the first"
        elif kind == "fds":
            leak = growth > max(2.0, 3 * sd) and max(ys[-third:]) > max(ys[:third])
            rule = "projected growth <= max(2 fds, 3 noise)"
        else:
            leak = growth > max(0.10 * abs(mean), 3 * sd) and mean > 0
            rule = "projected growth <= max(10% of the mean, 3 noise)"
        if key.endswith("logs_bytes"):
            leak = leak and max(ys) > LOG_CAP_BYTES  # the JSON log rotates: growth under its cap is by design
            rule += f" (or all under the JSON log's rotation cap, {LOG_CAP_BYTES} bytes with its kept files)"
        out[key] = {
            "first": ys[0],
            "last": ys[-1],
            "min": min(ys),
            "max": max(ys),
            "slope_per_cycle": round(slope, 4),
            "projected_growth": round(growth, 3),
            "noise_sd": round(sd, 4),
            "leak": leak,
            "rule": rule + (" (slope with the 1-minute load average as a second regressor)" if by_load else ""),
        }
    return out


def _series(cycles: list[dict[str, Any]]) -> dict[str, list[float]]:
    keys: dict[str, list[float]] = {}
    rows = [
        _flat(
            {
                "ind": c["indicators"],
                "deploy": {
                    "wall_s": c["deploy"]["wall_s"],
                    "accept_wall_s": c["deploy"]["steps_s"].get("accept") or 0.0,
                },
                "rollback": {"wall_s": c["rollback"]["wall_s"]},
            }
        )
        for c in cycles
    ]
    common = set.intersection(*(set(r) for r in rows)) if rows else set()
    for k in sorted(common):
        keys[k.removeprefix("ind.")] = [r[k] for r in rows]
    return keys


def finish(result: dict[str, Any], failure: str | None) -> dict[str, Any]:
    """Judge the cycles recorded in `result` (also a partial SOAK_OUT file: `python -m benchmarks.soak FILE`)."""
    done = result["cycles"]
    asked = result["cycles_asked"]
    series = _series(done[1:] if len(done) > 3 else done)  # cycle 1 settles B's release files
    loads = [c["load_average"][0] for c in (done[1:] if len(done) > 3 else done)]
    trends = trend(series, loads)
    leaks = sorted(k for k, v in trends.items() if v["leak"])
    passed = failure is None and not leaks and len(done) == asked
    walls = [c["deploy"]["wall_s"] for c in done]
    accept = [c["deploy"]["steps_s"].get("accept") or 0.0 for c in done]
    rb = [c["rollback"]["wall_s"] for c in done]
    result.update(
        cycles_done=len(done),
        failure=failure,
        leaks=leaks,
        trend=trends,
        summary={
            "deploy_wall_s_median": round(statistics.median(walls), 2) if walls else None,
            "deploy_wall_s_max": max(walls, default=None),
            "accept_s_median": round(statistics.median(accept), 2) if accept else None,
            "rollback_wall_s_median": round(statistics.median(rb), 2) if rb else None,
            "load_average_1min_median": round(statistics.median(c["load_average"][0] for c in done), 2)
            if done
            else None,
            "load_average_1min_range": [
                min(c["load_average"][0] for c in done),
                max(c["load_average"][0] for c in done),
            ]
            if done
            else None,
        },
        passed=passed,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    result["line"] = (
        f"soak: {len(done)}/{asked} deploy(+accept)/rollback cycles on {result['pair']} ({result['profile']}), "
        f"deploy median {result['summary']['deploy_wall_s_median']} s, rollback median "
        f"{result['summary']['rollback_wall_s_median']} s, failure {failure or 'none'}, "
        f"leaks {', '.join(leaks) or 'none'} of {len(trends)} indicators: {'PASS' if passed else 'FAIL'}"
    )
    return result


def run() -> dict[str, Any]:
    from orchestrator.config.inventory import load_inventory
    from orchestrator.lab.lab import Lab

    home = _home()
    inv_ref = INVENTORY
    inv = load_inventory(inv_ref, {"PAIRCTL_HOME": str(home.root)})
    Lab(home, inv).up()
    a, b = _packages(home)
    profile = ["--profile", PROFILE] if PROFILE else []
    out_path = os.environ.get("SOAK_OUT")

    st = _pairctl(home.root, inv_ref, "status", "--pair", PAIR)
    route = (st.get("doc") or {}).get("route") or {}
    on_a = st["exit"] == 0 and route.get("active_packages") == [a, a] and route.get("state") == "active"
    if on_a and (not PROFILE or str(route.get("active", "")).endswith(f"({PROFILE})")):
        warm = {"exit": 0, "wall_s": 0.0, "steps_s": {}, "skipped": "A already active, accepted and healthy"}
    else:
        warm = _pairctl(home.root, inv_ref, "deploy", "--pair", PAIR, "--packages", a, a, *profile)
    result: dict[str, Any] = {
        "pair": f"{inv_ref}/{PAIR}",
        "profile": PROFILE or inv.pair(PAIR).profile,
        "packages": {"A": a, "B": b},
        "cycles_asked": CYCLES,
        "warm_up": {**warm, "indicators": _indicators(home.root, inv)},
        "cycles": [],
    }
    failure = None if warm["exit"] == 0 else "warm-up deploy of A"
    t_start = time.monotonic()
    for i in range(1, CYCLES + 1 if failure is None else 1):
        d = _pairctl(home.root, inv_ref, "deploy", "--pair", PAIR, "--packages", b, b, *profile)
        r = (
            _pairctl(home.root, inv_ref, "rollback", "--pair", PAIR)
            if d["exit"] == 0
            else {"exit": None, "wall_s": 0.0, "steps_s": {}}
        )
        cyc = {
            "cycle": i,
            "load_average": os.getloadavg(),
            "deploy": d,
            "rollback": r,
            "indicators": _indicators(home.root, inv),
        }
        result["cycles"].append(cyc)
        h = cyc["indicators"]["hosts"]
        print(
            f"soak cycle {i}/{CYCLES}: deploy {d['exit']} {d['wall_s']:.1f} s, "
            f"rollback {r['exit']} {r['wall_s']:.1f} s, "
            f"procs {[v['procs_under_root'] for v in h.values()]}, sshd {[v['sshd_sessions'] for v in h.values()]}, "
            f"load {cyc['load_average'][0]:.1f}",
            flush=True,
        )
        if out_path:
            Path(out_path).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        if d["exit"] != 0 or r["exit"] != 0:
            failure = f"cycle {i}: deploy exit {d['exit']}, rollback exit {r['exit']}"
            break
    result["soak_wall_s"] = round(time.monotonic() - t_start, 1)
    finish(result, failure)
    if out_path:
        Path(out_path).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":  # re-judge a (partial) SOAK_OUT file: python -m benchmarks.soak FILE [OUT]
    doc = json.loads(Path(sys.argv[1]).read_text())
    last = doc["cycles"][-1] if doc["cycles"] else None
    bad = last is not None and (last["deploy"]["exit"] != 0 or last["rollback"]["exit"] != 0)
    doc = finish(doc, doc.get("failure") or (f"cycle {last['cycle']}: a command failed" if bad and last else None))
    doc.setdefault("benchmark", "soak")
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    Path(sys.argv[2]).write_text(text) if len(sys.argv) > 2 else print(doc["line"])
