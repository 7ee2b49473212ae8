"""verify_identity: is the running pair exactly what its manifests, profile and route say?

Used by deploy, rollback, status and acceptance. Reads the helper's `identity` (sha256 of each
supervised process's exe and cmdline), that the pids still run, `/props`, `/slots` and (for
pipeline parallelism) the server log; compares with the pure functions in `hosts.probes`.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.build import revisions
from orchestrator.hosts import supervisor
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.probes import (
    ExpectedProc,
    ProcIdentity,
    argv_from,
    build_info_problems,
    log_unwritable,
    parse_identity,
    parse_rpc_bind,
    parse_rpc_probe,
    proc_problems,
    rpc_probe_problem,
    service_dir,
    slots_problems,
)
from orchestrator.hosts.rpc_guard import guard_problem, guard_sha256, parse_guard
from orchestrator.hosts.services import SERVER_LOG, get_json, process_alive
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import HOST_LOG_MAX, Transport
from orchestrator.roles import LLAMA_SERVER, ROLES, RPC_SERVER, SERVICE_OF_ROLE
from orchestrator.server.tunnel import via_for

PIPELINE_LINE = "pipeline parallelism enabled"


@dataclass(frozen=True)
class Expected:
    """What must be running: per role the binary hash and argv; server-level facts."""

    native: ExpectedProc
    rpc: ExpectedProc
    revision: str
    build_info: str | None
    parallel: int
    per_slot_ctx: int
    rpc_bind: str
    rpc_port: int
    expect_pipeline_parallel: bool = False
    # the RPC package's revision (its manifest's): one pair runs one revision (build/revisions.py)
    rpc_revision: str | None = None
    # the peers ggml-rpc-server's guard must serve (Inventory.rpc_peers); None: not checked
    rpc_peers: tuple[str, ...] | None = None


@dataclass
class IdentityReport:
    problems: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # role/host -> what was seen

    @property
    def ok(self) -> bool:
        return not self.problems


def read_identities(
    transports: Mapping[str, Transport], layouts: Mapping[str, HostLayout], roles: tuple[str, ...] = ROLES
) -> dict[str, ProcIdentity | None]:
    """One exec per host: sha256 of /proc/PID/exe and /proc/PID/cmdline of its service."""
    out: dict[str, ProcIdentity | None] = {}
    for role in roles:
        name = SERVICE_OF_ROLE[role]
        res = transports[role].run_idempotent(layouts[role].identity_cmd(name), timeout=60)
        out[role] = parse_identity(as_text(res.stdout)).get(name)
    return out


RPC_PROBE_S = 3  # the RPC HELLO's bound: a healthy ggml-rpc-server answers it in milliseconds


def rpc_probe(t: Transport, layout: HostLayout, bind: str, port: int) -> str | None:
    """ggml-rpc-server hung? (pairctl-svc rpc-probe: stopped, or no HELLO answer while no client
    is served; the kernel accepting a connection proves nothing). One exec on the RPC host."""
    res = t.run_idempotent(layout.rpc_probe_cmd(RPC_SERVER, bind, port, RPC_PROBE_S), check=False, timeout=30)
    return parse_rpc_probe(as_text(res.stdout), RPC_SERVER)


def _pipeline_parallel(t: Transport, host: str, layout: HostLayout, folder: str, problems: list[str]) -> bool:
    """Whether llama-server's log in FOLDER says PIPELINE_LINE (the profile expects it); where not,
    the problem: that, or why its server could never write that log (probes.log_unwritable)."""
    try:
        log = t.read_bytes(posixpath.join(folder, SERVER_LOG), max_bytes=HOST_LOG_MAX)
    except (FileNotFoundError, OSError):
        log = b""
    if PIPELINE_LINE.encode() in log:
        return True
    why = log_unwritable(t, host, layout.root, folder, LLAMA_SERVER)
    problems.append(why or f"{host}: {SERVER_LOG} does not say '{PIPELINE_LINE}' (the profile expects it)")
    return False


def verify_identity(
    transports: Mapping[str, Transport],
    layouts: Mapping[str, HostLayout],
    hosts: Mapping[str, str],
    expected: Expected,
    *,
    base_url: str,
    api_key: str | None = None,
    roles: tuple[str, ...] = ROLES,
    http: bool = True,
    seen: Mapping[str, ProcIdentity | None] | None = None,
) -> IdentityReport:
    """Every identity condition, all checked, problems listed. `seen`: identities read by the exec
    that started each process (deploy), so only the pids' liveness is re-read; else read now."""
    rep = IdentityReport()
    probe_rpc = seen is None  # a deploy's own start just saw it listen, with llama-server connecting
    if expected.rpc_revision is not None and revisions.differ(expected.revision, expected.rpc_revision):
        rep.problems.append(
            f"{hosts.get('native', 'native')} and {hosts.get('rpc', 'rpc')} run two source revisions "
            f"({expected.revision[:12]} and {expected.rpc_revision[:12]}): a pair runs one revision"
        )
    if seen is None:
        seen = read_identities(transports, layouts, roles)
    for role in roles:
        t, layout, host = transports[role], layouts[role], hosts[role]
        exp = expected.native if role == "native" else expected.rpc
        name = SERVICE_OF_ROLE[role]
        # started from the runtime dir (run/ read-only): its --log-file is there too (argv_from)
        d = service_dir(t, layout.root, name)
        if d != layout.run:
            exp = dataclasses.replace(exp, argv=argv_from(exp.argv, layout.root, name, d))
        ident = seen.get(role)
        alive = bool(ident and ident.pid is not None and process_alive(t, ident.pid, name))
        rep.data[host] = {
            "service": name,
            "pid": ident.pid if ident else None,
            "alive": alive,
            "exe_sha256": ident.exe_sha256 if ident else None,
            "argv": list(ident.argv) if ident else [],
            "expected_exe_sha256": exp.exe_sha256,
        }
        # restarts the host's supervisor made since this service was (re)started by a deploy or
        # rollback: a restarted process with the same exe and argv is the same identity, counted
        sup = supervisor.read_state(t, layout, name, folder=d)
        rep.data[host]["supervisor"] = sup.as_dict() if sup else None
        rep.problems += proc_problems(host, exp, ident)
        if ident is not None and ident.running and not alive:
            rep.problems.append(f"{host}: {name} (pid {ident.pid}) is no longer running")
        if role == "rpc" and ident is not None and ident.running and probe_rpc:
            state = rpc_probe(t, layout, expected.rpc_bind, expected.rpc_port)
            rep.data[host]["rpc_probe"] = state
            problem = rpc_probe_problem(host, name, state, RPC_PROBE_S)
            if problem:
                rep.problems.append(problem)
        if role == "rpc" and ident is not None and ident.running and expected.rpc_peers is not None:
            res = t.run_idempotent(layout.guard_cmd(name), check=False, timeout=30)
            guard = parse_guard(as_text(res.stdout), name)
            rep.data[host]["rpc_guard"] = (
                {"sha256": guard[0], "allow": guard[1], "key_id": guard[2], "this_pairctl": guard[0] == guard_sha256()}
                if guard
                else None
            )
            if problem := guard_problem(host, name, guard, list(expected.rpc_peers)):
                rep.problems.append(problem)
        if role == "rpc" and ident is not None and ident.running:
            bind, port = parse_rpc_bind(ident.argv)
            if bind != expected.rpc_bind or port != expected.rpc_port:
                rep.problems.append(
                    f"{host}: ggml-rpc-server runs with -H {bind} -p {port}, "
                    f"inventory says {expected.rpc_bind}:{expected.rpc_port}"
                )
        if role == "native" and expected.expect_pipeline_parallel:
            rep.data[host]["pipeline_parallel"] = _pipeline_parallel(t, host, layout, d, rep.problems)
    if http and "native" in roles:
        try:
            via = via_for(transports["native"], api_key)  # the key only inside SSH (server.tunnel)
            props = get_json(base_url, "/props", api_key=api_key, via=via)
            slots = get_json(base_url, "/slots", api_key=api_key, via=via)
        except Exception as exc:  # an unreachable server is a problem to report, not a crash
            rep.problems.append(f"{hosts['native']}: cannot read /props or /slots at {base_url}: {exc}")
        else:
            bi = props.get("build_info")
            rep.data["server"] = {
                "build_info": bi,
                "total_slots": props.get("total_slots"),
                "slots": [{"id": s.get("id"), "n_ctx": s.get("n_ctx")} for s in slots]
                if isinstance(slots, list)
                else slots,
            }
            rep.problems += build_info_problems(bi, expected.revision, expected.build_info)
            rep.problems += slots_problems(
                slots if isinstance(slots, list) else [], expected.parallel, expected.per_slot_ctx
            )
    return rep
