"""The runner's PairDriver on the real deploy engine. Each arm is a full engine deploy (rolled
back by the engine on failure) without acceptance, writing its own receipt on the pair's chain.
Restore is a deploy of the active entry found at the start that writes the route record as found
(previous pair, profiles, states), then read back and compared. The pair's leases are held for
the whole run and renewed by each deploy, so no other deploy lands between two arms."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from orchestrator.config.profiles import RouteProfile
from orchestrator.engine.plan import pair_view
from orchestrator.errors import CheckFailed, ConfigError, LeaseHeldError, PairctlError
from orchestrator.hashing import sha256_json
from orchestrator.hosts.layout import SERVICE_OF_ROLE
from orchestrator.hosts.probes import HostFacts, read_facts
from orchestrator.hosts.route import RouteRecord, parse_route
from orchestrator.log import get_logger
from orchestrator.paths import Home
from orchestrator.qualify.runner import ActiveArm, ArmPackages
from orchestrator.roles import ROLES, Role


def pair_memory(samples: dict[str, dict[str, Any]]) -> tuple[int | None, str]:
    """The pair's memory, summed over one telemetry sample per host: GPU memory in use (nvidia-smi,
    all GPUs) where there are GPUs, else the service's VmHWM; the source names what each gave."""
    total, parts = 0, []
    for role, s in samples.items():
        if s.get("gpus"):
            used = sum(g["used_mib"] for g in s["gpus"]) * 1024 * 1024
            parts.append(f"{role}=nvidia-smi:{used}")
        elif s.get("vm_hwm_kib") is not None:
            used = s["vm_hwm_kib"] * 1024
            parts.append(f"{role}=VmHWM:{used}")
        else:
            return None, f"{role}: no GPU memory and no running service to read"
        total += used
    return total, " ".join(parts)


if TYPE_CHECKING:
    from orchestrator.engine.deploy import RunResult

T = TypeVar("T")

QUALIFY_LEASE_TTL_S = 2 * 3600  # renewed by every arm's deploy; a killed run's hold ends by then


class EngineDriver:
    def __init__(
        self,
        home: Home,
        inventory: Any,
        pair: str,
        *,
        argv: list[str],
        busy_wait_s: float = 300.0,
        busy_poll_s: float = 2.0,
    ) -> None:
        from orchestrator.remote.pool import TransportPool

        self.home, self.inventory, self.pair = home, inventory, pair
        self.view = pair_view(inventory, pair)
        self.pool = TransportPool(inventory)
        self.argv = argv
        self.busy_wait_s, self.busy_poll_s = busy_wait_s, busy_poll_s
        self.log = get_logger(pair=pair, command="qualify")
        self._tmp = tempfile.TemporaryDirectory(prefix="pairctl-qualify-")
        self.deploy_receipts: list[str | None] = []
        self._lease_nonce: str | None = None
        self._deploys_started = 0
        self._found: Any = None  # the route record as the snapshot found it: restored exactly
        self._found_links: tuple[str | None, str | None] | None = None  # ... and the `previous` links
        key = inventory.api_key(pair)
        self._api_key = key.value if key else None

    # -- reading the pair ----------------------------------------------------------------------
    def _facts(self, role: Role) -> HostFacts:
        return read_facts(self.pool.get(self.view.hosts[role]), self.view.layouts[role], (SERVICE_OF_ROLE[role],))

    def _route(self) -> RouteRecord | None:
        return parse_route(self._facts("native").route_bytes)

    def _pid(self, role: Role) -> int | None:
        return self._facts(role).running.get(SERVICE_OF_ROLE[role])

    def snapshot(self) -> dict[str, Any]:
        rec = self._route()
        if rec is None or rec.active is None:
            raise ConfigError(
                f"pair {self.pair} has no active route record; qualification restores the pair afterwards, "
                "so it needs a deployed pair to start from",
                hint=f"pairctl deploy --pair {self.pair} --packages NATIVE RPC",
            )
        self._found = rec
        self._found_links = (self._facts("native").previous, self._facts("rpc").previous)
        a = rec.active
        found = {k: getattr(a, k) for k in ("profile", "profile_sha256", "argv_sha256")}
        return {"native": a.native_package, "rpc": a.rpc_package, **found, "route_revision": rec.revision}

    # -- holding the pair ----------------------------------------------------------------------
    def _wait_busy(self, what: str, attempt_fn: Callable[[], T]) -> T:
        """Run `attempt_fn` until the pair is not busy (refused before anything changes, so a retry
        is safe); every wait is logged, and after `busy_wait_s` the refusal stands."""
        deadline = time.monotonic() + self.busy_wait_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return attempt_fn()
            except LeaseHeldError as exc:  # EvidenceBusy is one too
                if time.monotonic() >= deadline:
                    raise
                self.log.warning("pair busy; waiting", what=what, attempt=attempt, error=str(exc).splitlines()[0])
                time.sleep(self.busy_poll_s)

    @contextmanager
    def hold(self, run_id: str) -> Iterator[Any]:
        """Both hosts' leases for run `run_id`, from snapshot to restore (a busy pair is waited
        for). Released on exit unless kept (an arm's failed rollback, or a stop after a deploy
        began: `lease release --dead-run` frees them); a failed release is recorded, not raised."""
        with self._held_leases(run_id, "qualify", QUALIFY_LEASE_TTL_S, keep_after_deploy=True) as held:
            yield held

    @contextmanager
    def _held_leases(self, run_id: str, verb: str, ttl_s: float, *, keep_after_deploy: bool) -> Iterator[Any]:
        """How a run over many deploys holds the pair (qualify, bisect): both leases under `pairctl
        VERB PAIR (run RUN_ID)`, their nonce renewed by the deploys; with `keep_after_deploy`, kept
        when the run stops after a deploy began."""
        from orchestrator.hosts import leases

        targets = leases.targets_of(self.inventory, self.pool, self.pair)
        with ExitStack() as stack:
            purpose = f"pairctl {verb} {self.pair} (run {run_id})"
            owner = leases.default_owner()
            held = self._wait_busy(
                "lease",
                lambda: stack.enter_context(
                    leases.hold_pair_leases(
                        targets, owner=owner, purpose=purpose, ttl_s=ttl_s, record_release_error=True
                    )
                ),
            )
            self._lease_nonce, deploys_before = held.nonce, self._deploys_started
            try:
                yield held
            except BaseException as exc:
                if keep_after_deploy and held.kept is None and self._deploys_started != deploys_before:
                    held.keep(
                        f"the run stopped with {type(exc).__name__} after a deploy began; after checking "
                        f"the pair, `pairctl lease release {self.pair} --dead-run {run_id}`"
                    )
                raise
            finally:
                self._lease_nonce = None

    # -- activating ----------------------------------------------------------------------------
    def _profile_file(self, profile: dict[str, Any]) -> str:
        p = Path(self._tmp.name) / f"profile-{sha256_json(profile)[:16]}.yaml"
        p.write_text(yaml.safe_dump(profile, sort_keys=True))
        return str(p)

    def _deploy(
        self,
        native: str,
        rpc: str,
        profile: dict[str, Any] | str,
        why: str,
        restore_record: Any = None,
        links: Any = None,
        *,
        checks: tuple[str, ...] | None = None,
    ) -> RunResult:
        """One engine deploy under this run's held leases (renewed, not taken or released), of the
        profile `profile` (its body, or a name); acceptance only with `checks` (all when empty)."""
        from orchestrator.engine.deploy import deploy

        self._deploys_started += 1
        res = self._wait_busy(
            why,
            lambda: deploy(
                self.home,
                self.inventory,
                self.pair,
                (native, rpc),
                profile_name=profile if isinstance(profile, str) else self._profile_file(profile),
                skip_accept=checks is None,
                checks=checks or (),
                argv=[*self.argv, f"({why})"],
                pool=self.pool,
                held_lease_nonce=self._lease_nonce,
                restore_record=restore_record,
                restore_previous_links=links,
            ),
        )
        self.deploy_receipts.append(res.receipt)
        return res

    def activate(self, packages: ArmPackages, profile: RouteProfile) -> ActiveArm:
        from orchestrator.server.client import ServerClient

        res = self._deploy(packages.native, packages.rpc, profile.model_dump(mode="json"), "qualify arm")
        from orchestrator.server.tunnel import via_for

        via = via_for(self.pool.get(self.view.hosts["native"]), self._api_key)  # the key only inside SSH
        client = ServerClient(self.view.base_url, api_key=self._api_key, via=via)
        props = client.props()
        pids: dict[str, int | None] = {role: self._pid(role) for role in ROLES}
        served = {k: getattr(props, k) for k in ("build_info", "total_slots", "n_ctx_per_slot")}
        active = res.active and {
            k: res.active[k] for k in ("native_package", "rpc_package", "profile_sha256", "argv_sha256")
        }
        identity = {"deploy_receipt": res.receipt, **served, "pids": pids, "active": active}
        memory = self._memory_probe(pids)
        return ActiveArm(client=client, identity=identity, per_slot_ctx=props.n_ctx_per_slot, memory=memory)

    def _memory_probe(self, pids: dict[str, int | None]) -> Callable[[], tuple[int | None, str]]:
        """After each measured request: `pair_memory` of one telemetry sample per host, whose pids
        must still be the ones the arm started with."""
        from orchestrator.checks.telemetry import parse_sample, sample_cmd
        from orchestrator.hosts.probes import service_dir

        dirs: dict[str, str] = {}  # each pid file's folder, resolved once for the arm (only a start moves it)

        def probe() -> tuple[int | None, str]:
            samples = {}
            for role, pid in pids.items():
                t, root = self.pool.get(self.view.hosts[role]), self.view.layouts[role].root
                d = dirs.get(role) or dirs.setdefault(role, service_dir(t, root, SERVICE_OF_ROLE[role]))
                s = parse_sample(t.run(sample_cmd(root, role, d), check=False, timeout=30).stdout)
                if s.get("pid") != pid:
                    return None, f"{role}: {SERVICE_OF_ROLE[role]} is pid {s.get('pid')}, the arm started pid {pid}"
                samples[role] = s
            return pair_memory(samples)

        return probe

    # -- restoring -----------------------------------------------------------------------------
    def restore(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        # the record as found, not a new deploy's: a later rollback returns to what was previous before
        pkgs = (snapshot["native"], snapshot["rpc"])
        res = self._deploy(*pkgs, snapshot["profile"], "qualify restore", self._found, self._found_links)
        rec = self._route()
        a = rec.active if rec else None
        fields = (("native", "native_package"), ("rpc", "rpc_package"), ("profile_sha256",) * 2, ("argv_sha256",) * 2)
        seen = {k: a and getattr(a, attr) for k, attr in fields}
        want, re_rendered = restore_expectation(snapshot, res.active)
        if seen != want:
            raise CheckFailed(f"after restore the route record names {seen}, expected {want}")
        return {"deploy_receipt": res.receipt, "route_revision": rec.revision if rec else None, **seen, **re_rendered}

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self._tmp.cleanup()


def restore_expectation(
    snapshot: dict[str, Any], rendered: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the route record must name after a restore, and what was rendered anew: the snapshot's
    packages, and the profile/argv hashes the restore's deploy rendered and verified (`rendered`):
    a record by an older pairctl may hash differently now. Moved hashes are returned for the receipt."""

    want = {"native": snapshot["native"], "rpc": snapshot["rpc"]}
    moved: dict[str, Any] = {}
    for key in ("profile_sha256", "argv_sha256"):
        now = (rendered or {}).get(key) or snapshot[key]
        want[key] = now
        if now != snapshot[key]:
            moved[key] = {"found": snapshot[key], "rendered": now}
    return want, ({"re_rendered": moved} if moved else {})


__all__ = ["EngineDriver", "pair_memory", "PairctlError", "restore_expectation"]
