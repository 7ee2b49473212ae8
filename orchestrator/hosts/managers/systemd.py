"""systemd as the service manager: each service's supervisor runs as an enabled unit
(hosts/units.py renders and reads them back), staged on the host and checked by its own
`systemd-analyze verify` before anything is stopped; the manager itself (its scope, version
and, for a user manager, lingering) is checked before any change."""

from __future__ import annotations

import posixpath
import re
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.config.inventory import Supervision
from orchestrator.errors import DiskFull, HostError, HostStateError
from orchestrator.hosts import boot
from orchestrator.hosts.root_trust import put_new
from orchestrator.hosts.space import NotWritable, refuses_writes
from orchestrator.hosts.units import Scope, UnitReadback, check_readback, parse_readback, render_unit, unit_name
from orchestrator.remote.result import as_text
from orchestrator.roles import LLAMA_SERVER, RPC_SERVER

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory
    from orchestrator.hosts.managers.base import HostPaths
    from orchestrator.remote.transport import Transport

MIN_SYSTEMD = 240  # StandardOutput=append: in pairctl's units
# An exec runs up to ~13 systemctl calls (30 s each) and one verify (30 s): its bound covers their
# sum, so pairctl never gives up on a step the host is still doing.
_BOUND_S = {"start": 480, "stop": 200, "restart": 480}


@dataclass(frozen=True)
class SystemdManager:
    """A host whose supervisors run as systemd units: the manager's scope, the pair (in the unit
    names) and, for llama-server on a host it shares with ggml-rpc-server, the unit to start after."""

    scope: Scope
    pair: str
    root: str
    supervision: Supervision
    after: str | None = None
    units = True

    @property
    def user(self) -> bool:
        return self.scope == "user"

    def unit(self, service: str) -> str:
        return unit_name(self.pair, service, self.root)

    def words(self, service: str) -> tuple[str, ...]:
        """The `systemd=SCOPE:UNIT` word `pairctl-svc start|restart` takes."""
        return (f"systemd={self.scope}:{self.unit(service)}",)

    def bound_s(self, op: Literal["start", "stop", "restart"]) -> int:
        return _BOUND_S[op]

    def staged_unit(self, layout: HostPaths, service: str) -> str:
        """Where deploy puts SERVICE's rendered unit for `pairctl-svc` to verify and install."""
        return posixpath.join(layout.run, "units", self.unit(service))

    def stage(
        self, t: Transport, layout: HostPaths, service: str, argv: Sequence[str], sup: Sequence[str]
    ) -> tuple[str, str]:
        """SERVICE's supervisor unit rendered here and put on the host (run/units/UNIT, by rename)."""
        text = render_unit(
            pair=self.pair,
            service=service,
            exec_argv=layout.supervise_argv(service, argv, sup),
            root=layout.root,
            supervision=self.supervision,
            after=self.after if service == LLAMA_SERVER else None,
            user=self.user,
            state=layout.state,
        )
        path = self.staged_unit(layout, service)
        t.makedirs(posixpath.dirname(path), 0o755)
        put_new(t, text.encode(), path, 0o644)  # exclusive per-run temp name: never written through a link
        return self.unit(service), text

    def read_back(self, host: str, out: str, staged: tuple[str, str] | None) -> UnitReadback | None:
        """The unit on the host is the one staged, enabled and active (hosts/units.py)."""
        return check_readback(host, out, *staged) if staged else None

    def check(self, t: Transport, layout: HostPaths, host: str) -> dict[str, Any]:
        """The manager must answer before anything is stopped, or the start after the stop (and
        the rollback's) would fail and leave the pair down."""
        res = t.run_idempotent(layout.svc_cmd("systemd-check", self.scope), check=False, timeout=120)
        out, err = as_text(res.stdout), as_text(res.stderr).strip()
        if res.exit_status != 0:
            user = "the host's user" if self.user else ""
            raise HostStateError(
                f"{host}: the inventory says service_manager: systemd ({self.scope} scope), but "
                f"{err.removeprefix('pairctl-svc: ')[-300:] or f'systemd-check exited {res.exit_status}'}; "
                "nothing was changed",
                hint=(
                    f"start {user}'s manager without a login: `loginctl enable-linger USER` on the host"
                    if user
                    else "install systemd, or set service_manager: pairctl for this host"
                ),
            )
        version = next((ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("systemd=")), "?")[:80]
        major = re.match(r"^(?:user|system):(\d+)", version)
        if major is None or int(major.group(1)) < MIN_SYSTEMD:
            raise HostStateError(
                f"{host}: systemd {version.split(':', 1)[-1]} is older than {MIN_SYSTEMD} or unknown; its units "
                f"need StandardOutput=append: (systemd {MIN_SYSTEMD}); nothing was changed",
                hint="set service_manager: pairctl for this host (its own supervisor and an @reboot line)",
            )
        linger = next((ln for ln in out.splitlines() if ln.startswith("linger=")), "")
        if self.user and not linger.endswith(":yes"):
            who = linger.removeprefix("linger=").rsplit(":", 1)[0] or "USER"
            raise HostStateError(
                f"{host}: {who}'s systemd user manager does not linger, so it (and every unit in it) stops "
                "when that user's last login session ends, pairctl's own SSH session included; nothing was changed",
                hint=f"run `loginctl enable-linger {who}` on the host (as root), or use systemd_scope: system",
            )
        return {"systemd": version}

    def verify_staged(
        self, t: Transport, layout: HostPaths, host: str, service: str, argv: Sequence[str], sup: Sequence[str]
    ) -> str:
        """The unit this run's start will install, staged and checked by the host's own
        `systemd-analyze verify` now: one it rejects refuses the run with nothing changed, as does a
        run/ that takes no new file (the unit, its record, pidfiles and logs go there: the runtime
        dir a read-only run/ leaves to pairctl's own supervisor is no place for a unit's files)."""
        try:
            unit, _ = self.stage(t, layout, service, argv, sup)
        except (HostError, OSError) as exc:
            said = str(getattr(exc, "message", exc))
            if isinstance(exc, DiskFull) or not (getattr(exc, "write_refused", False) or refuses_writes(said)):
                raise
            raise NotWritable(
                f"{host}: {layout.run} takes no new file ({said[-200:]}), and {self.unit(service)} writes there "
                "(the staged unit, its record, pidfiles and logs); nothing was changed",
                hint=f"make {layout.run} writable on {host} (a read-only mount? `mount`), then run the command again",
            ) from None
        res = t.run(layout.svc_cmd("unit-verify", service, f"{self.scope}:{unit}"), check=False, timeout=120)
        if res.exit_status != 0:
            complaints = "; ".join(
                ln.removeprefix("unit_verify=")
                for ln in as_text(res.stdout).splitlines()
                if ln.startswith("unit_verify=")
            )
            raise HostStateError(
                f"{host}: {unit} was refused by the host before any change: "
                f"{as_text(res.stderr).strip().removeprefix('pairctl-svc: ')[-300:]}"
                + (f" ({complaints[-600:]})" if complaints else "")
                + "; nothing was changed",
                hint="set service_manager: pairctl for this host if its systemd cannot run pairctl's units",
            )
        return unit

    def boot_after_start(self, t: Transport, layout: HostPaths, readback: UnitReadback | None) -> dict[str, object]:
        """The unit the start enabled and read back (a user manager without lingering is a
        warning); a crontab line left from when this root ran without systemd goes."""
        out: dict[str, object] = {"persistence": None, "warning": "no boot persistence: no unit read back"}
        if readback is not None:  # a start on this host always reads its unit back (services.start)
            out = readback.boot()
        try:
            out["crontab_line"] = boot.remove_entry(t, layout)
        except (HostError, OSError) as exc:
            out["crontab_line"] = f"not checked: {str(exc)[:200]}"
        return out

    def boot_status(
        self,
        t: Transport,
        layout: HostPaths,
        service: str,
        host: str,
        *,
        running: bool,
        problems: MutableSequence[str],
    ) -> dict[str, object]:
        """SERVICE's unit read back (one exec). A pair with a current release whose unit is missing
        or not active is a problem (a failed unit: systemd's start limit was hit)."""
        res = t.run_idempotent(layout.units_cmd(service), check=False, timeout=120)
        rb = parse_readback(as_text(res.stdout))
        unit = self.unit(service)
        if rb is None or rb.sha256 is None or rb.unit != unit:
            if rb is not None and rb.sha256 is not None:
                problems.append(
                    f"{host}: run/{service}.unit names {rb.unit}, not {unit}; a deploy or rollback replaces it"
                )
            elif running:
                problems.append(
                    f"{host}: the inventory says service_manager: systemd, but {unit} is not installed; "
                    "a deploy or rollback installs it"
                )
            return {"persistence": None, "unit": unit, "starts_at_boot": False}
        if running and rb.source not in (None, "ok:none:no"):
            problems.append(
                f"{host}: {unit} as systemd runs it is not the file pairctl installed (source {rb.source}: "
                "fragment, drop-ins, pending reload); `systemctl cat` on the host shows what overrides it"
            )
        if running and rb.active == "-":
            problems.append(f"{host}: no systemd {self.scope} manager answers for {unit}")
        elif running and rb.active != "active":
            problems.append(f"{host}: {unit} is {rb.active} (systemctl{' --user' if rb.user else ''} status {unit})")
        return {**rb.boot(), "starts_at_boot": rb.starts_at_boot}


def for_host(inventory: Inventory, pair_name: str, role: str) -> SystemdManager:
    """llama-server's unit is ordered after ggml-rpc-server's when both run under one manager
    (same address, port, user and scope)."""
    p = inventory.pair(pair_name)
    spec = inventory.host(p.native if role == "native" else p.rpc)
    rpc = inventory.host(p.rpc)
    same = (rpc.service_manager, rpc.systemd_scope, rpc.address, rpc.port, rpc.user)
    after = None
    if role == "native" and same == ("systemd", spec.systemd_scope, spec.address, spec.port, spec.user):
        after = unit_name(pair_name, RPC_SERVER, rpc.install_root)
    return SystemdManager(spec.systemd_scope, pair_name, spec.install_root, inventory.supervision, after)
