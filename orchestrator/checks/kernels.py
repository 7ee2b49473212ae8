"""Kernel validation on a pair: run each host's packaged `ggml-kernel-cases` against the CPU.

A GPU host tests its own GPUs; a CPU host tests the RPC device of the pair's RPC host. Since
`ggml-rpc-server` serves one client at a time, the check starts a second one from the RPC host's
package on another port, under its own `pairctl-svc` root (`<install_root>/run/kernel-check`),
guarded as the live one is (RPC guard preloaded and read back, route key proven by each peer via
`dial_env`), and stops it whatever happened.

Planning (`plan_kernel_check`) and judging (`parse_harness_output`, `judge_host`) are pure;
`run_kernel_check` executes a plan into its own receipt or a step of a caller's journal.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator import faults
from orchestrator.build.harness import HARNESS_NAME
from orchestrator.checks.runner import heartbeat, heartbeat_s
from orchestrator.config.inventory import Inventory
from orchestrator.config.kernels import CaseSet, load_cases, load_kernel
from orchestrator.errors import CheckFailed, ConfigError, HostError
from orchestrator.evidence.journal import Journal
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import sha256_file
from orchestrator.hosts import probes
from orchestrator.hosts.layout import RPC_SERVER, HostLayout, install_helper, put_secret
from orchestrator.hosts.leases import LeaseLost, default_owner, hold_pair_leases, hosts_of, targets_of
from orchestrator.hosts.probes import ProbeError, parse_identity, parse_sha256sum, read_facts
from orchestrator.hosts.rpc_guard import (
    KEY_LEN,
    ROUTE_KEY,
    guard_problem,
    install_guard,
    install_route_key,
    parse_guard,
)
from orchestrator.log import get_logger
from orchestrator.remote.command import Cmd
from orchestrator.remote.pool import TransportPool
from orchestrator.roles import ROLES, Role

DEFAULT_KERNEL = "mmvf-warp-per-row"
KERNEL_CHECK_DIR = "kernel-check"  # under <install_root>/run: the second rpc-server's own svc root
HARNESS_RELPATH = ("tests", "bin", HARNESS_NAME)
HARNESS_TIMEOUT_S = 900
# a check on its own holds the pair's leases this long at most: two harness runs, the rpc-server's
# start, wait and stop, and a margin
LEASE_TTL_S = 2 * HARNESS_TIMEOUT_S + 600
EXIT_MEANING = {
    0: "all cases passed",
    1: "a comparison failed",
    2: "usage or setup error",
    3: "no non-CPU backend to test",
    126: "harness not executable",
    127: "harness not found: the package was built without tests/bin/ggml-kernel-cases",
}


# --- plan (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RpcServerPlan:
    """The second rpc-server: which host, from which package, bound where; under its own root so
    its pid and output files never touch the live services'."""

    host: str
    root: str  # <install_root>/run/kernel-check
    binary: str
    bind: str
    port: int
    allow: tuple[str, ...] = ()  # the peers its guard serves (Inventory.rpc_peers); () refuses all
    user: str | None = None  # the RPC host's service_user: it runs as the live one does
    wait_s: int = 20
    native: tuple[str, str] = ("", "")  # the pair's native host and install root (the route key's other holder)
    rpc_root: str = ""  # the RPC host's install root: the route key copied from there into `root`

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.root)

    @property
    def endpoint(self) -> str:
        return f"{self.bind}:{self.port}"

    def argv(self) -> list[str]:
        return [self.binary, "-H", self.bind, "-p", str(self.port)]

    def start_cmd(self) -> Cmd:
        # sup.allow: the supervisor preloads the guard from <root>/bin and starts nothing without it
        sup = (f"sup.allow={','.join(self.allow)}", *((f"sup.user={self.user}",) if self.user else ()))
        return self.layout.start_cmd(RPC_SERVER, self.argv(), sup)

    def guard_cmd(self) -> Cmd:
        return self.layout.guard_cmd(RPC_SERVER)

    def wait_cmd(self) -> Cmd:
        return self.layout.wait_listen_cmd(RPC_SERVER, self.bind, self.port, self.wait_s)

    def stop_cmd(self) -> Cmd:
        return self.layout.stop_cmd(RPC_SERVER)

    def dial_env(self, host: str, install_root: str) -> tuple[tuple[str, str], ...]:
        """What a harness on HOST needs to prove the route key to this server's guard: the shim and
        key file on that host (this server's own root on the RPC host), preloaded."""
        layout = self.layout if host == self.host else HostLayout(install_root)
        key = posixpath.join(layout.secrets, ROUTE_KEY)
        return (("LD_PRELOAD", layout.guard), ("PAIRCTL_RPC_DIAL", self.endpoint), ("PAIRCTL_RPC_KEY", key))


def port_taken(proc_net_tcp: str, bind: str, port: int) -> list[str]:
    """Listening addresses in /proc/net/tcp{,6} text that would clash with binding bind:port."""
    return probes.port_taken(probes.parse_proc_net_tcp(proc_net_tcp), bind, port)


def started_identity(output: str, binary: str) -> str | None:
    """Problem with the `proc=` line `pairctl-svc restart` printed, or None when our binary runs."""
    lines = "\n".join(line for line in output.splitlines() if line.startswith("proc="))
    try:
        proc = parse_identity(lines).get(RPC_SERVER)
    except ProbeError as exc:
        return f"unreadable identity line ({exc})"
    if proc is None or not proc.running:
        return "it is not running after its start (did its bind fail?)"
    if not proc.argv or proc.argv[0] != binary:
        return f"the running process is {proc.argv[:1]}, not {binary}"
    return None


@dataclass(frozen=True)
class HostRun:
    host: str
    role: Role
    package: str
    harness: str
    via_rpc: bool
    cmd: Cmd


@dataclass(frozen=True)
class KernelCheckPlan:
    pair: str
    kernel: str
    cases: tuple[str, ...]
    max_nmse: float
    perturb: tuple[str, ...]
    runs: tuple[HostRun, ...]
    rpc_server: RpcServerPlan | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair,
            "kernel": self.kernel,
            "cases": list(self.cases),
            "max_nmse": self.max_nmse,
            "perturb": list(self.perturb),
            "rpc_server": None
            if self.rpc_server is None
            else {
                "host": self.rpc_server.host,
                "binary": self.rpc_server.binary,
                "endpoint": self.rpc_server.endpoint,
                "allow": list(self.rpc_server.allow),
            },
            "runs": [
                {
                    "host": r.host,
                    "role": r.role,
                    "package": r.package,
                    "harness": r.harness,
                    "via_rpc": r.via_rpc,
                    "argv": r.cmd.display(),
                }
                for r in self.runs
            ],
        }


def harness_argv(harness: str, cases: CaseSet, *, rpc: str | None, perturb: Iterable[str] = ()) -> list[str]:
    argv = [harness]
    for c in cases.cases:
        argv += ["--case", c.harness_spec()]
    argv += ["--max-nmse", repr(cases.max_nmse)]
    if rpc:
        argv += ["--rpc", rpc, "--no-local"]
    for p in perturb:
        argv += ["--perturb", p]
    return argv


def plan_kernel_check(
    inventory: Inventory,
    pair: str,
    cases: CaseSet,
    packages: Mapping[str, str],
    *,
    port: int | None = None,
    perturb: Iterable[str] = (),
) -> KernelCheckPlan:
    """Which harness runs where, with which argv, and whether a second rpc-server is needed (on
    `port`, default rpc_port + 1). `packages`: host name -> package id."""
    p = inventory.pair(pair)
    perturb = tuple(perturb)
    unknown = [x for x in perturb if x != "all" and x not in cases.names()]
    if unknown:
        raise ConfigError(f"--perturb names no case of {cases.kernel}: {unknown} (cases: {', '.join(cases.names())})")
    bind = inventory.rpc_bind(pair)
    port = port if port is not None else p.rpc_port + 1
    if port in (p.rpc_port, p.server_port):
        raise ConfigError(
            f"kernel check port {port} is the pair's {'rpc' if port == p.rpc_port else 'server'} port; pick another"
        )
    if not 1 <= port <= 65535:
        raise ConfigError(f"kernel check port {port} is out of range")
    endpoint = f"{bind}:{port}"

    missing = [h for h in (p.native, p.rpc) if h not in packages]
    if missing:
        raise ConfigError(f"no package given for host {missing[0]}")
    server = None
    if any(inventory.host(h).gpu is None for h in (p.native, p.rpc)):
        rl = HostLayout(inventory.host(p.rpc).install_root)
        server = RpcServerPlan(
            host=p.rpc,
            root=posixpath.join(inventory.host(p.rpc).state_dir or rl.run, KERNEL_CHECK_DIR),
            binary=rl.binary(packages[p.rpc], RPC_SERVER),
            bind=bind,
            port=port,
            allow=tuple(inventory.rpc_peers(pair)),
            user=inventory.host(p.rpc).service_user,
            native=(p.native, inventory.host(p.native).install_root),
            rpc_root=rl.root,
        )
    runs = []
    for role, host_name in zip(ROLES, (p.native, p.rpc), strict=True):
        host = inventory.host(host_name)
        layout = HostLayout(host.install_root)
        harness = posixpath.join(layout.release(packages[host_name]), *HARNESS_RELPATH)
        via_rpc = server is not None and host.gpu is None
        argv = harness_argv(harness, cases, rpc=endpoint if via_rpc else None, perturb=perturb)
        # GGML_NO_BACKTRACE: an aborting harness (e.g. the RPC peer vanished) fails fast instead of attaching gdb.
        env = (("GGML_NO_BACKTRACE", "1"), *(server.dial_env(host_name, layout.root) if via_rpc and server else ()))
        runs.append(
            HostRun(
                host=host_name,
                role=role,
                package=packages[host_name],
                harness=harness,
                via_rpc=via_rpc,
                cmd=Cmd(tuple(argv), env=env),
            )
        )

    return KernelCheckPlan(
        pair=pair,
        kernel=cases.kernel,
        cases=tuple(cases.names()),
        max_nmse=cases.max_nmse,
        perturb=perturb,
        runs=tuple(runs),
        rpc_server=server,
    )


# --- judging (pure) ------------------------------------------------------------------------------


def parse_harness_output(text: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None, list[str]]:
    """JSON lines -> (case rows, summary or None, lines that were not JSON objects)."""
    rows: list[dict[str, Any]] = []
    summary = None
    junk: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            junk.append(line[:200])
            continue
        if not isinstance(obj, dict):
            junk.append(line[:200])
        elif obj.get("summary") is True:
            summary = obj
        else:
            rows.append(obj)
    return rows, summary, junk


@dataclass
class HostVerdict:
    host: str
    role: Role
    package: str
    exit_status: int
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)
    harness_sha256: str | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def judge_host(
    run: HostRun, exit_status: int, stdout: str, stderr: str, *, cases: Iterable[str], max_nmse: float
) -> HostVerdict:
    """Every case must have a row on at least one non-CPU backend and every row must pass, with an
    nmse we recompute the verdict from (the harness's own `passed` must agree), and exit 0."""
    rows, summary, junk = parse_harness_output(stdout)
    v = HostVerdict(
        host=run.host, role=run.role, package=run.package, exit_status=exit_status, rows=rows, summary=summary
    )
    if exit_status != 0:
        meaning = EXIT_MEANING.get(exit_status, "unexpected exit status")
        detail = stderr.strip().splitlines()[-3:] if stderr.strip() else []
        v.problems.append(
            f"{run.host}: harness exited {exit_status} ({meaning})" + (": " + " | ".join(detail) if detail else "")
        )
    if summary is None:
        v.problems.append(f"{run.host}: harness printed no summary line (crashed or was killed?)")
    if junk:
        v.problems.append(f"{run.host}: {len(junk)} harness output line(s) are not JSON, first: {junk[0]!r}")
    seen: dict[str, int] = {}
    for r in rows:
        name = str(r.get("case"))
        seen[name] = seen.get(name, 0) + 1
        nmse = r.get("nmse")
        ok = isinstance(nmse, (int, float)) and nmse <= max_nmse and not r.get("error")
        if bool(r.get("passed")) != ok:
            v.problems.append(
                f"{run.host}: case {name} on {r.get('backend')}: harness says passed={r.get('passed')} but nmse={nmse}"
            )
        if not ok:
            why = r.get("error") or f"nmse {nmse} > {max_nmse}"
            tag = " (reference perturbed on purpose)" if r.get("perturbed") else ""
            v.problems.append(f"{run.host}: case {name} on {r.get('backend')} failed: {why}{tag}")
    for name in cases:
        if name not in seen:
            v.problems.append(f"{run.host}: case {name} has no result on any non-CPU backend")
    return v


# --- execution -----------------------------------------------------------------------------------


@dataclass
class KernelCheckResult:
    plan: KernelCheckPlan
    verdicts: list[HostVerdict]
    receipt: str | None = None

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(v.passed for v in self.verdicts)

    @property
    def problems(self) -> list[str]:
        return [p for v in self.verdicts for p in v.problems]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.plan.pair,
            "kernel": self.plan.kernel,
            "passed": self.passed,
            "receipt": self.receipt,
            "problems": self.problems,
            "plan": self.plan.to_dict(),
            "hosts": [v.to_dict() for v in self.verdicts],
        }


def active_packages(inventory: Inventory, pair: str, pool: TransportPool) -> dict[str, str]:
    """The release `current` points at on each host of the pair (read over SFTP)."""
    p = inventory.pair(pair)
    out = {}
    for host_name in (p.native, p.rpc):
        layout = HostLayout(inventory.host(host_name).install_root, state=inventory.host(host_name).state_dir)
        facts = read_facts(pool.get(host_name), layout, ())
        if not facts.current:
            raise CheckFailed(
                f"{host_name}: no active package (no `current` release under {layout.root})",
                hint="deploy the pair first, or pass the package ids explicitly (--package HOST=ID)",
            )
        out[host_name] = facts.current
    return out


def _execute(
    plan: KernelCheckPlan, pool: TransportPool, journal: Journal, cases: list[str], log: Any
) -> KernelCheckResult:
    result = KernelCheckResult(plan=plan, verdicts=[])
    server = plan.rpc_server
    started = False
    try:
        if server is not None:
            t = pool.get(server.host)
            with journal.step("kernels.rpc_server.start", host=server.host) as step:
                step.data.update(argv=server.argv(), endpoint=server.endpoint)
                install_helper(t, server.layout)  # SFTP: the layout and this checkout's pairctl-svc
                step.data["guard"] = install_guard(t, server.layout)  # bin/ judged by install_helper
                # the pair's route key (made here when the pair has none yet: a first deploy's check),
                # copied into the server's own root, where its supervisor reads it as the live one does
                step.data["route_key"] = install_route_key(
                    (pool.get(server.native[0]), HostLayout(server.native[1])), (t, HostLayout(server.rpc_root))
                )
                key = t.read_bytes(posixpath.join(HostLayout(server.rpc_root).secrets, ROUTE_KEY), max_bytes=KEY_LEN)
                put_secret(t, server.layout, key, ROUTE_KEY)
                started = True  # from here on, always try to stop it
                t.run(server.stop_cmd(), timeout=60)  # a leftover of a killed check would hold the port
                # ggml-rpc-server exits 0 when its bind fails, and the helper's wait only sees *a*
                # listener: refuse a port someone else holds, then require our process to run.
                taken = probes.port_taken(probes.tcp_listeners(t), server.bind, server.port)
                if taken:
                    raise CheckFailed(
                        f"{server.host}: port {server.port} is already in use ({', '.join(taken)}); "
                        "the kernel check needs its own rpc-server port",
                        hint="pass --port",
                    )
                out = []
                for cmd in (server.start_cmd(), server.wait_cmd(), server.layout.identity_cmd(RPC_SERVER)):
                    res = t.run(cmd, check=False, timeout=server.wait_s + 30)
                    out.append(res.stdout.strip())
                    if res.exit_status != 0:
                        raise CheckFailed(
                            f"{server.host}: the kernel-check ggml-rpc-server on {server.endpoint} did not start "
                            f"(exit {res.exit_status}):\n{(res.stdout + res.stderr).strip()[-800:]}"
                        )
                step.data["output"] = "\n".join(out)[-1500:]
                problem = started_identity(out[-1], server.binary)
                if problem is None:  # the running process has the guard mapped, with the pair's peers
                    g = t.run(server.guard_cmd(), check=False, timeout=30)
                    state = parse_guard(g.stdout, RPC_SERVER)
                    step.data["guard_state"] = (
                        dict(zip(("sha256", "allow", "key"), state, strict=True)) if state else None
                    )
                    problem = guard_problem(server.host, RPC_SERVER, state, list(server.allow))
                if problem:
                    raise CheckFailed(
                        f"{server.host}: the kernel-check ggml-rpc-server on {server.endpoint}: {problem}\n"
                        + "\n".join(out)[-800:]
                    )
        for run in plan.runs:
            t = pool.get(run.host)
            faults.at_step(f"kernels.harness.{run.role}")  # test-only boundary; inert otherwise
            with journal.step(f"kernels.harness.{run.role}", host=run.host) as step:
                h = t.run(Cmd(("sha256sum", run.harness)), check=False, timeout=60)
                sha = parse_sha256sum(h.stdout).get(run.harness) if h.exit_status == 0 else None
                res = t.run(run.cmd, check=False, timeout=HARNESS_TIMEOUT_S)
                v = judge_host(run, res.exit_status, res.stdout, res.stderr, cases=cases, max_nmse=plan.max_nmse)
                v.harness_sha256 = sha
                result.verdicts.append(v)
                journal.identity(run.host, {"package": run.package, "harness": run.harness, "harness_sha256": sha})
                journal.samples(f"kernels.harness.{run.role}", v.rows)
                step.data.update(
                    argv=run.cmd.display(),
                    exit_status=res.exit_status,
                    summary=v.summary,
                    passed=v.passed,
                    problems=v.problems,
                    duration_s=round(res.duration_s, 3),
                )
                log.info("kernel harness ran", host=run.host, exit_status=res.exit_status, passed=v.passed)
                if not v.passed:
                    step.fail("; ".join(v.problems[:5]))
    finally:
        if server is not None and started:
            t = pool.get(server.host)
            with journal.step("kernels.rpc_server.stop", host=server.host) as step:
                res = t.run(server.stop_cmd(), check=False, timeout=60)
                step.data["stop"] = res.stdout.strip()
                if res.exit_status != 0:
                    raise HostError(f"{server.host}: could not stop the kernel-check rpc-server: {res.stderr.strip()}")
    return result


def run_kernel_check(
    inventory: Inventory,
    pair: str,
    *,
    home: Any,
    kernel: str = DEFAULT_KERNEL,
    packages: Mapping[str, str] | None = None,
    port: int | None = None,
    perturb: Iterable[str] = (),
    pool: TransportPool | None = None,
    journal: Journal | None = None,
    argv: list[str] | None = None,
    planned: KernelCheckPlan | None = None,
) -> KernelCheckResult:
    """Run the kernel cases of `kernel` on both hosts of `pair`; raise CheckFailed when any fails.

    `packages` defaults to each host's active release; `journal` (a deploy's) replaces a receipt of
    its own; `planned` is the check as a deploy's plan decided it, run as it is.
    """
    log = get_logger(pair=pair, step="kernels.check")
    cases = load_cases(kernel)
    own_pool = pool is None
    hosts = pool if pool is not None else TransportPool(inventory)

    def run(j: Journal) -> KernelCheckResult:
        nonlocal packages
        with j.step("kernels.plan") as step:
            if packages is None and planned is None:
                packages = active_packages(inventory, pair, hosts)
            plan = planned or plan_kernel_check(inventory, pair, cases, packages or {}, port=port, perturb=perturb)
            step.data["plan"] = plan.to_dict()
        return _execute(plan, hosts, j, cases.names(), log)

    try:
        if journal is not None:
            result = run(journal)
        else:
            own = EvidenceStore(home.evidence).begin(
                command="kernels check",
                argv=argv or ["pairctl", "kernels", "check", "--pair", pair, "--kernel", kernel],
                pair=pair,
                inputs=_inputs(kernel),
            )
            # on its own the check writes live files (route key, guard): it holds the pair's leases
            # as accept does, renewed while the cases run and stale after two missed renewals
            with own:
                with ExitStack() as stack:
                    with own.step("lease", host=",".join(hosts_of(inventory, pair))) as st:
                        period = heartbeat_s(LEASE_TTL_S)
                        held = stack.enter_context(
                            hold_pair_leases(
                                targets_of(inventory, hosts, pair),
                                owner=default_owner(),
                                purpose=f"pairctl kernels check {pair} (run {own.run_id})",
                                ttl_s=LEASE_TTL_S,
                                stale_after_s=int(2 * period),
                            )
                        )
                        st.data["leases"] = held.public()["hosts"]
                        st.data["heartbeat_s"] = period
                    with heartbeat(held, period) as lost:
                        result = run(own)
                    if lost:
                        raise LeaseLost(
                            f"pair {pair}: the kernel check's lease was lost while it ran ({lost[0]})",
                            hint=f"`pairctl lease show {pair}` names the holder; check again once it is done",
                        )
                own.set("kernel_check", {"kernel": kernel, "passed": result.passed, "problems": result.problems})
                result.receipt = own.finish(
                    "passed" if result.passed else "failed",
                    "all kernel cases passed on both hosts"
                    if result.passed
                    else f"{len(result.problems)} kernel problem(s); first: {result.problems[0]}",
                )
    finally:
        if own_pool:
            hosts.close()
    if not result.passed:
        where = f" (receipt {result.receipt})" if result.receipt else ""
        err = KernelCheckFailed(
            f"kernel check of {kernel} on pair {pair} failed{where}:\n  " + "\n  ".join(result.problems[:12])
        )
        err.result = result
        raise err
    return result


class KernelCheckFailed(CheckFailed):
    """A kernel case failed; `.result` holds the full KernelCheckResult (for --json output)."""

    result: KernelCheckResult | None = None


def _inputs(kernel: str) -> dict[str, str]:
    d, meta = load_kernel(kernel)
    return {
        "kernel.yaml": sha256_file(d / "kernel.yaml"),
        "cases.yaml": sha256_file(d / meta.cases),
        "patch": meta.patch_sha256,
    }


def deploy_step(ctx: Any, planned: KernelCheckPlan) -> dict[str, Any]:
    """The engine handler for a playbook step `action: kernel-check`: placed after `upload` and
    before `stop-native`, so a failure aborts the deploy before anything that runs has changed."""
    result = run_kernel_check(
        ctx.inventory, ctx.view.name, home=ctx.home, kernel=planned.kernel, planned=planned,
        pool=ctx.pool, journal=ctx.journal,
    )  # fmt: skip
    return {
        "kernel": result.plan.kernel,
        "passed": result.passed,
        "hosts": {v.host: (v.summary or {}) for v in result.verdicts},
    }
