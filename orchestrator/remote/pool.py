"""How to get a transport for an inventory host, and a pool of them (one SSH connection per host)
for one run, closed at its end. Kept apart from `transport.py` so that the implementations
import the contract and nothing imports them back.
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

from orchestrator.config.inventory import Inventory
from orchestrator.log import get_logger
from orchestrator.remote.local import LocalTransport
from orchestrator.remote.transport import RetryPolicy, Transport


def open_transport(
    inventory: Inventory,
    host_name: str,
    *,
    retry: RetryPolicy | None = None,
    connect_timeout_s: float | None = None,
    ssh_config_path: str | Path | None = None,
) -> Transport:
    """A transport for `host_name`: SSH (lazy connect; the keywords go to it) or local."""
    spec = inventory.host(host_name)
    if spec.transport == "local":
        return LocalTransport(host_name)
    # paramiko and fabric load only when a host is reached over SSH (start-up time)
    from orchestrator.remote.ssh import DEFAULT_CONNECT_TIMEOUT_S, SshTransport

    return SshTransport.from_inventory(
        inventory,
        host_name,
        retry=retry,
        ssh_config_path=ssh_config_path,
        connect_timeout_s=connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S,
    )


class TransportPool:
    """One transport per host for a whole run; `with TransportPool(inv) as pool: pool.get(h)`."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        retry: RetryPolicy | None = None,
        connect_timeout_s: float | None = None,
        ssh_config_path: str | Path | None = None,
    ) -> None:
        self.inventory = inventory
        self._open = partial(
            open_transport, inventory, retry=retry, connect_timeout_s=connect_timeout_s, ssh_config_path=ssh_config_path
        )
        self._by_host: dict[str, Transport] = {}
        self._lock = threading.Lock()

    def get(self, host_name: str) -> Transport:
        with self._lock:
            t = self._by_host.get(host_name)
            if t is None:
                t = self._by_host[host_name] = self._open(host_name)
            return t

    __getitem__ = get

    def stats(self) -> dict[str, dict[str, float]]:
        return {h: t.stats.as_dict() for h, t in self._by_host.items()}

    def close(self) -> None:
        with self._lock:
            for t in self._by_host.values():
                try:
                    t.close()
                except Exception:  # closing must not hide the run's own outcome
                    get_logger(host=t.name).warning("close failed", exc_info=True)
            self._by_host.clear()

    def __enter__(self) -> TransportPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
