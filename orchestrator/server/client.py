"""`ServerClient`: llama-server's HTTP API as pairctl uses it (httpx, explicit timeouts).

Every method returns a parsed model (see `models.py`), and keeps the raw JSON on request, so a
check can write the server's own words into its receipt. The API key travels only in the
`Authorization` header and is never logged or put in a repr.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchestrator.errors import HostError, PairctlError
from orchestrator.log import get_logger
from orchestrator.server import parsers
from orchestrator.server.models import CompletionResult, Props, ServerError, SlotState, StreamChunk

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


def _secret_text(value: Any) -> str | None:
    """The plain text of an API key given as str or as a Secret-like object."""
    if value is None:
        return None
    for attr in ("reveal", "get_secret_value"):
        fn = getattr(value, attr, None)
        if callable(fn):
            return str(fn())
    for attr in ("value", "secret"):
        v = getattr(value, attr, None)
        if isinstance(v, str):
            return v
    return str(value)


@dataclass
class StreamHandle:
    """A streaming completion in progress; `close()` drops the connection (the server cancels)."""

    chunks_seen: list[StreamChunk] = field(default_factory=list)
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
    """A llama-server's HTTP endpoint. `base_url` like `http://127.0.0.2:8080`."""

    def __init__(self, base_url: str, api_key: Any = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        headers = {}
        key = _secret_text(api_key)
        if key:
            headers["Authorization"] = "Bearer " + key
        # No keep-alive: llama-server (cpp-httplib) closes idle connections after 5 s, and a request
        # sent on a connection it is closing comes back as "disconnected without a response".
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_keepalive_connections=0),
            trust_env=False,
        )  # the pair is reached directly, never through a proxy (as deploy's verify)
        self.retries: list[str] = []  # requests retried once after a dropped connection (for the receipt)

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
        try:
            try:
                r = self._http.request(method, path, json=json, timeout=t)
            except httpx.RemoteProtocolError as exc:
                # the connection dropped before any response: the request is sent again once, on a
                # new connection, and counted (every request pairctl sends only reads the server)
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
            err = parsers.parse_error(r.content)
            what = f"{err.type}: {err.message}" if err else r.text[:300]
            raise ServerRequestError(
                f"{method} {self.base_url}{path}: HTTP {r.status_code}: {what}",
                status=r.status_code,
                error=err,
                body=r.text[:4000],
            )
        return r

    def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        return self._request("GET", path, timeout=timeout).json()

    def post_json(self, path: str, body: dict[str, Any], *, timeout: float | None = None) -> Any:
        """Any JSON endpoint (`/v1/completions`, `/v1/chat/completions`, `/apply-template`): the raw answer."""
        return self._request("POST", path, json=body, timeout=timeout).json()

    # -- endpoints ----------------------------------------------------------------
    def health(self, *, timeout: float = 5.0) -> bool:
        """True when `/health` is 200 (model loaded); False on 503 (loading) or no answer."""
        try:
            r = self._http.get("/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def wait_healthy(self, *, within_s: float = 60.0, interval_s: float = 0.05) -> float:
        """Poll `/health` until 200; returns seconds waited. Raises ServerUnreachable after `within_s`."""
        t0 = time.monotonic()
        while True:
            if self.health(timeout=min(5.0, within_s)):
                return time.monotonic() - t0
            if time.monotonic() - t0 > within_s:
                raise ServerUnreachable(f"{self.base_url}/health not ready within {within_s:.0f} s")
            time.sleep(interval_s)

    def props_raw(self) -> dict[str, Any]:
        return self.get_json("/props")

    def props(self) -> Props:
        return parsers.parse_props(self.props_raw())

    def slots_raw(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        return self.get_json("/slots", timeout=timeout)

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
        return self._request("POST", "/completion", json=body, timeout=timeout).json()

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
        try:
            with self._http.stream(
                "POST", "/completion", json=body, timeout=timeout if timeout is not None else self.timeout
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    err = parsers.parse_error(r.content)
                    raise ServerRequestError(
                        f"POST {self.base_url}/completion (stream): HTTP {r.status_code}: "
                        f"{err.message if err else r.text[:300]}",
                        status=r.status_code,
                        error=err,
                        body=r.text[:4000],
                    )
                handle._response = r

                def chunks() -> Iterator[StreamChunk]:
                    for chunk in parsers.parse_sse_lines(r.iter_lines()):
                        handle.chunks_seen.append(chunk)
                        yield chunk

                yield handle, chunks()
                handle.close()
        except httpx.TimeoutException as exc:
            raise ServerUnreachable(
                f"POST {self.base_url}/completion (stream): timed out ({type(exc).__name__})"
            ) from None
        except httpx.TransportError as exc:
            if handle.closed_at is not None:
                return
            raise ServerUnreachable(f"POST {self.base_url}/completion (stream): {type(exc).__name__}: {exc}") from None
