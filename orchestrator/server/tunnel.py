"""HTTP to llama-server carried inside the SSH connection pairctl already holds to the native host.

Over `http://` on a network the API key would cross it in cleartext. SSH's `direct-tcpip` channel
(what `ssh -L` uses) carries the request encrypted to the host key pairctl already checked; no port
opens on the operator's machine and nothing is installed on the host (its sshd must allow TCP
forwarding). The seam is httpcore's `NetworkBackend`: httpx keeps its HTTP handling, timeouts and
errors; only the byte stream comes from the channel.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import httpcore
import httpx


@runtime_checkable
class TcpOpener(Protocol):
    """What can open a byte stream to HOST:PORT as seen from a remote host (SshTransport)."""

    name: str

    def open_tcp(self, host: str, port: int, timeout: float | None) -> Any:
        """A socket-like channel (recv, sendall, settimeout, close); OSError when refused."""
        ...


def via_for(transport: object, api_key: object) -> TcpOpener | None:
    """The route for requests that carry `api_key`: the native host's SSH connection when there is
    a key and the transport is SSH (a local transport's server is on this machine: no network)."""
    if not api_key:
        return None
    return transport if isinstance(transport, TcpOpener) else None


_READ_ERRORS = (OSError, EOFError)  # paramiko's SSHException is an Exception; checked below by name


def _stream_error(exc: BaseException) -> bool:
    return isinstance(exc, _READ_ERRORS) or type(exc).__module__.startswith("paramiko")


class _ChannelStream(httpcore.NetworkStream):
    def __init__(self, channel: Any) -> None:
        self._ch = channel

    def _io(self, what: str, fn: Callable[[], Any], timeout: float | None, errors: tuple[type[Exception], ...]) -> Any:
        """`fn` on the channel; a timeout or a broken channel becomes httpcore's (timeout, error) of `what`."""
        try:
            self._ch.settimeout(timeout)
            return fn()
        except TimeoutError as exc:
            raise errors[0](str(exc) or f"{what} timed out") from None
        except Exception as exc:
            if _stream_error(exc):
                raise errors[1](f"{type(exc).__name__}: {exc}") from None
            raise

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return bytes(
            self._io("read", lambda: self._ch.recv(max_bytes), timeout, (httpcore.ReadTimeout, httpcore.ReadError))
        )

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._io("write", lambda: self._ch.sendall(buffer), timeout, (httpcore.WriteTimeout, httpcore.WriteError))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a channel of a dropped connection is not an error
            self._ch.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("TLS inside the SSH channel is not used")

    def get_extra_info(self, info: str) -> Any:
        return None  # no socket here; httpcore then never asks whether an idle connection is readable


class _ChannelBackend(httpcore.NetworkBackend):
    def __init__(self, opener: TcpOpener) -> None:
        self._opener = opener

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            return _ChannelStream(self._opener.open_tcp(host, port, timeout))
        except Exception as exc:
            if not _stream_error(exc):
                raise
            if getattr(exc, "code", None) == 1:  # SSH_OPEN_ADMINISTRATIVELY_PROHIBITED (RFC 4254)
                raise httpcore.ConnectError(
                    f"{self._opener.name}: its sshd refuses to forward to {host}:{port}; pairctl sends the API "
                    "key only through SSH: allow TCP forwarding for the login user (AllowTcpForwarding local)"
                ) from None
            raise httpcore.ConnectError(
                f"{host}:{port} as seen from {self._opener.name} (through SSH): {type(exc).__name__}: {exc}"
            ) from None


def ssh_http_transport(opener: TcpOpener, limits: httpx.Limits) -> httpx.HTTPTransport:
    """An httpx transport whose every connection is a `direct-tcpip` channel of `opener`."""
    t = httpx.HTTPTransport(limits=limits, trust_env=False)
    t._pool = httpcore.ConnectionPool(  # the one seam httpx leaves: its pool, given our network backend
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=_ChannelBackend(opener),
    )
    return t
