"""A test-only third service manager (an init script per service): the whole of what adding a
manager takes, a class with the protocol's operations and its `for_host`. The seam test
registers it and runs the plan and the host commands with it; mypy --strict checks it against
`ServiceManager`, so an operation the protocol gains and this lacks fails the test."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.hosts.managers import HostPaths, ServiceManager
from orchestrator.hosts.managers.base import Op
from orchestrator.hosts.units import UnitReadback
from orchestrator.remote.transport import Transport


class InitScripts:
    units = True

    def words(self, service: str) -> tuple[str, ...]:
        return (f"initd=/etc/init.d/{service}",)

    def bound_s(self, op: Op) -> int:
        return {"start": 11, "stop": 12, "restart": 13}[op]

    def stage(
        self, t: Transport, layout: HostPaths, service: str, argv: Sequence[str], sup: Sequence[str]
    ) -> tuple[str, str]:
        return f"/etc/init.d/{service}", "#!/bin/sh\nexec " + " ".join(layout.supervise_argv(service, argv, sup))

    def read_back(self, host: str, out: str, staged: tuple[str, str] | None) -> None:
        return None

    def check(self, t: Transport, layout: HostPaths, host: str) -> dict[str, Any]:
        return {"initd": "checked"}

    def verify_staged(
        self, t: Transport, layout: HostPaths, host: str, service: str, argv: Sequence[str], sup: Sequence[str]
    ) -> str:
        return self.stage(t, layout, service, argv, sup)[0]

    def boot_after_start(self, t: Transport, layout: HostPaths, readback: UnitReadback | None) -> dict[str, object]:
        return {"persistence": "initd"}

    def boot_status(
        self, t: Transport, layout: HostPaths, service: str, host: str, *, running: bool, problems: MutableSequence[str]
    ) -> dict[str, object]:
        if running:
            problems.append(f"{host}: /etc/init.d/{service} is not enabled; `update-rc.d {service} enable` enables it")
        return {"persistence": None, "starts_at_boot": False}


def for_host(inventory: Inventory, pair_name: str, role: str) -> ServiceManager:
    return InitScripts()
