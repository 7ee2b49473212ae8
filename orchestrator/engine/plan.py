"""Planning: a playbook plus what the hosts look like -> the concrete steps, each on a named host.

Pure: `--dry-run` prints exactly this. A step that starts or stops a service carries its command per
host as a frozen `Exec`, rendered only here (`service_exec`); the action runs it as it is and records
its argv, so the dry run's commands and the receipt's are the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from orchestrator.config.inventory import ApiKey, Inventory
from orchestrator.engine.playbook import ActionKind, Playbook
from orchestrator.hosts import services, supervisor
from orchestrator.hosts.identity import Expected
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, HostLayout
from orchestrator.hosts.managers import manager_for
from orchestrator.hosts.probes import HostFacts
from orchestrator.hosts.release import expected_hashes
from orchestrator.hosts.route import RouteEntry, RouteRecord
from orchestrator.remote.command import Cmd
from orchestrator.roles import ROLES

if TYPE_CHECKING:
    from orchestrator.build.store import Package
    from orchestrator.checks.kernels import KernelCheckPlan


@dataclass(frozen=True)
class Exec:
    """One command a step runs on one host, rendered once: what the dry run prints, runs and records."""

    cmd: Cmd
    bound_s: float  # the exec's own timeout
    verify_release: str | None = None  # checked against its manifest (stdin) before anything stops
    service: str | None = None  # the service it starts, when it starts one
    service_argv: tuple[str, ...] = ()  # ... and the argv that service's identity must show
    sup: tuple[str, ...] = ()  # the supervisor options (also in a systemd unit's ExecStart)

    def argv(self) -> tuple[str, ...]:
        return tuple(self.cmd.argv_display_core())


@dataclass(frozen=True)
class RouteWrite:
    """The route record a plan's `route` / `route-accepted` steps write, decided before the first
    change (engine/route_plan.py): the transition, the base revision, the sealed records (None: left as is)."""

    transition: str  # activate | restore | back-out | roll-back | roll-to | rebuilt | unchanged
    base_revision: int | None
    record: RouteRecord | None = None  # what `route` writes on both hosts
    settled: RouteRecord | None = None  # what `route-accepted` writes (a deploy's record, settled)
    deferred: tuple[str, ...] = ()  # beyond RUN_FIELDS, known once prepare ran: "active.models" (undeclared sha256)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"transition": self.transition, "base_revision": self.base_revision}
        for k, rec in (("record", self.record), ("settled", self.settled)):
            if rec is not None:
                d[k] = planned_fields(json.loads(rec.to_bytes()), (*RUN_FIELDS, *self.deferred))
                d["deferred"] = [*RUN_FIELDS, *self.deferred]
        return d


# what only the writing run knows: its clock, id, chain head when it began (a dry run's receipt is newer), mac
RUN_FIELDS = ("updated_at", "updated_by", "evidence_head", "mac")


def planned_fields(record: dict[str, Any], deferred: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """A record's JSON without its deferred fields (`a.b`: b of a): what the dry run prints of it."""
    for f in deferred:
        *up, last = f.split(".")
        sub = record
        for k in up:
            sub = sub.get(k) or {}
        sub.pop(last, None)
    return record


@dataclass(frozen=True)
class Upload:
    """What `upload` does on one host: the release is `present` (nothing sent; the stop's exec checks
    these sha256 on the host first) or absent (these files are sent, checked, renamed in)."""

    release: str
    present: bool
    files: Mapping[str, str]  # relpath -> sha256, the manifest's

    def to_dict(self) -> dict[str, Any]:
        return {"release": self.release, "present": self.present, "files": dict(sorted(self.files.items()))}


# What a step does beyond its action (Step.may), decided by the plan: first-change (prove both hosts and
# leases first); switch-own (its links are the deploy's, put back if the back-out fails); restore (puts a
# recorded pair back: proves the RPC host and roots first, no signal stops it once something changed);
# install-helper (facts of a plan without prepare)
May = Literal["first-change", "switch-own", "restore", "install-helper"]


def _may(action: str, restores: bool, first_change: bool) -> frozenset[May]:
    if restores:
        return frozenset(("restore", "install-helper") if action == "facts" else ("restore",))
    own: tuple[May, ...] = ("switch-own",) if action in ("switch", "restart-rpc") else ()
    return frozenset(("first-change", *own) if first_change else own)


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
    execs: Mapping[str, Exec] = field(default_factory=dict)  # per host: the command this step runs there
    # per host: the (current, previous) links a switch / restart-rpc puts there, decided here once
    links: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    route: RouteWrite | None = None  # route / route-accepted / route-repair: the record they write
    uploads: Mapping[str, Upload] = field(default_factory=dict)  # per host: what `upload` sends or verifies
    kernel: KernelCheckPlan | None = None  # kernel-check: each host's harness run, the second rpc-server
    pair: Target | None = field(default=None, compare=False)  # what the plan starts (None: nothing)
    packages: Mapping[str, Package] = field(default_factory=dict, compare=False, repr=False)  # role -> upload
    key: ApiKey | None = field(default=None, compare=False, repr=False)  # the secret it puts, verify's Bearer
    may: frozenset[May] = frozenset()  # what this step does beyond its action, decided for it by the plan
    kind: ActionKind | None = field(default=None, compare=False, repr=False)  # its action's class (engine/actions)

    @property
    def argv(self) -> Mapping[str, tuple[str, ...]]:
        return {h: e.argv() for h, e in self.execs.items()}

    def to_dict(self) -> dict[str, Any]:
        """The step as decided: what `--dry-run` prints and the receipt records for each step run, equal
        by construction. Only what the step's action uses; the API key never (only whether one is set)."""
        d: dict[str, Any] = {
            "name": self.name,
            "action": self.action,
            "role": self.role,
            "hosts": list(self.hosts),
            "on_failure": self.on_failure,
            "changes": self.changes,
            "description": self.description,
            "argv": {h: list(a) for h, a in self.argv.items()},
        }
        if self.links:
            d["links"] = {h: list(lk) for h, lk in self.links.items()}
        if self.uploads:
            d["upload"] = {h: u.to_dict() for h, u in self.uploads.items()}
        if self.route is not None:
            d["route"] = self.route.to_dict()
        if self.kernel is not None:
            d["kernel"] = self.kernel.to_dict()
        if self.kind is not None and self.kind.uses_pair and self.pair is not None:
            d["pair"] = self.pair.entry.names()
        if self.kind is not None and self.kind.uses_key:
            d["has_key"] = self.key is not None  # named so the receipt's masking keeps it (never the key)
        if self.may:
            d["may"] = sorted(self.may)
        return d


@dataclass(frozen=True)
class Planning:
    """What a step's action describes itself from (Action.describe): its roles and links, the hosts
    as found, what the plan activates or restores, and the options that change the text."""

    roles: tuple[str, ...]
    view: PairView
    facts: Mapping[str, HostFacts]
    target: Activation | None
    restore: Activation | None
    skip_accept: bool
    checks: tuple[str, ...]
    links: Mapping[str, tuple[str | None, str | None]]

    @property
    def act(self) -> Activation | None:
        return self.restore if self.target is None else self.target


@dataclass(frozen=True)
class Prepared:
    """What a deploy's preflight decided before its plan: each role's package, the API key, the pair."""

    packages: Mapping[str, Package]
    key: ApiKey | None = field(repr=False)
    target: Target


@dataclass(frozen=True)
class PairView:
    """The pair as the plan needs it: host names, layouts, binds, ports (from the inventory)."""

    name: str
    hosts: Mapping[str, str]  # role -> host name
    layouts: Mapping[str, HostLayout]  # role -> layout
    rpc_bind: str
    rpc_port: int
    rpc_peers: tuple[str, ...]
    server_bind: str
    server_port: int
    base_url: str
    has_api_key: bool
    sup: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # role -> supervisor options


@dataclass(frozen=True)
class Activation:
    """What a plan activates (deploy) or restores (rollback): package ids and exact argv."""

    native_package: str
    rpc_package: str
    native_argv: tuple[str, ...]
    rpc_argv: tuple[str, ...]
    label: str = ""
    # (native, rpc) releases the `previous` links name after this activation, instead of the old
    # current (qualify's restore: the links as the qualification found them)
    keep_previous: tuple[str | None, str | None] | None = None
    # (native, rpc) release-files digests (supervisor.release_files_digest of each manifest): each
    # supervisor refuses to start a service from a release whose files no longer hash to it
    files: tuple[str | None, str | None] = (None, None)
    # (path, sha256) of each file the profile declares (RouteProfile.files): llama-server's
    # supervisor re-hashes them (cached by stat) before each start, as a rollback does before its own
    declared: tuple[tuple[str, str], ...] = ()

    def package(self, role: str) -> str:
        return self.native_package if role == "native" else self.rpc_package


@dataclass(frozen=True)
class Target:
    """A pair to activate or restore: ids, exact argv, route entry and what identity expects."""

    activation: Activation
    entry: RouteEntry
    expected: Expected | None  # None when a manifest is not in the local store


def pair_view(inventory: Inventory, pair_name: str) -> PairView:
    p = inventory.pair(pair_name)
    hosts = {"native": p.native, "rpc": p.rpc}
    layouts = {
        role: HostLayout(
            inventory.host(h).install_root, manager_for(inventory, pair_name, role), inventory.host(h).state_dir
        )
        for role, h in hosts.items()
    }
    server_bind = inventory.server_bind(pair_name)
    reach = inventory.host(p.native).address if server_bind in ("0.0.0.0", "::", "") else server_bind
    reach_url = f"[{reach}]" if ":" in reach else reach
    rpc_bind = inventory.rpc_bind(pair_name)
    sup = {
        # the RPC server's own endpoint turns on its hang check (pairctl-svc rpc-probe)
        "rpc": tuple(
            supervisor.sup_args(
                inventory.supervision,
                rpc=supervisor.ipv4_endpoint(rpc_bind, p.rpc_port),
                allow=inventory.rpc_peers(pair_name),
                user=inventory.host(p.rpc).service_user,
            )
        ),
        "native": tuple(
            supervisor.sup_args(
                inventory.supervision,
                health=supervisor.ipv4_endpoint(urlsplit(f"http://{reach_url}").hostname or "", p.server_port),
                peer=supervisor.ipv4_endpoint(rpc_bind, p.rpc_port),
                user=inventory.host(p.native).service_user,
            )
        ),
    }
    return PairView(
        name=pair_name,
        hosts=hosts,
        layouts=layouts,
        rpc_bind=rpc_bind,
        rpc_port=p.rpc_port,
        rpc_peers=tuple(inventory.rpc_peers(pair_name)),
        server_bind=server_bind,
        server_port=p.server_port,
        base_url=f"http://{reach_url}:{p.server_port}",
        has_api_key=bool(p.api_key_file),
        sup=sup,
    )


def service_exec(
    view: PairView,
    action: str,
    role: str,
    act: Activation | None,
    links: tuple[str | None, str | None] = (None, None),
    verify_release: str | None = None,
) -> Exec:
    """The command `action` (stop | restart-rpc | start-server) runs on ROLE's host: the one renderer."""
    layout = view.layouts[role]
    name = LLAMA_SERVER if role == "native" else RPC_SERVER
    if action == "stop" or (action == "restart-rpc" and act is None):
        return Exec(layout.stop_cmd(name, verify_release), layout.manager.bound_s("stop"), verify_release)
    assert act is not None
    sup = tuple(view.sup.get(role, ()))
    if digest := act.files[0 if role == "native" else 1]:
        sup += (f"sup.files={digest}",)
    if role == "native":
        sup += tuple(f"sup.want={sha}:{path}" for path, sha in act.declared)
    if action == "restart-rpc":
        argv = list(act.rpc_argv)
        cmd = layout.restart_cmd(
            RPC_SERVER,
            links[0],
            links[1],
            view.rpc_bind,
            view.rpc_port,
            services.RPC_LISTEN_S,
            argv,
            verify_release=verify_release,
            sup=sup,
        )
        return Exec(cmd, services.restart_bound_s(layout), verify_release, RPC_SERVER, tuple(argv), sup)
    if action == "start-server":
        argv = list(act.native_argv)
        cmd = layout.start_cmd(LLAMA_SERVER, argv, sup)
        return Exec(cmd, layout.manager.bound_s("start"), None, LLAMA_SERVER, tuple(argv), sup)
    raise ValueError(f"action {action} runs no service command")


def links_after_deploy(facts: HostFacts | None, new_id: str) -> tuple[str, str | None]:
    """(current, previous) after activating `new_id`: old current becomes previous unless it is the same."""
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
    skip_accept: bool = False,
    checks: tuple[str, ...] = (),
    kernel: KernelCheckPlan | None = None,
    restore_links: Mapping[str, tuple[str | None, str | None]] | None = None,
    route: RouteWrite | None = None,
    pair: Target | None = None,
    restores: bool = False,
    packages: Mapping[str, Package] | None = None,
    key: ApiKey | None = None,
) -> list[Step]:
    """Concrete steps of `playbook` for this pair (a failed deploy's back-out: of `back_out`'s)."""
    steps = []
    first = next((s.name for s in playbook.steps if s.changes), None)
    for s in playbook.steps:
        if s.action == "kernel-check" and kernel is None:
            continue  # only with `deploy --kernel-check`
        if s.action == "accept" and skip_accept:
            continue  # not run, so not recorded as passed; route-accepted settles the pair identity-verified
        roles = ROLES if s.host == "both" else ((s.host,) if s.host in ROLES else ())
        hosts = tuple(view.hosts[r] for r in roles) or ("local",)
        links: dict[str, tuple[str | None, str | None]] = {
            r: _links(r, facts or {}, target, restore_links or {})
            for r in (roles if s.action in ("switch", "restart-rpc") else ())
        }
        ups = _uploads(roles, view, facts or {}, target, packages or {}) if s.action == "upload" else {}
        desc, argv = s.kind.describe(Planning(roles, view, facts or {}, target, restore, skip_accept, checks, links))
        steps.append(
            Step(
                name=s.name,
                action=s.action,
                role=s.host,
                hosts=hosts,
                on_failure=s.on_failure,
                changes=s.changes,
                description=desc or _upload_text(ups) or s.description,
                execs=argv,
                uploads=ups,
                links={view.hosts[r]: lk for r, lk in links.items()},
                # a restore's stop carries it too: what it must find writable before it stops anything
                route=route if s.kind.writes_route or (restores and s.action == "stop") else None,
                kernel=kernel if s.action == "kernel-check" else None,
                pair=pair,
                may=_may(s.action, restores, s.name == first),
                packages=packages or {},
                key=key,
                kind=s.kind,
            )
        )
    return steps


def back_out(playbook: Playbook) -> Playbook:
    """The rollback playbook as a failed deploy's back-out runs it, a plan of its own: without
    its `when: manual` steps (the deploy is connected and leased, its secret put already)."""
    return playbook.model_copy(update={"steps": [s for s in playbook.steps if s.when != "manual"]})


def sealed(steps: list[Step], route: RouteWrite, pair: Target | None) -> list[Step]:
    """The same steps, the route-writing ones carrying `route`, all the pair (a deploy's, sealed
    once prepare measured the model hashes its entry records, before the first change)."""
    return [replace(s, route=route if s.kind and s.kind.writes_route else s.route, pair=pair) for s in steps]


def rel_text(rel: str | None) -> str:
    return f"releases/{rel}" if rel else "(none)"


def _links(
    role: str,
    facts: Mapping[str, HostFacts],
    target: Activation | None,
    restore_links: Mapping[str, tuple[str | None, str | None]],
) -> tuple[str | None, str | None]:
    """(current, previous) a switch leaves on ROLE's host, decided once for plan and executor: a
    deploy's new release (qualify's restore keeps the `previous` it found), or what a restore puts back."""
    if target is None:
        return restore_links.get(role, (None, None))
    cur, prev = links_after_deploy(facts.get(role), target.package(role))
    if target.keep_previous is not None:
        prev = target.keep_previous[0 if role == "native" else 1]
    return cur, prev


def present_release(role: str, facts: Mapping[str, HostFacts], target: Activation | None) -> str | None:
    """A deploy's release already on the host: nothing is uploaded, so the host's first exec
    that changes anything (stop-native, restart-rpc) verifies its files before it stops."""
    if target is None:
        return None
    pkg = target.package(role)
    f = facts.get(role)
    return pkg if f is not None and pkg in f.releases else None


def _uploads(
    roles: tuple[str, ...],
    view: PairView,
    facts: Mapping[str, HostFacts],
    target: Activation | None,
    packages: Mapping[str, Package],
) -> dict[str, Upload]:
    """Each host's upload from the facts: present (verified by the exec that stops it) or absent (sent)."""
    out: dict[str, Upload] = {}
    for r in roles if target is not None else ():
        assert target is not None
        pkg = packages.get(r)
        files = expected_hashes(pkg.manifest) if pkg is not None else {}
        rel = target.package(r)
        out[view.hosts[r]] = Upload(rel, present_release(r, facts, target) is not None, files)
    return out


def _upload_text(ups: Mapping[str, Upload]) -> str:
    return "; ".join(
        f"{h}: {u.release} "
        + (
            "present: send 0 bytes; its sha256 are checked on the host by the exec that stops the service, "
            "before it stops it"
            if u.present
            else "absent: send, verify sha256, rename into releases/"
        )
        for h, u in ups.items()
    )
