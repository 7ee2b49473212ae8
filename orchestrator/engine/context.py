"""What one run carries between the engine's modules, split by who owns it.

`RunInputs` (frozen): what the operator and inventory asked. `HostState`: what the run found on the
hosts (facts, compare-and-swap base, leases, identities); steps run on both hosts at once, so it
changes only through its methods, under its lock. `RunRecorder`: what the run observed, with its own
lock. `RunEnv` (frozen): the three, connections and journal, handed to each executor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import RouteProfile
from orchestrator.engine.plan import PairView, Prepared
from orchestrator.errors import PairctlError
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.leases import Lease, new_nonce
from orchestrator.hosts.probes import HostFacts, ProcIdentity
from orchestrator.hosts.route import RouteRecord
from orchestrator.paths import Home
from orchestrator.remote.transport import Transport

if TYPE_CHECKING:  # the journal module imports the evidence store, which the engine only types against
    from structlog.stdlib import BoundLogger

    from orchestrator.evidence.journal import Journal
    from orchestrator.evidence.store import EvidenceStore


class Pool(Protocol):
    """One transport per host for the whole run (TransportPool, or the deploy benchmark's counting wrapper)."""

    def get(self, host_name: str) -> Transport: ...

    def stats(self) -> dict[str, dict[str, Any]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    """Deploy's switches: acceptance off, a subset of checks, the kernel check before the switch."""

    skip_accept: bool = False
    checks: tuple[str, ...] = ()
    kernel_check: bool = False
    restore_record: RouteRecord | None = None  # qualify's restore: the record to put back as found
    restore_previous_links: tuple[str | None, str | None] | None = None  # ... and the `previous` links

    @property
    def accepts_fully(self) -> bool:
        """The whole acceptance suite runs: only then is the pair `active` (accepted) in its
        route record; `--skip-accept` or a partial `--checks` leaves it identity-verified."""
        from orchestrator.checks.suite import CHECKS  # the suite imports the engine's identity probe

        return not self.skip_accept and (not self.checks or set(CHECKS) <= set(self.checks))


@dataclass(frozen=True)
class RunInputs:
    """What the run was asked to do; fixed from the start."""

    home: Home
    inventory: Inventory
    view: PairView
    run_id: str
    package_ids: tuple[str, str] | None = None  # deploy only
    profile: RouteProfile | None = None  # deploy only
    options: RunOptions = RunOptions()
    held_lease_nonce: str | None = field(default=None, repr=False)  # the caller holds the leases (qualify)
    route_key: bytes = field(default=b"", repr=False)  # signs the route records this run writes
    evidence_head: str | None = None  # the pair's newest receipt when this run began (anchored in the route)
    evidence_home: str | None = None  # whose chain that is: this home's id (evidence/team.py)

    @property
    def lease_held_by_caller(self) -> bool:
        """Renew the caller's lease, never release it."""
        return self.held_lease_nonce is not None


class HostState:
    """What the run found on the hosts and holds there; every change goes through a method."""

    def __init__(self, held_lease_nonce: str | None = None) -> None:
        self._lock = threading.Lock()
        self._facts: dict[str, HostFacts] = {}
        self._route_bytes: dict[str, bytes | None] = {}
        self._wrote_route = False
        self._leases: dict[str, Lease] = {}
        self._identities: dict[str, ProcIdentity] = {}
        self._deferred: dict[str, tuple[str, dict[str, str]]] = {}
        self._lease_nonce = held_lease_nonce

    # facts and the compare-and-swap base
    def found(self, role: str, facts: HostFacts) -> None:
        with self._lock:
            self._facts[role] = facts
            self._route_bytes[role] = facts.route_bytes

    @property
    def facts(self) -> Mapping[str, HostFacts]:
        with self._lock:
            return dict(self._facts)

    def route_bytes(self, role: str) -> bytes | None:
        with self._lock:
            return self._route_bytes.get(role)

    def route_written(self, role: str, data: bytes) -> None:
        with self._lock:
            self._route_bytes[role] = data
            self._wrote_route = True

    def route_seen(self, role: str, data: bytes) -> None:
        """Another writer's record, re-read after a refused compare-and-swap: the next base."""
        with self._lock:
            self._route_bytes[role] = data

    def wrote_route(self) -> bool:
        """This run wrote a route record on a host (a back-out then writes one in any case)."""
        with self._lock:
            return self._wrote_route

    # leases
    def lease_nonce(self) -> str:
        """One nonce for both hosts' leases, made on first use (or the caller's, when it holds them)."""
        with self._lock:
            if self._lease_nonce is None:
                self._lease_nonce = new_nonce()
            return self._lease_nonce

    def lease_taken(self, role: str, lease: Lease) -> None:
        with self._lock:
            self._leases[role] = lease

    def lease_released(self, role: str) -> None:
        with self._lock:
            self._leases.pop(role, None)

    @property
    def leases(self) -> Mapping[str, Lease]:
        with self._lock:
            return dict(self._leases)

    # what runs
    def started(self, role: str, ident: ProcIdentity) -> None:
        with self._lock:
            self._identities[role] = ident

    def identity(self, role: str) -> ProcIdentity | None:
        with self._lock:
            return self._identities.get(role)

    def forget_identities(self) -> None:
        with self._lock:
            self._identities.clear()

    # a release already present, verified by the host's first exec before it stops anything
    def defer(self, role: str, release: str, hashes: dict[str, str]) -> None:
        with self._lock:
            self._deferred[role] = (release, hashes)

    def take_deferred(self, role: str) -> tuple[str, dict[str, str]] | None:
        with self._lock:
            return self._deferred.pop(role, None)


class RunRecorder:
    """What the run observed, for its result and failure paths: timings, uploads, whether a change
    began, the roles whose links it switched, the room each route record had. Under locks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._room_lock = threading.Lock()  # held while one host's step probes; the other waits
        self._timings: dict[str, float] = {}
        self._uploads: dict[str, dict[str, Any]] = {}
        self._changed = False
        self._switched: set[str] = set()
        self._room: dict[str, PairctlError | None] = {}
        self._prepared: Prepared | None = None

    def timed(self, key: str, seconds: float) -> None:
        with self._lock:
            self._timings[key] = self._timings.get(key, 0.0) + seconds

    def uploaded(self, role: str, report: dict[str, Any]) -> None:
        with self._lock:
            self._uploads[role] = report

    def timings(self) -> dict[str, float]:
        with self._lock:
            return dict(self._timings)

    def uploads(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._uploads)

    @property
    def changed(self) -> bool:
        """A step that changes what runs has begun: a failure from here may leave the pair half-changed."""
        with self._lock:
            return self._changed

    def set_changed(self, changed: bool) -> None:
        with self._lock:
            self._changed = changed

    def switched(self, role: str) -> None:
        """This run switched `role`'s links (to a release it activates, not back)."""
        with self._lock:
            self._switched.add(role)

    def switched_roles(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._switched)

    def prepared(self, prep: Prepared) -> None:
        """What preflight decided (once, before the plan is made)."""
        with self._lock:
            self._prepared = prep

    @property
    def prep(self) -> Prepared | None:
        with self._lock:
            return self._prepared

    def room_once(self, key: str, probe: Callable[[], None]) -> None:
        """`probe` runs once per key (the other host's step waits); what it raised is raised to both steps."""
        with self._room_lock:
            if key not in self._room:
                try:
                    probe()
                    self._room[key] = None
                except PairctlError as exc:
                    self._room[key] = exc
            err = self._room[key]
        if err is not None:
            raise err


@dataclass(frozen=True)
class RunEnv:
    """What every executor gets beside its plan step. Frozen: what a step does is on the step;
    what the run finds goes to `hosts` and `recorder`, through their methods."""

    inputs: RunInputs
    pool: Pool
    journal: Journal
    log: BoundLogger
    evidence: EvidenceStore | None = None
    hosts: HostState = field(default_factory=HostState)
    recorder: RunRecorder = field(default_factory=RunRecorder)

    # read-through to the inputs (checks/kernels.py's deploy step reads these too)
    @property
    def home(self) -> Home:
        return self.inputs.home

    @property
    def inventory(self) -> Inventory:
        return self.inputs.inventory

    @property
    def view(self) -> PairView:
        return self.inputs.view

    @property
    def run_id(self) -> str:
        return self.inputs.run_id

    @property
    def lease_held_by_caller(self) -> bool:
        return self.inputs.lease_held_by_caller

    def t(self, role: str) -> Transport:
        return self.pool.get(self.view.hosts[role])

    def layout(self, role: str) -> HostLayout:
        return self.view.layouts[role]

    def host(self, role: str) -> str:
        return self.view.hosts[role]

    def timed(self, key: str, seconds: float) -> None:
        self.recorder.timed(key, seconds)
