"""The two supervised services of a pair: their argv (pure) and start / stop / wait (executing).

`ggml-rpc-server` exits 0 on an unknown argument and on a failed bind, so it is alive only if
its process lives AND its address:port listens (`pairctl-svc wait-listen`); `llama-server` when
`/health` answers 200 (a process that died fails the wait at once, with its log tail).
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import tenacity

from orchestrator.errors import CheckFailed, HostError
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, HostLayout
from orchestrator.hosts.probes import ProcIdentity, argv0_is, parse_identity, service_dir
from orchestrator.hosts.release import ReleaseMismatch, check_hash_output, manifest_lines
from orchestrator.hosts.space import NotWritable
from orchestrator.hosts.units import UnitReadback
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import HOST_FILE_MAX, HOST_LOG_MAX, Transport
from orchestrator.server.tunnel import TcpOpener, ssh_http_transport

if TYPE_CHECKING:
    from orchestrator.config.profiles import RouteProfile

SERVER_LOG = "llama-server.log"


def rpc_server_argv(layout: HostLayout, package_id: str, *, bind: str, port: int) -> list[str]:
    """`ggml-rpc-server -H <bind> -p <port>` from the release's own path (argv[0] names the release)."""
    return [layout.binary(package_id, RPC_SERVER), "-H", bind, "-p", str(port)]


def llama_server_argv(
    layout: HostLayout,
    package_id: str,
    profile: RouteProfile,
    *,
    model_paths: dict[str, str],
    host: str,
    port: int,
    rpc: list[str],
    with_api_key: bool,
) -> list[str]:
    """The profile's rendered argv plus the binary, the API key *file* and the log file."""
    return [layout.binary(package_id, LLAMA_SERVER)] + profile.render_args(
        model_paths=model_paths,
        host=host,
        port=port,
        rpc=rpc,
        api_key_file=layout.api_key if with_api_key else None,
        log_file=layout.log(SERVER_LOG),
    )


@dataclass
class WaitResult:
    seconds: float
    polls: int
    alive_checks: int


def _pid_and_identity(host: str, out: str, name: str) -> tuple[int, ProcIdentity]:
    pid = None
    ident_lines = []
    for line in out.splitlines():
        if line.startswith("pid="):
            pid = int(line[4:])
        elif line.startswith("proc="):
            ident_lines.append(line)
    ident = parse_identity("\n".join(ident_lines)).get(name)
    if pid is None or ident is None:
        raise HostError(f"{host}: pairctl-svc printed no pid/identity for {name}: {out[-300:]!r}")
    return pid, ident


Units = MutableMapping[str, UnitReadback]  # service name -> its unit read back after the start


def _unit_read_back(
    transport: Transport, layout: HostLayout, staged: tuple[str, str] | None, out: str, name: str, units: Units | None
) -> None:
    rb = layout.manager.read_back(transport.name, out, staged)
    if units is not None and rb is not None:
        units[name] = rb


RPC_LISTEN_S = 20  # restart: how long the helper waits for ggml-rpc-server to live and listen


def restart_bound_s(layout: HostLayout, listen_s: int = RPC_LISTEN_S) -> int:
    return listen_s + layout.manager.bound_s("restart")


def start(
    transport: Transport,
    layout: HostLayout,
    name: str,
    argv: list[str],
    sup: Sequence[str] = (),
    units: Units | None = None,
    cmd: Cmd | None = None,
) -> tuple[int, ProcIdentity]:
    """Start NAME under its supervisor with the plan's `cmd`, in one exec; returns its pid and
    identity (exe sha256, argv) once it has exec'd."""
    staged = layout.manager.stage(transport, layout, name, argv, sup)
    res = transport.run(cmd or layout.start_cmd(name, argv, sup), timeout=layout.manager.bound_s("start"))
    out = as_text(res.stdout)
    pid_ident = _pid_and_identity(transport.name, out, name)
    _unit_read_back(transport, layout, staged, out, name, units)
    return pid_ident


Verify = tuple[str, Mapping[str, str]]  # (release id, {relpath: sha256}) checked on the host first


def _verified(transport: Transport, verify: Verify | None, out: str, exit_status: int) -> int:
    """The gate's result: files verified, or ReleaseMismatch (the helper stopped nothing)."""
    if verify is None:
        return 0
    rid, expected = verify
    if exit_status == 3 and "verify=mismatch" in out:
        check_hash_output(expected, out, transport.name, f"releases/{rid}")  # raises with the differences
        raise ReleaseMismatch(f"{transport.name}: releases/{rid} does not match its manifest")
    return check_hash_output(expected, out, transport.name, f"releases/{rid}")


def restart_listening(
    transport: Transport,
    layout: HostLayout,
    name: str,
    links: tuple[str | None, str | None],
    address: str,
    port: int,
    argv: list[str],
    timeout_s: int = RPC_LISTEN_S,
    verify: Verify | None = None,
    sup: Sequence[str] = (),
    units: Units | None = None,
    cmd: Cmd | None = None,
) -> tuple[int, ProcIdentity, str, int]:
    """(Verify a present release,) stop NAME, switch links, start, wait until it listens and read
    its identity, in one exec; CheckFailed with the output tail if it died or never listened.
    Returns (pid, identity, what was stopped, files verified)."""
    staged = layout.manager.stage(transport, layout, name, argv, sup)
    cmd = cmd or layout.restart_cmd(
        name, links[0], links[1], address, port, timeout_s, argv, verify_release=verify[0] if verify else None, sup=sup
    )
    timeout = restart_bound_s(layout, timeout_s)
    res = transport.run(cmd, check=False, timeout=timeout, stdin=manifest_lines(verify[1]) if verify else None)
    out = as_text(res.stdout)
    verified = _verified(transport, verify, out, res.exit_status)
    if res.exit_status == 3 and "writable=no" in as_text(res.stderr):
        raise NotWritable(
            f"{transport.name}: {as_text(res.stderr).strip().removeprefix('pairctl-svc: writable=no: ')[-300:]}",
            hint=f"make the install root writable on {transport.name} (a read-only mount?), then run the command again",
        )
    if res.exit_status == 3 and "unit=" in as_text(res.stderr):
        complaints = "\n".join(ln for ln in out.splitlines() if ln.startswith("unit_verify="))
        raise HostError(
            f"{transport.name}: the {name} unit was refused before anything was stopped: "
            f"{as_text(res.stderr).strip()[-300:]}\n{complaints[-1500:]}"
        )
    if res.exit_status == 0:
        pid, ident = _pid_and_identity(transport.name, out, name)
        _unit_read_back(transport, layout, staged, out, name, units)
        stopped = next((line.split("=", 1)[1] for line in out.splitlines() if line.startswith("stopped=")), "")
        return pid, ident, stopped, verified
    if res.exit_status in (4, 5):
        what = "exited" if res.exit_status == 4 else f"did not listen on {address}:{port} within {timeout_s} s"
        raise CheckFailed(f"{transport.name}: {name} {what}; its output ends:\n{_tail(out)}")
    raise HostError(
        f"{transport.name}: pairctl-svc restart {name} failed (exit {res.exit_status}): "
        f"{as_text(res.stderr).strip()[-300:] or _tail(out)}"
    )


def stop(
    transport: Transport, layout: HostLayout, name: str, verify: Verify | None = None, cmd: Cmd | None = None
) -> tuple[str, int]:
    """Stop NAME (one exec); with `verify`, the release is checked first and nothing is stopped
    if it does not match. Returns (`stopped=NAME:PID|-`, files verified)."""
    res = transport.run(
        cmd or layout.stop_cmd(name, verify[0] if verify else None),
        check=False,
        timeout=layout.manager.bound_s("stop"),
        stdin=manifest_lines(verify[1]) if verify else None,
    )
    out = as_text(res.stdout)
    verified = _verified(transport, verify, out, res.exit_status)
    if res.exit_status != 0:
        raise HostError(
            f"{transport.name}: stopping {name} failed (exit {res.exit_status}): {as_text(res.stderr).strip()[-300:]}"
        )
    return next((line for line in out.splitlines() if line.startswith("stopped=")), out.strip()), verified


def _tail(text: str, n: int = 15) -> str:
    skip = ("died=", "timeout=", "stopped=", "current=", "previous=", "pid=")
    lines = [line for line in text.splitlines() if not line.startswith(skip)]
    return "\n".join("  " + line for line in lines[-n:]) or "  (no output)"


def process_alive(transport: Transport, pid: int, name: str) -> bool:
    """Over SFTP (no exec): /proc/PID/cmdline still names NAME."""
    try:
        cmdline = transport.read_bytes(f"/proc/{pid}/cmdline", max_bytes=HOST_FILE_MAX)
    except (FileNotFoundError, OSError):
        return False
    return argv0_is(cmdline, name)


def read_tail(transport: Transport, path: str, n: int = 25) -> str:
    try:
        data = transport.read_bytes(path, max_bytes=HOST_LOG_MAX)
    except (FileNotFoundError, OSError):
        return "  (no output file)"
    return _tail(data[-20000:].decode("utf-8", "replace"), n)


def wait_health(
    transport: Transport,
    layout: HostLayout,
    base_url: str,
    pid: int,
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.01,
    alive_every_s: float = 0.2,
    log: Any = None,
) -> WaitResult:
    """Poll `GET /health` until 200 (bounded); every `alive_every_s` ask the host whether the
    process still lives, so a server that died fails at once with its log tail, not at timeout."""
    t0 = time.monotonic()
    counters = {"polls": 0, "alive": 0}
    last_alive = [t0]

    def attempt(client: httpx.Client) -> None:
        counters["polls"] += 1
        try:
            r = client.get(base_url.rstrip("/") + "/health")
            if r.status_code == 200:
                return
            reason = f"HTTP {r.status_code}"
        except httpx.TransportError as exc:
            reason = type(exc).__name__
        now = time.monotonic()
        if now - last_alive[0] >= alive_every_s or counters["polls"] == 3:
            last_alive[0] = now
            counters["alive"] += 1
            if not process_alive(transport, pid, LLAMA_SERVER):
                log, out = files_of(transport, layout, LLAMA_SERVER, SERVER_LOG, LLAMA_SERVER + ".out")
                raise CheckFailed(
                    f"{transport.name}: llama-server (pid {pid}) exited before it was healthy; "
                    f"{log} ends:\n"
                    + read_tail(transport, log, 12)
                    + f"\nand {out} ends:\n"
                    + read_tail(transport, out, 6)
                    + "\n(kept as *.prev when the next start replaces them)"
                )
        raise _NotYet(reason)

    retry = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_NotYet),
        stop=tenacity.stop_after_delay(timeout_s),
        wait=tenacity.wait_fixed(poll_s),
        before_sleep=(
            lambda rs: log.debug(
                "health not yet", attempt=rs.attempt_number, reason=str(rs.outcome and rs.outcome.exception())
            )
        )
        if log
        else None,
        reraise=True,
    )
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        try:
            retry(attempt, client)
        except _NotYet as exc:
            (out,) = files_of(transport, layout, LLAMA_SERVER, LLAMA_SERVER + ".out")
            raise CheckFailed(
                f"{transport.name}: llama-server not healthy at {base_url} after {timeout_s:.0f} s ({exc}); "
                f"its output ends:\n" + read_tail(transport, out, 25)
            ) from None
    return WaitResult(time.monotonic() - t0, counters["polls"], counters["alive"])


class _NotYet(Exception):
    pass


def files_of(transport: Transport, layout: HostLayout, name: str, *files: str) -> list[str]:
    """NAME's FILES where this run of it keeps them (probes.service_dir), for a failure's log tails:
    run/'s where the host does not answer (read_tail then says there is no output file)."""
    try:
        d = service_dir(transport, layout.root, name)
    except OSError:
        d = layout.run
    return [posixpath.join(d, f) for f in files]


def get_json(
    base_url: str, path: str, *, api_key: str | None = None, timeout: float = 10.0, via: TcpOpener | None = None
) -> Any:
    """GET a llama-server JSON endpoint (Bearer key when the pair has one; with `via`, inside
    that SSH connection: orchestrator.server.tunnel)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_keepalive_connections=0)
    transport = ssh_http_transport(via, limits) if via is not None else None
    with httpx.Client(timeout=timeout, trust_env=False, transport=transport) as client:
        r = client.get(base_url.rstrip("/") + path, headers=headers)
    if r.status_code != 200:
        raise CheckFailed(f"GET {path}: HTTP {r.status_code}: {r.text[:200]}")
    return r.json()
