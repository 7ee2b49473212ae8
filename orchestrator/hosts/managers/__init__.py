"""The service-manager seam: what runs a host's supervisors, and brings them back at boot.

One module per manager (`pairctl`: setsid and crontab lines; `systemd`: an enabled unit per
service), as pyinfra adds an init system: callers use the manager a host's layout carries and
never ask which one it is. `manager_for` is the one place that reads `service_manager`; a new
manager is a new module and its line in `MANAGERS`. The supervisor loop is the same under all.
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
