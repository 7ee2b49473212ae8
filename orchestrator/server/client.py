"""`ServerClient`: llama-server's HTTP API as pairctl uses it (httpx, explicit timeouts).

Every method returns a parsed model (see `models.py`), and keeps the raw JSON on request, so a
check can write the server's own words into its receipt. The API key travels only in the
`Authorization` header and is never logged or put in a repr.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchestrator.errors import HostError, PairctlError
from orchestrator.log import get_logger
from orchestrator.remote.command import Arg, Secret
from orchestrator.server import parsers
from orchestrator.server.models import CompletionResult, Props, ServerError, SlotState, StreamChunk
from orchestrator.server.tunnel import TcpOpener, ssh_http_transport

DEFAULT_TIMEOUT = 600.0


class ServerRequestError(PairctlError, RuntimeError):
    """llama-server answered with an error status; `error` is its parsed error object when it sent one."""

    def __init__(self, message: str, *, status: int, error: ServerError | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.body = body


class ServerUnreachable(HostError):
    """No HTTP answer at all (connection refused, reset, timeout)."""


class ServerStalled(ServerUnreachable):
    """The server answered nothing and showed no progress in `/slots` for the stall bound: it is
    hung or stopped (a slow server that keeps processing is not this)."""


class ServerTooSlow(ServerUnreachable):
    """A request kept making progress but did not finish within its bound, which was derived from
    the speed measured on this pair: the pair got much slower than it measured."""


# Requests that run the model: the ones a progress watch follows.
MODEL_PATHS = frozenset({"/completion", "/completions", "/v1/completions", "/v1/chat/completions", "/chat/completions"})


# What `ProgressWatch.alive` returns: per service (name, pid, state, CPU ticks), or None (unknown)
Liveness = tuple[tuple[str, int, str, int], ...]


@dataclass(frozen=True)
class ProgressWatch:
    """How a model request is judged alive while it runs: `/slots` is read every `poll_s`; a change
    in a slot's task, prompt tokens processed or tokens decoded is progress; none for `stall_s`
    fails the request (`why` says where `stall_s` came from).

    `/slots` is silent during a batch, so `alive` (the services' CPU time) is the finer signal:
    neither moving for `idle_s` (a SIGSTOPped or deadlocked server) fails the request however long
    a batch may take. A None reading changes nothing (the counters are cumulative). With no reading
    for `idle_s`, `stall_s` is held to `blind_s` or `blind_factor` times the longest silence seen
    between `/slots` moves (`gaps`, shared by the suite's requests), whichever is more: safe, as a
    batch costs at most a bounded multiple of the one before it at the same lanes."""

    stall_s: float
    poll_s: float = 1.0
    why: str = ""
    alive: Callable[[], Liveness | None] | None = None
    idle_s: float | None = None
    idle_why: str = ""
    blind_s: float | None = None
    blind_factor: float = 1.0
    gaps: list[float] = field(default_factory=list)

    def blind_stall_s(self) -> float:
        """The stall bound while no CPU-time reading is known (see the class note)."""
        if self.blind_s is None:
            return self.stall_s
        return round(min(self.stall_s, max(self.blind_s, self.blind_factor * max(self.gaps, default=0.0))), 1)


def _read_alive(watch: ProgressWatch) -> Liveness | None:
    """The services' CPU time now, or None when there is no reader or the hosts did not answer."""
    if watch.alive is None:
        return None
    try:
        return watch.alive()
    except Exception:  # an unreadable host is no sign either way: /slots and stall_s still judge
        return None


def _fresh(watch: ProgressWatch, read_at: float | None, now: float) -> bool:
    """A CPU-time reading came within the idle bound: the liveness signal is there to judge by."""
    return read_at is not None and now - read_at <= (watch.idle_s or watch.stall_s)


def _stopped(seen: Liveness | None) -> bool:
    """A service in state T or t (stopped) computes nothing, whatever CPU time the other spends: the
    RPC server finishing its batch is work a stopped llama-server never collects, not progress."""
    return any(st in ("T", "t") for _n, _pid, st, _t in seen or ())


def _ticks(seen: Liveness | None) -> dict[str, int]:
    return {f"{n}:{pid}": t for n, pid, _st, t in seen or ()}


def progress_signature(slots: list[dict[str, Any]]) -> tuple[Any, ...]:
    """What changes in `/slots` while a server works: per slot its task, whether it processes,
    prompt tokens processed so far and tokens decoded (llama-server updates these between batches)."""
    sig = []
    for s in slots:
        nt = s.get("next_token")
        decoded = nt[0].get("n_decoded") if isinstance(nt, list) and nt and isinstance(nt[0], dict) else None
        sig.append((s.get("id"), s.get("id_task"), s.get("is_processing"), s.get("n_prompt_tokens_processed"), decoded))
    return tuple(sig)


def _secret_text(value: Arg | None) -> str | None:
    """The plain text of an API key given as str or as a `Secret`."""
    return value.value if isinstance(value, Secret) else value


@dataclass
class StreamHandle:
    """A streaming completion in progress; `close()` drops the connection (the server cancels)."""

    chunks_seen: list[StreamChunk] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() each chunk was read
    started_at: float = 0.0
    closed_at: float | None = None
    _response: httpx.Response | None = None

    def close(self) -> None:
        if self._response is not None and self.closed_at is None:
            self._response.close()
            self.closed_at = time.monotonic()

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks_seen for t in c.tokens]

    @property
    def content(self) -> str:
        return "".join(c.content for c in self.chunks_seen)


class ServerClient:
    """A llama-server's HTTP endpoint. With `via` (the native host's SSH transport) every request
    travels inside that SSH connection, so the API key never crosses the network in cleartext."""

    def __init__(
        self,
        base_url: str,
        api_key: Arg | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        via: TcpOpener | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        headers = {}
        key = _secret_text(api_key)
        if key:
            headers["Authorization"] = "Bearer " + key
        # No keep-alive: llama-server (cpp-httplib) closes idle connections after 5 s, and a request
        # sent on a connection it is closing comes back as "disconnected without a response".
        limits = httpx.Limits(max_keepalive_connections=0)
        self.via = via.name if via is not None else None
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            limits=limits,
            trust_env=False,
            transport=ssh_http_transport(via, limits) if via is not None else None,
        )  # the pair is reached directly, never through a proxy (as deploy's verify)
        self.retries: list[str] = []  # requests retried once after a dropped connection (for the receipt)
        self.watch: ProgressWatch | None = None  # set by acceptance once the pair's speed is measured

    def __repr__(self) -> str:
        return f"ServerClient({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------
    def _request(self, method: str, path: str, *, json: Any = None, timeout: float | None = None) -> httpx.Response:
        t = timeout if timeout is not None else self.timeout
        if self.watch is not None and method == "POST" and path in MODEL_PATHS:
            return self._watched(self.watch, method, path, json, t)
        return self._send(method, path, json, t)

    def _watched(self, watch: ProgressWatch, method: str, path: str, json: Any, timeout: float) -> httpx.Response:
        """The request in a worker thread, judged by progress while it runs (see ProgressWatch) and
        ended within `timeout`; a stalled request is abandoned, so a hung server fails in the stall
        bound, not the total one."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["response"] = self._send(method, path, json, timeout)
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=work, daemon=True, name=f"pairctl {method} {path}").start()
        last = busy = time.monotonic()  # last /slots progress; last sign of work (/slots or CPU time)
        sig: tuple[Any, ...] | None = None
        cpu = _read_alive(watch)  # the baseline: CPU time that moves from here on is work
        cpu_ticks = _ticks(cpu)
        read_at = last if cpu is not None else None  # when the services' CPU time was last read
        while not done.wait(watch.poll_s):
            now = time.monotonic()
            stall_s = watch.stall_s if _fresh(watch, read_at, now) else watch.blind_stall_s()
            bound = stall_s - (now - last)
            if watch.idle_s is not None:  # back within idle_s to judge a reading (or one late by a busy host)
                bound = min(bound, watch.idle_s - (now - busy) if cpu is not None else watch.idle_s)
            try:  # llama-server answers /slots between batches: this waits out a long batch, bounded
                slots = self.slots_raw(timeout=max(1.0, bound))
            except ServerRequestError as exc:
                if exc.status == 501:  # --no-slots: nothing to watch; the total bound still holds
                    done.wait()
                    break
                slots = None
            except ServerUnreachable:
                slots = None
            seen = _read_alive(watch)  # after /slots, so a batch that kept /slots silent is seen working
            now = time.monotonic()
            # None (a host slow to answer) teaches and forgets nothing: the counters are cumulative
            if seen is not None:
                if (cpu is None or _ticks(seen) != cpu_ticks) and not _stopped(seen):  # moved, or the first reading
                    busy = now
                cpu, cpu_ticks, read_at = seen, _ticks(seen), now
            if isinstance(slots, list):
                cur = progress_signature(slots)
                if cur != sig:
                    if sig is not None:  # a whole silence between two moves: an honest batch's length
                        watch.gaps[:] = [max([now - last, *watch.gaps])]
                    sig, last, busy = cur, now, now
            idle = watch.idle_s is not None and read_at is not None and read_at - busy > watch.idle_s
            stall_s = watch.stall_s if _fresh(watch, read_at, now) else watch.blind_stall_s()
            if now - last > stall_s or idle:
                if idle:
                    procs = ", ".join(f"{n} pid {pid} state {st}" for n, pid, st, _t in cpu or ())
                    what = (f"and no CPU time used by {procs} for {now - busy:.0f} s; bound {watch.idle_s:.0f} s"
                            f"{': ' + watch.idle_why if watch.idle_why else ''}")  # fmt: skip
                else:
                    why = (
                        watch.why
                        if stall_s == watch.stall_s
                        else (
                            f"no CPU-time reading of the services, so {watch.blind_s:g} s or {watch.blind_factor:g} "
                            f"x the longest silence between batches seen ({max(watch.gaps, default=0.0):.1f} s)"
                        )
                    )
                    what = f"; bound {stall_s:.0f} s{': ' + why if why else ''}"
                raise ServerStalled(
                    f"{method} {self.base_url}{path}: stopped making progress for {now - last:.0f} s "
                    f"(no prompt-processing or generated token in /slots {what})",
                    hint="the server is hung or stopped: look at its log and process state",
                )
        err = box.get("error")
        if isinstance(err, ServerUnreachable) and "timed out" in str(err) and sig is not None:
            raise ServerTooSlow(
                f"{method} {self.base_url}{path}: still making progress but not done within {timeout:.0f} s, "
                f"the bound derived from this pair's measured speed",
                hint="the pair became much slower than it measured at the start of acceptance "
                "(machine load?); declare slower floors in the profile's `speed` if this is normal",
            )
        if err is not None:
            raise err
        response: httpx.Response = box["response"]  # set by work() whenever it set no error
        return response

    def _send(self, method: str, path: str, json: Any, t: float) -> httpx.Response:
        try:
            try:
                r = self._http.request(method, path, json=json, timeout=t)
            except httpx.RemoteProtocolError as exc:
                # dropped before any response: sent again once and counted (every request only reads)
                self.retries.append(f"{method} {path}: {exc}")
                get_logger(server=self.base_url).warning(
                    "request retried after a dropped connection", path=path, error=str(exc)
                )
                r = self._http.request(method, path, json=json, timeout=t)
        except httpx.TimeoutException as exc:
            raise ServerUnreachable(f"{method} {self.base_url}{path}: timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code >= 400:
            raise _http_error(f"{method} {self.base_url}{path}", r, with_type=True)
        return r

    def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        return self._request("GET", path, timeout=timeout).json()

    def post_json(self, path: str, body: dict[str, Any], *, timeout: float | None = None) -> Any:
        """Any JSON endpoint (`/v1/completions`, `/v1/chat/completions`, `/apply-template`): the raw answer."""
        return self._request("POST", path, json=body, timeout=timeout).json()

    def stream_events(self, path: str, body: dict[str, Any], *, timeout: float | None = None) -> list[dict[str, Any]]:
        """A streaming POST to any JSON endpoint (`/v1/chat/completions` with `stream: true`): every
        event's JSON object, in order, read to the end of the stream."""
        with self._stream(path, body, timeout) as r:
            return list(parsers.parse_sse_events(r.iter_lines()))
        raise AssertionError  # unreachable: the stream either returns or raises

    @contextmanager
    def _stream(
        self, path: str, body: dict[str, Any], timeout: float | None, closed: Callable[[], bool] = lambda: False
    ) -> Iterator[httpx.Response]:
        """A streaming POST, open: an HTTP error answer raises ServerRequestError, a timeout or a
        broken connection ServerUnreachable, unless `closed()` says we dropped it on purpose."""
        where = f"POST {self.base_url}{path} (stream)"
        try:
            with self._http.stream(
                "POST", path, json=body, timeout=timeout if timeout is not None else self.timeout
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _http_error(where, r, with_type=False)
                yield r
        except httpx.TimeoutException as exc:
            raise ServerUnreachable(f"{where}: timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            if not closed():
                raise ServerUnreachable(f"{where}: {type(exc).__name__}: {exc}") from None

    # -- endpoints ----------------------------------------------------------------
    def health(self, *, timeout: float = 5.0) -> bool:
        """True when `/health` is 200 (model loaded); False on 503 (loading) or no answer."""
        try:
            r = self._http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def props_raw(self) -> dict[str, Any]:
        return _json_object(self.get_json("/props"), "/props")

    def props(self) -> Props:
        return parsers.parse_props(self.props_raw())

    def slots_raw(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        data = self.get_json("/slots", timeout=timeout)
        if not isinstance(data, list):
            raise parsers.ParseError(f"/slots: expected a JSON list, got {type(data).__name__}")
        return data

    def slots(self, *, timeout: float | None = None) -> list[SlotState]:
        return parsers.parse_slots(self.slots_raw(timeout=timeout))

    def metrics_text(self) -> str:
        return self._request("GET", "/metrics").text

    def metrics(self) -> dict[str, float]:
        return parsers.parse_metrics(self.metrics_text())

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return parsers.parse_tokenize(
            self._request("POST", "/tokenize", json={"content": text, "add_special": add_special}).json()
        )

    def detokenize(self, tokens: list[int]) -> str:
        return parsers.parse_detokenize(self._request("POST", "/detokenize", json={"tokens": tokens}).json())

    @staticmethod
    def completion_body(prompt: str | list[int], n_predict: int, **params: Any) -> dict[str, Any]:
        """The request body; greedy and token-returning unless the caller says otherwise."""
        body: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "return_tokens": True}
        body.update(params)
        return body

    def completion_raw(
        self, prompt: str | list[int], n_predict: int, *, timeout: float | None = None, **params: Any
    ) -> dict[str, Any]:
        body = self.completion_body(prompt, n_predict, **params)
        body["stream"] = False
        return _json_object(self._request("POST", "/completion", json=body, timeout=timeout).json(), "/completion")

    def completion(
        self, prompt: str | list[int], n_predict: int, *, timeout: float | None = None, **params: Any
    ) -> CompletionResult:
        """`POST /completion` (non-streaming). `prompt` as text, or as token ids for an exact length."""
        return parsers.parse_completion(self.completion_raw(prompt, n_predict, timeout=timeout, **params))

    @contextmanager
    def stream_completion(
        self, prompt: str | list[int], n_predict: int, *, timeout: float | None = None, **params: Any
    ) -> Iterator[tuple[StreamHandle, Iterator[StreamChunk]]]:
        """Streaming `/completion`: yields `(handle, chunks)`. Stop iterating and call
        `handle.close()` to drop the connection mid-generation (the server then cancels the task)."""
        body = self.completion_body(prompt, n_predict, **params)
        body["stream"] = True
        handle = StreamHandle(started_at=time.monotonic())
        with self._stream("/completion", body, timeout, lambda: handle.closed_at is not None) as r:
            handle._response = r

            def chunks() -> Iterator[StreamChunk]:
                for chunk in parsers.parse_sse_lines(r.iter_lines()):
                    handle.chunks_seen.append(chunk)
                    handle.arrivals.append(time.monotonic())
                    yield chunk

            yield handle, chunks()
            handle.close()


def _http_error(where: str, r: httpx.Response, *, with_type: bool) -> ServerRequestError:
    """An error answer: the server's error object (its type too, `with_type`), else its text."""
    err = parsers.parse_error(r.content)
    what = (f"{err.type}: {err.message}" if with_type else err.message) if err else r.text[:300]
    return ServerRequestError(
        f"{where}: HTTP {r.status_code}: {what}", status=r.status_code, error=err, body=r.text[:4000]
    )


def _json_object(data: Any, what: str) -> dict[str, Any]:
    """A decoded answer that must be a JSON object (the host is untrusted input)."""
    if not isinstance(data, dict):
        raise parsers.ParseError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data
