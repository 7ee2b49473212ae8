"""The service-manager protocol (hosts/managers), and what a manager reads of a host's layout:
named here, below hosts/layout.py, so the layout can carry a manager without a two-way import."""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from orchestrator.hosts.units import UnitReadback
    from orchestrator.remote.command import Cmd
    from orchestrator.remote.transport import Transport

Op = Literal["start", "stop", "restart"]


class HostPaths(Protocol):
    """The part of hosts/layout.py's HostLayout a manager uses."""

    @property
    def root(self) -> str: ...
    @property
    def run(self) -> str: ...
    @property
    def svc(self) -> str: ...
    @property
    def state(self) -> str | None: ...
    def log(self, name: str) -> str: ...
    def svc_cmd(self, sub: str, *args: str) -> Cmd: ...
    def units_cmd(self, *names: str) -> Cmd: ...
    def supervise_argv(self, name: str, argv: Sequence[str], sup: Sequence[str]) -> list[str]: ...


class ServiceManager(Protocol):
    """What a manager does for one host of a pair (hosts/managers/pairctl.py, systemd.py)."""

    @property
    def units(self) -> bool:
        """It installs a file per service the host checks: a rollback's facts step then installs
        the helper and checks the manager, as a deploy's prepare does."""

    def words(self, service: str) -> tuple[str, ...]:
        """The words `pairctl-svc start|restart` takes before the supervisor options."""

    def bound_s(self, op: Op) -> int:
        """The exec's own bound for OP (a restart's wait for the listener comes on top)."""

    def stage(
        self, t: Transport, layout: HostPaths, service: str, argv: Sequence[str], sup: Sequence[str]
    ) -> tuple[str, str] | None:
        """Before a start: the file it writes on the host for SERVICE, (its name, its text)."""

    def read_back(self, host: str, out: str, staged: tuple[str, str] | None) -> UnitReadback | None:
        """After a start: what the start's output says of the staged file (raises HostError)."""

    def check(self, t: Transport, layout: HostPaths, host: str) -> dict[str, Any]:
        """Before any change: the host's manager answers (receipt fields; raises HostStateError)."""

    def verify_staged(
        self, t: Transport, layout: HostPaths, host: str, service: str, argv: Sequence[str], sup: Sequence[str]
    ) -> str | None:
        """Before any change: what the start will install, staged and checked by the host."""

    def boot_after_start(self, t: Transport, layout: HostPaths, readback: UnitReadback | None) -> dict[str, object]:
        """After a start: what brings the service back at boot (`persistence`, `warning`)."""

    def boot_status(
        self, t: Transport, layout: HostPaths, service: str, host: str, *, running: bool, problems: MutableSequence[str]
    ) -> dict[str, object]:
        """`status`: what a reboot would bring back; what is down goes to PROBLEMS with its fix."""
