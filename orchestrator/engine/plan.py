"""Planning: a playbook plus what the hosts look like -> the concrete steps, each on a named
host with what it will do. Pure: `--dry-run` prints exactly this, and tests check it with no
host at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.engine.playbook import ACTIONS, Playbook
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, HostLayout
from orchestrator.hosts.probes import HostFacts
from orchestrator.hosts.units import SystemdUnits, unit_name
from orchestrator.roles import ROLES


@dataclass(frozen=True)
class Step:
    """One planned step: which playbook step, on which hosts, doing what."""

    name: str
    action: str
    role: str  # native | rpc | both | local
    hosts: tuple[str, ...]  # inventory host names ("local" for the operator machine)
    on_failure: str
    changes: bool
    description: str
    argv: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per host, where one command says it

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "action": self.action,
            "role": self.role,
            "hosts": list(self.hosts),
            "on_failure": self.on_failure,
            "changes": self.changes,
            "description": self.description,
            "argv": {h: list(a) for h, a in self.argv.items()},
        }


@dataclass(frozen=True)
class PairView:
    """The pair as the plan needs it: host names, layouts, binds, ports (from the inventory)."""

    name: str
    hosts: Mapping[str, str]  # role -> host name
    layouts: Mapping[str, HostLayout]  # role -> layout
    rpc_bind: str
    rpc_port: int
    server_bind: str
    server_port: int
    base_url: str
    has_api_key: bool


@dataclass(frozen=True)
class Activation:
    """What a plan activates (deploy) or restores (rollback): package ids and exact argv."""

    native_package: str
    rpc_package: str
    native_argv: tuple[str, ...]
    rpc_argv: tuple[str, ...]
    label: str = ""


def systemd_units(inventory: Inventory, pair_name: str, role: str) -> SystemdUnits | None:
    """How ROLE's host of the pair runs its supervisor: None (setsid, @reboot line) or as a
    systemd unit; llama-server's unit is ordered after ggml-rpc-server's when both run under one
    manager (same address, port, user and scope)."""
    p = inventory.pair(pair_name)
    spec = inventory.host(p.native if role == "native" else p.rpc)
    if spec.service_manager != "systemd":
        return None
    after = None
    rpc = inventory.host(p.rpc)
    same = (rpc.service_manager, rpc.systemd_scope, rpc.address, rpc.port, rpc.user)
    if role == "native" and same == ("systemd", spec.systemd_scope, spec.address, spec.port, spec.user):
        after = unit_name(pair_name, RPC_SERVER, rpc.install_root)
    return SystemdUnits(
        scope=spec.systemd_scope,
        pair=pair_name,
        root=spec.install_root,
        supervision=inventory.supervision,
        after=after,
    )


def pair_view(inventory: Inventory, pair_name: str) -> PairView:
    p = inventory.pair(pair_name)
    hosts = {"native": p.native, "rpc": p.rpc}
    layouts = {
        role: HostLayout(inventory.host(h).install_root, systemd_units(inventory, pair_name, role))
        for role, h in hosts.items()
    }
    server_bind = inventory.server_bind(pair_name)
    reach = inventory.host(p.native).address if server_bind in ("0.0.0.0", "::", "") else server_bind
    reach = f"[{reach}]" if ":" in reach else reach
    return PairView(
        name=pair_name,
        hosts=hosts,
        layouts=layouts,
        rpc_bind=inventory.rpc_bind(pair_name),
        rpc_port=p.rpc_port,
        server_bind=server_bind,
        server_port=p.server_port,
        base_url=f"http://{reach}:{p.server_port}",
        has_api_key=bool(p.api_key_file),
    )


def links_after_deploy(facts: HostFacts | None, new_id: str) -> tuple[str, str | None]:
    """(current, previous) after activating `new_id`: the old current becomes previous, unless
    it is the same release (a re-deploy keeps the older previous)."""
    if facts is None or facts.current is None:
        return new_id, facts.previous if facts else None
    if facts.current == new_id:
        return new_id, facts.previous
    return new_id, facts.current


def plan(
    playbook: Playbook,
    view: PairView,
    *,
    facts: Mapping[str, HostFacts] | None,
    target: Activation | None,
    restore: Activation | None = None,
    mode: str = "manual",
    skip_accept: bool = False,
    checks: tuple[str, ...] = (),
    kernel_check: bool = False,
    restore_links: Mapping[str, tuple[str | None, str | None]] | None = None,
) -> list[Step]:
    """Concrete steps of `playbook` for this pair. `mode` "auto" drops steps marked manual
    (a rollback inside a failed deploy is already connected and leased)."""
    steps = []
    for s in playbook.steps:
        if mode == "auto" and s.when == "manual":
            continue
        if s.action == "kernel-check" and not kernel_check:
            continue  # only with `deploy --kernel-check`
        if s.action == "accept" and skip_accept:
            continue  # not run, so not recorded as passed; route-accepted settles the pair identity-verified
        roles = ROLES if s.host == "both" else ((s.host,) if s.host in ROLES else ())
        hosts = tuple(view.hosts[r] for r in roles) or ("local",)
        desc, argv = _describe(
            s.action, roles, view, facts or {}, target, restore, skip_accept, checks, restore_links or {}
        )
        steps.append(
            Step(
                name=s.name,
                action=s.action,
                role=s.host,
                hosts=hosts,
                on_failure=s.on_failure,
                changes=ACTIONS[s.action],
                description=desc or s.description,
                argv=argv,
            )
        )
    return steps


def _rel(rel: str | None) -> str:
    return f"releases/{rel}" if rel else "(none)"


def _links(
    role: str,
    facts: Mapping[str, HostFacts],
    target: Activation | None,
    restore_links: Mapping[str, tuple[str | None, str | None]],
) -> tuple[str | None, str | None]:
    if target is not None:
        return links_after_deploy(facts.get(role), target.native_package if role == "native" else target.rpc_package)
    return restore_links.get(role, (None, None))


def _describe(
    action: str,
    roles: tuple[str, ...],
    view: PairView,
    facts: Mapping[str, HostFacts],
    target: Activation | None,
    restore: Activation | None,
    skip_accept: bool,
    checks: tuple[str, ...],
    restore_links: Mapping[str, tuple[str | None, str | None]],
) -> tuple[str, dict[str, tuple[str, ...]]]:
    """A sentence for people plus the argv that will run where one command says it all."""
    argv: dict[str, tuple[str, ...]] = {}
    pkg = {"native": target.native_package, "rpc": target.rpc_package} if target else {}
    if action == "upload" and target:
        parts = []
        for r in roles:
            f = facts.get(r)
            present = f is not None and pkg[r] in f.releases
            parts.append(
                f"{view.hosts[r]}: {pkg[r]} "
                + (
                    "present: send 0 bytes; its sha256 are checked on the host "
                    "by the exec that stops the service, before it stops it"
                    if present
                    else "absent: send, verify sha256, rename into releases/"
                )
            )
        return "; ".join(parts), argv
    act = restore if target is None else target
    if action == "switch":
        r = roles[0]
        cur, prev = _links(r, facts, target, restore_links)
        return (
            f"{view.hosts[r]}: current -> {_rel(cur)}, previous -> {_rel(prev)} (symlinks replaced by rename)",
            argv,
        )
    if action == "stop":
        r = roles[0]
        name = LLAMA_SERVER if r == "native" else RPC_SERVER
        f = facts.get(r)
        pid = f.running.get(name) if f else None
        argv[view.hosts[r]] = tuple(view.layouts[r].stop_cmd(name).argv_display_core())
        return f"stop {name}" + (f" (pid {pid})" if pid else " (not running)" if f else ""), argv
    if action == "restart-rpc":
        cur, prev = _links("rpc", facts, target, restore_links)
        if act is None:
            return (
                f"stop ggml-rpc-server; links back: current -> {_rel(cur)}, previous -> {_rel(prev)}; no pair to start",
                argv,
            )
        argv[view.hosts["rpc"]] = tuple(
            view.layouts["rpc"]
            .restart_cmd(RPC_SERVER, cur, prev, view.rpc_bind, view.rpc_port, 20, list(act.rpc_argv))
            .argv_display_core()
        )
        return (
            f"stop ggml-rpc-server; current -> {_rel(cur)}, previous -> {_rel(prev)}; start it bound to "
            f"{view.rpc_bind}:{view.rpc_port}; wait until it lives and listens; read its identity"
        ), argv
    if action == "start-server":
        if act is None:
            return "nothing to start (no previous pair)", argv
        argv[view.hosts["native"]] = tuple(
            view.layouts["native"].start_cmd(LLAMA_SERVER, list(act.native_argv)).argv_display_core()
        )
        return f"start llama-server from releases/{act.native_package}; wait for {view.base_url}/health 200", argv
    if action == "route-accepted":
        if skip_accept:
            return "route.json: the pair identity-verified (--skip-accept: no acceptance ran), same revision", argv
        if checks:
            return (
                "route.json: the pair `active` (accepted) if --checks names the whole suite, else identity-verified",
                argv,
            )
        return "", argv
    if action == "accept":
        return "acceptance checks: " + (", ".join(checks) if checks else "the suite's defaults"), argv
    return "", argv
