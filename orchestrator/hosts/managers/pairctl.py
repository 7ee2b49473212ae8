"""pairctl's own supervisor as the service manager: `pairctl-svc` starts each supervisor under
setsid (it outlives the SSH login) and one @reboot crontab line per install root starts them
again at boot (hosts/boot.py). Nothing is written or checked before a start."""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.errors import HostError
from orchestrator.hosts import boot

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory
    from orchestrator.hosts.managers.base import HostPaths
    from orchestrator.remote.transport import Transport

_BOUND_S = {"start": 30, "stop": 60, "restart": 60}


class PairctlSupervisor:
    units = False

    def words(self, *_: object) -> tuple[str, ...]:
        return ()

    def bound_s(self, op: Literal["start", "stop", "restart"]) -> int:
        return _BOUND_S[op]

    def stage(self, *_: object) -> None:  # nothing to write: the start's own argv is all
        return None

    def read_back(self, *_: object) -> None:
        return None

    def check(self, *_: object) -> dict[str, Any]:
        return {}

    def verify_staged(self, *_: object) -> None:
        return None

    def boot_after_start(self, t: Transport, layout: HostPaths, *_: object) -> dict[str, object]:
        """The host's @reboot line for its root (the start left the service's arguments in
        run/NAME.boot); a host without crontab keeps a running pair, with the reason recorded."""
        try:
            return boot.ensure_entry(t, layout)
        except (HostError, OSError) as exc:  # the host stopped answering: the next step finds out too
            return {"persistence": None, "warning": f"no boot persistence: {str(exc)[:300]}"}

    def boot_status(
        self, t: Transport, layout: HostPaths, service: str, host: str, *, running: bool, problems: MutableSequence[str]
    ) -> dict[str, object]:
        return {**boot.read_entry(t, layout), "starts_at_boot": t.stat(layout.log(service + ".boot")) is not None}


PAIRCTL = PairctlSupervisor()


def for_host(inventory: Inventory, pair_name: str, role: str) -> PairctlSupervisor:
    return PAIRCTL
