"""The two supervised services of a pair: their argv (pure) and start / stop / wait (executing).

`ggml-rpc-server` exits 0 on an unknown argument and on a failed bind, so it is judged alive
by its process living AND its address:port listening (`pairctl-svc wait-listen`, one round
trip that polls on the host). `llama-server` is judged by `/health` answering 200, polled
from here; a process that died meanwhile fails the wait at once with its log tail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import tenacity

from orchestrator.errors import CheckFailed, HostError
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, HostLayout

SERVER_LOG = "llama-server.log"


def rpc_server_argv(layout: HostLayout, package_id: str, *, bind: str, port: int) -> list[str]:
    """`ggml-rpc-server -H <bind> -p <port>` from the release's own path (argv[0] names the release)."""
    return [layout.binary(package_id, RPC_SERVER), "-H", bind, "-p", str(port)]


def llama_server_argv(layout: HostLayout, package_id: str, profile: Any, *, model_paths: dict[str, str],
                      host: str, port: int, rpc: list[str], with_api_key: bool) -> list[str]:
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


def _text(out: str | bytes) -> str:
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else out


def start(transport: Any, layout: HostLayout, name: str, argv: list[str]) -> int:
    res = transport.run(layout.start_cmd(name, argv), timeout=30)
    for line in _text(res.stdout).splitlines():
        if line.startswith("pid="):
            return int(line[4:])
    raise HostError(f"{transport.name}: pairctl-svc start {name} printed no pid: {_text(res.stdout)[:200]!r}")


def stop(transport: Any, layout: HostLayout, name: str) -> str:
    res = transport.run(layout.stop_cmd(name), timeout=60)
    return _text(res.stdout).strip()


def wait_listen(transport: Any, layout: HostLayout, name: str, address: str, port: int, timeout_s: int = 20) -> float:
    """Block (on the host) until NAME lives and listens on address:port; raise with its log if not."""
    t0 = time.monotonic()
    res = transport.run(layout.wait_listen_cmd(name, address, port, timeout_s), check=False, timeout=timeout_s + 15)
    out = _text(res.stdout)
    if res.exit_status == 0:
        return time.monotonic() - t0
    what = "exited" if res.exit_status == 4 else f"did not listen on {address}:{port} within {timeout_s} s"
    raise CheckFailed(f"{transport.name}: {name} {what}; its output ends:\n{_tail(out)}")


def _tail(text: str, n: int = 15) -> str:
    lines = [l for l in text.splitlines() if not l.startswith(("died=", "timeout="))]
    return "\n".join("  " + l for l in lines[-n:]) or "  (no output)"


def wait_health(transport: Any, layout: HostLayout, base_url: str, *, timeout_s: float = 60.0,
                poll_s: float = 0.02, alive_every_s: float = 0.5, log: Any = None) -> WaitResult:
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
            res = transport.run(layout.alive_cmd(LLAMA_SERVER), check=False, timeout=15)
            if res.exit_status != 0:
                tail = transport.run(layout.log_tail_cmd(SERVER_LOG, 25), check=False, timeout=15)
                raise CheckFailed(
                    f"{transport.name}: llama-server exited before it was healthy; {SERVER_LOG} ends:\n"
                    + _tail(_text(tail.stdout) or _text(res.stdout), 25)
                )
        raise _NotYet(reason)

    retry = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_NotYet),
        stop=tenacity.stop_after_delay(timeout_s),
        wait=tenacity.wait_fixed(poll_s),
        before_sleep=(lambda rs: log.debug("health not yet", attempt=rs.attempt_number,
                                           reason=str(rs.outcome.exception()))) if log else None,
        reraise=True,
    )
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        try:
            retry(attempt, client)
        except _NotYet as exc:
            tail = transport.run(layout.log_tail_cmd(SERVER_LOG, 25), check=False, timeout=15)
            raise CheckFailed(
                f"{transport.name}: llama-server not healthy at {base_url} after {timeout_s:.0f} s ({exc}); "
                f"{SERVER_LOG} ends:\n" + _tail(_text(tail.stdout), 25)
            ) from None
    return WaitResult(time.monotonic() - t0, counters["polls"], counters["alive"])


class _NotYet(Exception):
    pass


def get_json(base_url: str, path: str, *, api_key: str | None = None, timeout: float = 10.0) -> Any:
    """GET a llama-server JSON endpoint (Bearer key when the pair has one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        r = client.get(base_url.rstrip("/") + path, headers=headers)
    if r.status_code != 200:
        raise CheckFailed(f"GET {path}: HTTP {r.status_code}: {r.text[:200]}")
    return r.json()

