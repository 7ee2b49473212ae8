"""A lab redeploy against its physical floor and against an Ansible playbook of the same steps.

On the lab pair `lab` with packages built by `pairctl build` (baseline "A" and revision lab-b
"B"), identity-verified, acceptance skipped, in one run:
  fresh     B is not on the hosts (removed first): pairctl (upload + verify) and the Ansible
            playbook (unarchive + sha256sum), PAIRCTL_BENCH_FRESH_ROUNDS rounds, alternating
  redeploy  A and B in turn, both present: pairctl, the floor and the Ansible playbook in
            rotating order, PAIRCTL_BENCH_ROUNDS rounds
The floor (`_floor`) is what any redeploy must do: two SSH connects, each host's release hashed
against the manifest, stop, start, GET /health; it and the playbook (benchmarks/ansible/deploy.yml,
ansible-core installed in .bench-venv, not in pairctl's venv: `python3 -m venv .bench-venv &&
.bench-venv/bin/pip install ansible-core`) work on a bench pair of their own on the same two
hosts (other ports and root), from the same package bytes. Reported: each tool's times and
medians, the ratios, and for pairctl its SSH execs (each starts the login shell on the host) and
round trips as the transport counts them (an exec, an SFTP request, a pipelined batch of SFTP
requests per wait), bytes sent and step times. Target (issue 29 item 4): the redeploy median
within FLOOR_FACTOR of the floor's; a fresh deploy under FRESH_TARGET_S with bytes sent, a
redeploy with none. pairctl is timed in-process (its start-up is benchmarks/startup.py's);
ansible-playbook as the process it is.

Home: PAIRCTL_HOME, else the test session's home (.state/test), so the packages the e2e
tests built are reused. The lab is brought up if needed; A stays active afterwards.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FRESH_TARGET_S = 3.0
FLOOR_FACTOR = 2.0  # issue 29 item 4: a redeploy within 2x of the physical floor
INVENTORY = os.environ.get("PAIRCTL_BENCH_INVENTORY", "lab")  # another lab pair (lab3 / lab1) if `lab` is busy
PAIR = os.environ.get("PAIRCTL_BENCH_PAIR", "lab")


def _home():
    from orchestrator.paths import Home

    root = os.environ.get("PAIRCTL_HOME") or str(REPO / ".state" / "test")
    os.environ["PAIRCTL_HOME"] = root
    return Home.resolve(root)


def _packages(home) -> tuple[str, str]:
    """(A, B): baseline and lab-b cpu-lab packages, built with `pairctl build` if missing."""
    from orchestrator.build.store import PackageStore
    from orchestrator.lab.source import BASELINE_TAG, ensure_source
    from tests.plugins.packages import REV_B_TAG, build_package, ensure_rev_b

    repo = ensure_source(home)
    ensure_rev_b(repo)
    a = build_package(home.root, BASELINE_TAG)
    b = build_package(home.root, REV_B_TAG)
    assert PackageStore(home.store).get(a.id).manifest.revision != b.manifest.revision
    return a.id, b.id


class _CountingPool:
    """A TransportPool whose transports count their execs (`run` calls; SFTP requests are not
    execs). The transport's own stats count SFTP requests as commands too."""

    def __init__(self, inventory: Any) -> None:
        from orchestrator.remote.pool import TransportPool

        self._pool = TransportPool(inventory)
        self.execs: dict[str, int] = {}

    def get(self, host: str) -> Any:
        t = self._pool.get(host)
        if not getattr(t, "_bench_counted", False):
            inner = t.run

            def run(cmd: Any, **kw: Any) -> Any:
                self.execs[host] = self.execs.get(host, 0) + 1
                return inner(cmd, **kw)

            t.run = run  # run_idempotent calls run, so it is counted once
            t._bench_counted = True
        return t

    def stats(self) -> dict[str, Any]:
        return {h: {**s, "execs": self.execs.get(h, 0)} for h, s in self._pool.stats().items()}

    def close(self) -> None:
        self._pool.close()


def _deploy(home: Any, inv: Any, pkg: str) -> Any:
    from orchestrator.engine.deploy import deploy

    pool = _CountingPool(inv)
    try:
        return deploy(home, inv, PAIR, (pkg, pkg), profile_name="lab", skip_accept=True, pool=pool)
    finally:
        pool.close()


def _measure(res: Any) -> dict[str, Any]:
    t = res.timings
    servers = t.get("server_start_to_healthy_s", 0.0)  # after the start exec returned: model load + /health
    rts = sum(s.get("round_trips", 0) for s in res.transport.values())
    execs = sum(s.get("execs", 0) for s in res.transport.values())
    return {
        "wall_s": round(res.wall_s, 3),
        "servers_start_to_ready_s": round(servers, 3),
        "llama_server_start_to_healthy_s": round(t.get("server_start_to_healthy_s", 0.0), 3),
        "rpc_restart_exec_s": round(t.get("rpc_restart_to_listening_s", 0.0), 3),  # stop+switch+start+listen, one exec
        "pairctl_own_s": round(res.wall_s - servers, 3),
        "pairctl_parts_s": {k: round(v, 3) for k, v in t.items() if k != "server_start_to_healthy_s"},
        "steps_s": {s["name"]: s["seconds"] for s in res.steps},
        "ssh_round_trips": rts,  # as the transport counts them: execs + SFTP requests + file puts/gets
        "ssh_execs": execs,  # each starts a process (and the login shell) on the host: the expensive kind
        "ssh_execs_by_host": {h: s.get("execs", 0) for h, s in res.transport.items()},
        "ssh_round_trips_by_host": {h: s.get("round_trips", 0) for h, s in res.transport.items()},
        "package_bytes_sent": sum(u.get("bytes_sent", 0) for u in res.uploads.values()),
        "receipt": res.receipt,
    }


# -- the bench pair: the physical floor and the Ansible playbook, beside the lab pair ------------------
#
# Both work on a pair of their own on the same two sshd hosts: root <host dir>/bench (releases/,
# leases/, run/, current, previous, route.json), llama-server on BENCH_SERVER_PORT and
# ggml-rpc-server on BENCH_RPC_PORT, the lab pair's llama-server argv with those ports, the same
# package bytes. Neither touches the lab pair, so rounds of the three can alternate.

BENCH_SERVER_PORT = 8090
BENCH_RPC_PORT = 50062
ANSIBLE_PLAYBOOK = REPO / "benchmarks" / "ansible" / "deploy.yml"
ANSIBLE_BIN = REPO / ".bench-venv" / "bin" / "ansible-playbook"  # ansible-core, kept out of pairctl's venv

# One script per host per phase, its values as positional arguments (never formatted into it).
_STOP = (
    '( pid=$(cat "$1/run/$2.pid" 2>/dev/null) || exit 0; kill "$pid" 2>/dev/null || exit 0; i=0; '
    'while kill -0 "$pid" 2>/dev/null && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; '
    '! kill -0 "$pid" 2>/dev/null )'
)
_HASH = 'cd "$1/releases/$3" && sha256sum -c --quiet --strict - && cd / && '
_SWITCH_START = (
    'cd "$1" && { [ -L current ] && mv -T current previous || true; } && ln -sfn "releases/$3" .current.tmp '
    "&& mv -T .current.tmp current && cd run && n=$2 && shift 3 && "
    '{ setsid "$PWD/../current/bin/$n" "$@" > "$n.out" 2>&1 < /dev/null & echo $! > "$n.pid"; }'
)
_WAIT_PORT = (
    "i=0; until ss -Htln | awk '{print $4}' | grep -qx \"$A:$P\"; do "
    "sleep 0.01; i=$((i+1)); [ $i -lt 3000 ] || exit 1; done"
)


def _bench_root(inv: Any, host: str) -> Path:
    return Path(inv.host(host).install_root).parent / "bench"


def _server_args(inv: Any) -> list[str]:
    """The lab pair's running llama-server argv (after argv[0]), on the bench pair's ports."""
    p = inv.pair(PAIR)
    root = Path(inv.host(p.native).install_root)
    pid = (root / "run" / "llama-server.pid").read_text().strip()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:-1]
    out, skip = [], False
    for a in (x.decode() for x in argv):
        if skip:
            skip = False
            continue
        if a in ("--log-file",):
            skip = True
            continue
        out.append(a)
    for flag, value in (("--port", str(BENCH_SERVER_PORT)), ("--rpc", f"{inv.host(p.rpc).address}:{BENCH_RPC_PORT}")):
        out[out.index(flag) + 1] = value
    return out


def _manifest_lines(home: Any, pkg: str) -> bytes:
    from orchestrator.build.store import PackageStore
    from orchestrator.hosts.release import expected_hashes, manifest_lines

    return manifest_lines(expected_hashes(PackageStore(home.store).get(pkg).manifest))


def _ssh_client(inv: Any, host: str) -> Any:
    import paramiko

    spec = inv.host(host)
    c = paramiko.SSHClient()
    c.load_host_keys(inv.known_hosts)
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(
        spec.address, port=spec.port, username=spec.user, key_filename=spec.key,
        allow_agent=False, look_for_keys=False, timeout=10,
    )  # fmt: skip
    return c


def _exec(c: Any, script: str, args: list[str], stdin: bytes = b"", env: dict[str, str] | None = None) -> None:
    import shlex

    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    line = (pre + " " if pre else "") + shlex.join(["sh", "-c", script, "sh", *args])
    chan = c.get_transport().open_session()
    chan.exec_command(line)
    if stdin:
        chan.sendall(stdin)
    chan.shutdown_write()
    out = chan.makefile("rb").read() + chan.makefile_stderr("rb").read()
    rc = chan.recv_exit_status()
    if rc != 0:
        raise RuntimeError(f"floor exec failed ({rc}): {out[-400:]!r}")


def _floor(home: Any, inv: Any, pkg: str, server_args: list[str]) -> float:
    """The physical floor of a redeploy of a present release: two SSH connects (in parallel),
    on each host one exec that hashes the release against the manifest (sha256sum -c) and stops
    its service (the RPC host's also switches links, starts ggml-rpc-server and waits for its
    port), one exec on the native host that switches links and starts llama-server, and GET
    /health until 200. No lease, no route record, no identity reads: less than any careful tool."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    p = inv.pair(PAIR)
    nat, rpc = inv.host(p.native), inv.host(p.rpc)
    lines = _manifest_lines(home, pkg)
    rroot, nroot = str(_bench_root(inv, p.rpc)), str(_bench_root(inv, p.native))
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as ex:
        cn, cr = ex.submit(_ssh_client, inv, p.native), ex.submit(_ssh_client, inv, p.rpc)
        n, r = cn.result(), cr.result()
        try:
            fn = ex.submit(_exec, n, _HASH + _STOP, [nroot, "llama-server", pkg], lines)
            rpc_script = _HASH + _STOP + " && " + _SWITCH_START + " && " + _WAIT_PORT
            rpc_args = [rroot, "ggml-rpc-server", pkg, "-H", rpc.address, "-p", str(BENCH_RPC_PORT)]
            fr = ex.submit(_exec, r, rpc_script, rpc_args, lines, {"A": rpc.address, "P": str(BENCH_RPC_PORT)})
            fn.result()
            fr.result()
            _exec(n, _SWITCH_START, [nroot, "llama-server", pkg, *server_args])
            url = f"http://{nat.address}:{BENCH_SERVER_PORT}/health"
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"floor: {url} not healthy in 60 s")
                time.sleep(0.01)
        finally:
            n.close()
            r.close()
    return time.monotonic() - t0


def _ansible(home: Any, inv: Any, pkg: str, server_args: list[str], work: Path) -> float:
    """ansible-playbook benchmarks/ansible/deploy.yml on the bench pair: a fresh process and fresh
    SSH connections each run (its own ControlPath dir), pipelining on; wall time of the process."""
    import json
    import shlex
    import subprocess

    p = inv.pair(PAIR)
    nat, rpc = inv.host(p.native), inv.host(p.rpc)
    run_dir = work / f"run-{time.monotonic_ns()}"
    (run_dir / "cp").mkdir(parents=True)
    (work / "manifest.txt").write_bytes(_manifest_lines(home, pkg))
    tar = work / f"{pkg}.tar"
    if not tar.exists():
        from orchestrator.build.store import PackageStore
        from orchestrator.hosts.release import pack

        tar.write_bytes(pack(PackageStore(home.store).get(pkg).path))
    hosts = {}
    for name, spec in ((p.native, nat), (p.rpc, rpc)):
        hosts[name] = {
            "ansible_host": spec.address,
            "ansible_port": spec.port,
            "ansible_user": spec.user,
            "ansible_ssh_private_key_file": spec.key,
            "root": str(_bench_root(inv, name)),
        }
    inventory = {
        "all": {
            "children": {
                "pair": {
                    "children": {
                        "native": {"hosts": {p.native: hosts[p.native]}},
                        "rpc": {"hosts": {p.rpc: hosts[p.rpc]}},
                    }
                }
            }
        }
    }
    (run_dir / "inventory.json").write_text(json.dumps(inventory))
    (run_dir / "ansible.cfg").write_text(
        "[defaults]\nhost_key_checking = True\ninterpreter_python = /usr/bin/python3\nretry_files_enabled = False\n"
        "[ssh_connection]\npipelining = True\n"
        f"ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile={inv.known_hosts} "
        "-o StrictHostKeyChecking=yes -o BatchMode=yes\n"
        f"control_path_dir = {run_dir / 'cp'}\n"
    )
    extra = {
        "release": pkg,
        "tarball": str(tar),
        "manifest_lines_file": str(work / "manifest.txt"),
        "rpc_host": rpc.address,
        "rpc_port": BENCH_RPC_PORT,
        "server_host": nat.address,
        "server_port": BENCH_SERVER_PORT,
        "server_args": shlex.join(server_args),
    }
    (run_dir / "vars.json").write_text(json.dumps(extra))
    env = {**os.environ, "ANSIBLE_CONFIG": str(run_dir / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(run_dir / "tmp")}
    t0 = time.monotonic()
    res = subprocess.run(
        [str(ANSIBLE_BIN), "-i", str(run_dir / "inventory.json"), str(ANSIBLE_PLAYBOOK),
         "-e", f"@{run_dir / 'vars.json'}"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wall = time.monotonic() - t0
    subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={run_dir / 'cp'}/x"], capture_output=True)  # best effort
    if res.returncode != 0:
        raise RuntimeError(f"ansible-playbook failed ({res.returncode}): {res.stdout[-1500:]}")
    return wall


def _bench_setup(inv: Any, packages: tuple[str, ...], fresh: str) -> None:
    """The bench roots exist with the lab's releases (copied on the host's own disk: untimed
    setup), except `fresh`, which the Ansible fresh deploy uploads."""
    p = inv.pair(PAIR)
    for h in (p.native, p.rpc):
        root = _bench_root(inv, h)
        for d in ("releases", "leases", "run"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "leases" / "deploy.lock").exists() and (root / "leases" / "deploy.lock").rmdir()
        for pkg in packages:
            dst = root / "releases" / pkg
            if pkg == fresh:
                if dst.exists() and os.path.realpath(root / "current") != str(dst):
                    shutil.rmtree(dst)
                continue
            if not dst.exists():
                shutil.copytree(Path(inv.host(h).install_root) / "releases" / pkg, dst, symlinks=True)


def _bench_down(inv: Any) -> None:
    import signal

    p = inv.pair(PAIR)
    for h, name in ((p.native, "llama-server"), (p.rpc, "ggml-rpc-server")):
        pidf = _bench_root(inv, h) / "run" / f"{name}.pid"
        try:
            os.kill(int(pidf.read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass


def _median(xs: list[float]) -> float:
    import statistics

    return round(statistics.median(xs), 3)


def run() -> dict[str, Any]:
    import tempfile

    from orchestrator.config.inventory import load_inventory
    from orchestrator.lab.lab import Lab

    rounds = int(os.environ.get("PAIRCTL_BENCH_ROUNDS", "5"))
    fresh_rounds = int(os.environ.get("PAIRCTL_BENCH_FRESH_ROUNDS", "2"))
    home = _home()
    inv = load_inventory(INVENTORY, {"PAIRCTL_HOME": str(home.root)})
    Lab(home, inv).up()
    a, b = _packages(home)
    p = inv.pair(PAIR)
    have_ansible = ANSIBLE_BIN.exists()
    work = Path(tempfile.mkdtemp(prefix="pairctl-bench-deploy-"))
    _deploy(home, inv, a)  # start from A active (untimed)
    server_args = _server_args(inv)
    fresh: dict[str, list[float]] = {"pairctl": [], "ansible": []}
    fresh_measure: dict[str, Any] = {}
    try:
        # fresh: B absent on both pairs' hosts, then deployed (A active before each, untimed)
        for k in range(fresh_rounds):
            _bench_setup(inv, (a, b), fresh=b)
            if have_ansible:
                _ansible(home, inv, a, server_args, work)
                _bench_setup(inv, (a, b), fresh=b)
            if k:
                _deploy(home, inv, a)
            for h in (p.native, p.rpc):
                rel = Path(inv.host(h).install_root) / "releases" / b
                if rel.exists():
                    shutil.rmtree(rel)
            order = ["pairctl", "ansible"] if k % 2 == 0 else ["ansible", "pairctl"]
            for tool in order:
                if tool == "pairctl":
                    m = _measure(_deploy(home, inv, b))
                    fresh["pairctl"].append(m["wall_s"])
                    fresh_measure = fresh_measure or m
                elif have_ansible:
                    fresh["ansible"].append(round(_ansible(home, inv, b, server_args, work), 3))
        # redeploys of a present release, alternating A and B, the three tools in rotating order
        redeploy: dict[str, list[float]] = {"pairctl": [], "ansible": [], "floor": []}
        pairctl_rounds: list[dict[str, Any]] = []
        uploaded: dict[str, Any] = {}
        tools = ["pairctl", "floor", "ansible"] if have_ansible else ["pairctl", "floor"]
        for i in range(rounds):
            pkg = a if i % 2 == 0 else b
            for tool in tools[i % len(tools) :] + tools[: i % len(tools)]:
                if tool == "pairctl":
                    m = _measure(_deploy(home, inv, pkg))
                    redeploy["pairctl"].append(m["wall_s"])
                    pairctl_rounds.append({k: m[k] for k in ("wall_s", "ssh_execs", "ssh_round_trips", "steps_s")})
                    if pkg == a:
                        uploaded = m
                elif tool == "floor":
                    redeploy["floor"].append(round(_floor(home, inv, pkg, server_args), 3))
                else:
                    redeploy["ansible"].append(round(_ansible(home, inv, pkg, server_args, work), 3))
        if rounds % 2 == 0:
            _deploy(home, inv, a)  # A stays active afterwards
    finally:
        _bench_down(inv)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: _median(v) for k, v in redeploy.items() if v}
    fmed = {k: _median(v) for k, v in fresh.items() if v}
    ratios = {"pairctl_over_floor": round(med["pairctl"] / med["floor"], 2)}
    if "ansible" in med:
        ratios["ansible_over_pairctl"] = round(med["ansible"] / med["pairctl"], 2)
        ratios["ansible_over_floor"] = round(med["ansible"] / med["floor"], 2)
    if "ansible" in fmed:
        ratios["fresh_ansible_over_pairctl"] = round(fmed["ansible"] / fmed["pairctl"], 2)
    within = med["pairctl"] <= FLOOR_FACTOR * med["floor"]
    passed = (
        within
        and fmed["pairctl"] < FRESH_TARGET_S
        and uploaded.get("package_bytes_sent") == 0
        and fresh_measure.get("package_bytes_sent", 0) > 0
    )
    line = (
        f"deploy: redeploy median {med['pairctl']:.2f} s vs floor {med['floor']:.2f} s "
        f"({ratios['pairctl_over_floor']:.2f}x, target <= {FLOOR_FACTOR:g}x)"
        + (
            f" vs ansible {med['ansible']:.2f} s ({ratios['ansible_over_pairctl']:.1f}x slower)"
            if "ansible" in med
            else ""
        )
        + f"; {uploaded.get('ssh_execs')} execs/{uploaded.get('ssh_round_trips')} round trips; "
        f"fresh {fmed['pairctl']:.2f} s"
        + (f" vs ansible {fmed['ansible']:.2f} s" if "ansible" in fmed else "")
        + f" ({rounds} + {fresh_rounds} rounds): {'PASS' if passed else 'FAIL'}"
    )
    return {
        "redeploy_s": redeploy,
        "redeploy_median_s": med,
        "fresh_s": fresh,
        "fresh_median_s": fmed,
        "ratios": ratios,
        "pairctl_rounds": pairctl_rounds,
        "fresh": fresh_measure,
        "uploaded": uploaded,
        "targets": {"fresh_s": FRESH_TARGET_S, "redeploy_over_floor": FLOOR_FACTOR},
        "passed": passed,
        "line": line,
        "packages": {"A": a, "B": b},
        "pair": f"{INVENTORY}/{PAIR}",
        "ansible": "ansible-core " + _ansible_version() if have_ansible else "not installed (.bench-venv)",
        "load_average": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _ansible_version() -> str:
    import subprocess

    out = subprocess.run([str(ANSIBLE_BIN), "--version"], capture_output=True, text=True).stdout
    return out.split("[core ", 1)[-1].split("]", 1)[0] if "[core " in out else out.splitlines()[0]
