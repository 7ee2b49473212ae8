"""The service-manager seam: what runs a host's supervisors, and brings them back at boot.

One module per manager (`pairctl`: setsid and an @reboot crontab line; `systemd`: an enabled
unit per service), each a class with the operations below, as pyinfra adds an init system: the
engine, `status` and the host commands call the manager a host's layout carries and never ask
which one it is. `manager_for` is the one place that reads the inventory's `service_manager`;
a new manager is a new module here and its line in `MANAGERS`.

The supervisor loop itself (`pairctl-svc supervise`) is the same under every manager; a manager
decides how it is started (the words `pairctl-svc start|restart` take), how long a start, stop or
restart exec may take, what it writes before a start and checks before any change, and how a
reboot brings the service back (recorded after a start, read back by `status`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.hosts.managers import pairctl, systemd
from orchestrator.hosts.managers.base import HostPaths as HostPaths
from orchestrator.hosts.managers.base import ServiceManager as ServiceManager

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory

# service_manager (config/inventory.py) -> the manager of ROLE's host of a pair
MANAGERS: dict[str, Callable[[Inventory, str, str], ServiceManager]] = {
    "pairctl": pairctl.for_host,
    "systemd": systemd.for_host,
}


def manager_for(inventory: Inventory, pair_name: str, role: str) -> ServiceManager:
    """The one place the inventory's choice of manager is read."""
    p = inventory.pair(pair_name)
    return MANAGERS[inventory.host(p.native if role == "native" else p.rpc).service_manager](inventory, pair_name, role)
