"""The runner's PairDriver on the real deploy engine.

Each arm is a full `engine.deploy.deploy` (stop, switch, start, verify identity, route record
by compare-and-swap; rolled back by the engine itself if any of it fails), with acceptance
skipped: qualification measures, acceptance is its own command. Every deploy writes its own
receipt on the pair's chain; the qualification receipt names each one in its arm step. For
that reason the qualification receipt is not on the pair's chain (the engine takes the
chain's lock for each deploy); it records the pair in `qualify_pair`.

Restore = a deploy of the route record's active entry as found at the start (packages and the
exact profile), then the route record and running identities read back and compared.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.profiles import RouteProfile
from orchestrator.engine.plan import pair_view
from orchestrator.errors import CheckFailed, ConfigError, LeaseHeldError, PairctlError
from orchestrator.hashing import sha256_json
from orchestrator.hosts.layout import SERVICE_OF_ROLE
from orchestrator.hosts.probes import read_facts
from orchestrator.hosts.route import parse_route
from orchestrator.log import get_logger
from orchestrator.paths import Home
from orchestrator.qualify.runner import ActiveArm, ArmPackages


def _text(out: str | bytes) -> str:
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else out


def parse_vmhwm(status_text: str) -> int | None:
    """Peak resident set (`VmHWM:  1234 kB` in /proc/PID/status) in bytes; None if absent."""
    for line in status_text.splitlines():
        if line.startswith("VmHWM:"):
            parts = line.split()
            if len(parts) >= 3 and parts[1].isdigit() and parts[2] == "kB":
                return int(parts[1]) * 1024
    return None


class EngineDriver:
    def __init__(self, home: Home, inventory: Any, pair: str, *, argv: list[str], busy_wait_s: float = 300.0,
                 busy_poll_s: float = 2.0) -> None:
        from orchestrator.remote.transport import TransportPool

        self.home, self.inventory, self.pair = home, inventory, pair
        self.view = pair_view(inventory, pair)
        self.pool = TransportPool(inventory)
        self.argv = argv
        self.busy_wait_s, self.busy_poll_s = busy_wait_s, busy_poll_s
        self.log = get_logger(pair=pair, command="qualify")
        self._tmp = tempfile.TemporaryDirectory(prefix="pairctl-qualify-")
        self.deploy_receipts: list[str] = []
        self._api_key = None
        spec = inventory.pair(pair)
        if spec.api_key_file:
            for line in Path(spec.api_key_file).read_text().splitlines():
                if line.strip():
                    self._api_key = line.strip()
                    break

    # -- reading the pair ----------------------------------------------------------------------
    def _facts(self, role: str) -> Any:
        return read_facts(self.pool.get(self.view.hosts[role]), self.view.layouts[role], (SERVICE_OF_ROLE[role],))

    def _route(self) -> Any:
        return parse_route(self._facts("native").route_bytes)

    def _pid(self, role: str) -> int | None:
        return self._facts(role).running.get(SERVICE_OF_ROLE[role])

    def snapshot(self) -> dict[str, Any]:
        rec = self._route()
        if rec is None or rec.active is None:
            raise ConfigError(
                f"pair {self.pair} has no active route record; qualification restores the pair afterwards, "
                "so it needs a deployed pair to start from",
                hint=f"pairctl deploy --pair {self.pair} --packages NATIVE RPC",
            )
        a = rec.active
        return {"native": a.native_package, "rpc": a.rpc_package, "profile": a.profile, "profile_sha256": a.profile_sha256,
                "argv_sha256": a.argv_sha256, "route_revision": rec.revision}

    # -- activating ----------------------------------------------------------------------------
    def _profile_file(self, profile: dict[str, Any]) -> str:
        p = Path(self._tmp.name) / f"profile-{sha256_json(profile)[:16]}.yaml"
        p.write_text(yaml.safe_dump(profile, sort_keys=True))
        return str(p)

    def _deploy(self, native: str, rpc: str, profile: dict[str, Any], why: str) -> Any:
        """One engine deploy. A pair busy with another run (its evidence chain or a host lease
        held) refuses before anything changes, so waiting and trying again is safe; every wait
        is logged, and after `busy_wait_s` the refusal stands."""
        from orchestrator.engine.deploy import deploy

        deadline = time.monotonic() + self.busy_wait_s
        attempt = 0
        while True:
            attempt += 1
            try:
                res = deploy(self.home, self.inventory, self.pair, (native, rpc), profile_name=self._profile_file(profile),
                             skip_accept=True, argv=[*self.argv, f"({why})"], pool=self.pool)
                break
            except LeaseHeldError as exc:  # EvidenceBusy is one too
                if time.monotonic() >= deadline:
                    raise
                self.log.warning("pair busy; waiting to deploy", why=why, attempt=attempt, error=str(exc).splitlines()[0])
                time.sleep(self.busy_poll_s)
        self.deploy_receipts.append(res.receipt)
        return res

    def activate(self, packages: ArmPackages, profile: RouteProfile) -> ActiveArm:
        from orchestrator.server.client import ServerClient

        res = self._deploy(packages.native, packages.rpc, profile.model_dump(mode="json"), "qualify arm")
        client = ServerClient(self.view.base_url, api_key=self._api_key)
        props = client.props()
        pids = {role: self._pid(role) for role in ("native", "rpc")}
        identity = {"deploy_receipt": res.receipt, "build_info": props.build_info, "total_slots": props.total_slots,
                    "n_ctx_per_slot": props.n_ctx_per_slot, "pids": pids, "active": res.active and {
                        k: res.active[k] for k in ("native_package", "rpc_package", "profile_sha256", "argv_sha256")}}
        return ActiveArm(client=client, identity=identity, per_slot_ctx=props.n_ctx_per_slot, memory=self._memory_probe(pids))

    def _memory_probe(self, pids: dict[str, int | None]):
        """Peak RSS (VmHWM) of llama-server + ggml-rpc-server: on CPU hosts that is where the
        weights and KV live. A GPU host's peak VRAM needs nvidia-smi sampling (not done here)."""

        def probe() -> tuple[int | None, str]:
            total, parts = 0, []
            for role, pid in pids.items():
                if pid is None:
                    return None, f"{role}: no pid"
                t = self.pool.get(self.view.hosts[role])
                # over SFTP (no process started on the host); reading /proc this way works
                peak = parse_vmhwm(_text(t.read_bytes(f"/proc/{pid}/status")))
                if peak is None:
                    return None, f"{role}: no VmHWM"
                total += peak
                parts.append(f"{role}={peak}")
            return total, "VmHWM " + " ".join(parts)

        return probe

    # -- restoring -----------------------------------------------------------------------------
    def restore(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        res = self._deploy(snapshot["native"], snapshot["rpc"], snapshot["profile"], "qualify restore")
        rec = self._route()
        a = rec.active if rec else None
        seen = {"native": a and a.native_package, "rpc": a and a.rpc_package, "profile_sha256": a and a.profile_sha256,
                "argv_sha256": a and a.argv_sha256}
        want = {k: snapshot[k] for k in seen}
        if seen != want:
            raise CheckFailed(f"after restore the route record names {seen}, expected {want}")
        return {"deploy_receipt": res.receipt, "route_revision": rec.revision, **seen}

    def close(self) -> None:
        try:
            self.pool.close()
        finally:
            self._tmp.cleanup()


__all__ = ["EngineDriver", "parse_vmhwm", "PairctlError"]
