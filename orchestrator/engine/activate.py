"""deploy / rollback: the run context and the action handlers the engine dispatches to.

Order of business (playbooks/deploy.yaml says the same for people):
  1. preflight (local, before any host is touched): packages exist and verify; one revision;
     targets match the pair; the profile renders and every flag is in the native package's
     captured `--help`; the API key file is readable.
  2. connect + facts on both hosts (read-only; a host-key problem stops here).
  3. leases, prepare, upload (nothing that runs has changed yet: a failure aborts).
  4. stop, switch, start, verify, route, accept: from here any failure rolls back.
The rollback restores exactly the links and the route entry that were active at the start
(for `pairctl rollback`: the route record's previous entry), restarts it with its recorded
argv and verifies it the same way. If the rollback fails, both services are stopped and the
leases are kept.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.config.flags import server_policy_problems
from orchestrator.config.inventory import read_api_key
from orchestrator.config.profiles import RouteProfile, profile_from_record, unknown_flags
from orchestrator.engine.identity import Expected, verify_identity
from orchestrator.engine.plan import Activation, PairView, links_after_deploy
from orchestrator.errors import CheckFailed, ConfigError, HostError, PackageError
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts import services
from orchestrator.hosts.layout import (
    LLAMA_SERVER,
    RPC_SERVER,
    SERVICE_OF_ROLE,
    install_helper,
    put_secret,
    svc_sha256,
    switch_links,
)
from orchestrator.hosts.models import check_models
from orchestrator.hosts.probes import ExpectedProc, HostFacts, ProcIdentity, read_facts
from orchestrator.hosts.release import ensure_release, expected_hashes
from orchestrator.hosts.route import RouteConflict, RouteEntry, RouteRecord, cas_write, next_record, parse_route
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import never_ran

ROLES = ("native", "rpc")


@dataclass
class Target:
    """A pair to activate or restore: ids, exact argv, route entry and what identity expects."""

    activation: Activation
    entry: RouteEntry
    expected: Expected | None  # None when a manifest is not in the local store


@dataclass
class RunContext:
    home: Any
    inventory: Any
    view: PairView
    pool: Any  # orchestrator.remote.transport.TransportPool
    journal: Any
    run_id: str
    log: Any
    mode: str = "deploy"  # deploy | rollback
    # deploy inputs
    package_ids: tuple[str, str] | None = None
    profile: RouteProfile | None = None
    packages: dict[str, Any] = field(default_factory=dict)  # role -> Package
    skip_accept: bool = False
    checks: tuple[str, ...] = ()
    kernel_check: bool = False
    api_key_bytes: bytes | None = field(default=None, repr=False)
    # what the run found and did
    target: Target | None = None
    restore: Target | None = None
    restore_links: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    restore_previous_entry: RouteEntry | None = None  # what the route names as previous after a rollback
    facts: dict[str, HostFacts] = field(default_factory=dict)
    route_bytes: dict[str, bytes | None] = field(default_factory=dict)
    route_written: bool = False
    leases: dict[str, Any] = field(default_factory=dict)
    lease_nonce: str | None = field(default=None, repr=False)
    lease_held_by_caller: bool = False  # renew the caller's lease (lease_nonce), never release it
    changed: bool = False
    uploads: dict[str, dict[str, Any]] = field(default_factory=dict)
    identities: dict[str, ProcIdentity] = field(default_factory=dict)  # read by the exec that started each service
    deferred: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)  # role -> present release to verify at stop
    timings: dict[str, float] = field(default_factory=dict)
    accept_result: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _next_route: RouteRecord | None = None

    # -- helpers -----------------------------------------------------------------------------
    def t(self, role: str) -> Any:
        return self.pool.get(self.view.hosts[role])

    def layout(self, role: str) -> Any:
        return self.view.layouts[role]

    def host(self, role: str) -> str:
        return self.view.hosts[role]

    @property
    def api_key(self) -> str | None:
        """The Bearer value: the key file's first non-empty line (llama-server reads one key per line)."""
        if not self.api_key_bytes:
            return None
        for line in self.api_key_bytes.decode("utf-8", "replace").splitlines():
            if line.strip():
                return line.strip()
        return None

    def activating(self) -> Target | None:
        return self.restore if self.mode == "rollback" else self.target

    def timed(self, key: str, seconds: float) -> None:
        with self._lock:
            self.timings[key] = self.timings.get(key, 0.0) + seconds


# -- building targets (pure given manifests) ---------------------------------------------------

def model_paths(pair: Any) -> dict[str, str]:
    return {role: m.path for role, m in pair.models.items()}


def render_target(view: PairView, pair: Any, profile: RouteProfile, native_pkg: Any, rpc_pkg: Any) -> Target:
    """The activation of a new pair: argv from the profile, the route entry, the identity expected."""
    nid, rid = native_pkg.manifest.id, rpc_pkg.manifest.id
    rpc_argv = services.rpc_server_argv(view.layouts["rpc"], rid, bind=view.rpc_bind, port=view.rpc_port)
    try:
        native_argv = services.llama_server_argv(
            view.layouts["native"], nid, profile, model_paths=model_paths(pair), host=view.server_bind,
            port=view.server_port, rpc=[f"{view.rpc_bind}:{view.rpc_port}"], with_api_key=view.has_api_key,
        )
    except ValueError as exc:
        raise ConfigError(f"profile {profile.name} does not render for pair {view.name}: {exc}") from None
    entry = RouteEntry.build(
        native_package=nid, rpc_package=rid, package_revision=native_pkg.manifest.revision,
        profile=profile.model_dump(mode="json"), native_argv=native_argv, rpc_argv=rpc_argv,
    )
    return Target(
        activation=Activation(nid, rid, tuple(native_argv), tuple(rpc_argv), label="new"),
        entry=entry,
        expected=expected_for(entry, native_pkg.manifest, rpc_pkg.manifest, view),
    )


def expected_for(entry: RouteEntry, native_manifest: Any, rpc_manifest: Any, view: PairView) -> Expected:
    profile = profile_from_record(entry.profile)
    return Expected(
        native=ExpectedProc(LLAMA_SERVER, _bin_sha(native_manifest, LLAMA_SERVER), tuple(entry.native_argv)),
        rpc=ExpectedProc(RPC_SERVER, _bin_sha(rpc_manifest, RPC_SERVER), tuple(entry.rpc_argv)),
        revision=native_manifest.revision,
        build_info=getattr(native_manifest, "build_info", None),
        parallel=profile.parallel,
        per_slot_ctx=profile.per_slot_ctx(),
        rpc_bind=view.rpc_bind,
        rpc_port=view.rpc_port,
        expect_pipeline_parallel=profile.expect_pipeline_parallel,
    )


def _bin_sha(manifest: Any, name: str) -> str:
    try:
        return manifest.files[f"bin/{name}"].sha256
    except KeyError:
        raise PackageError(f"package {manifest.id} has no bin/{name}") from None


def target_from_entry(entry: RouteEntry, store: Any, view: PairView, label: str) -> Target:
    """A recorded route entry as a target to restore (manifests from the local store)."""
    try:
        expected = expected_for(entry, store.get(entry.native_package).manifest, store.get(entry.rpc_package).manifest, view)
    except PackageError:
        expected = None
    return Target(
        activation=Activation(entry.native_package, entry.rpc_package, tuple(entry.native_argv),
                              tuple(entry.rpc_argv), label=label),
        entry=entry,
        expected=expected,
    )


# -- preflight (local) ---------------------------------------------------------------------

def preflight_checks(ctx: RunContext, store: Any) -> dict[str, Any]:
    """Everything that can refuse a deploy without touching a host."""
    pair = ctx.inventory.pair(ctx.view.name)
    nid, rid = ctx.package_ids
    native, rpc = store.get(nid), store.get(rid)
    t0 = time.monotonic()
    for pid in (nid, rid) if nid != rid else (nid,):
        store.verify(pid)
    ctx.timed("local_verify_s", time.monotonic() - t0)
    nm, rm = native.manifest, rpc.manifest
    if nm.revision != rm.revision:
        raise PackageError(
            f"packages {nid} and {rid} come from two revisions ({nm.revision[:12]} and {rm.revision[:12]}); "
            "a pair must be built from one revision (the RPC handshake does not prove the builds match)",
            hint="build both targets from the same commit",
        )
    for side, want, m in (("native", pair.target_native, nm), ("rpc", pair.target_rpc, rm)):
        if want and m.target.name != want:
            raise PackageError(f"package {m.id} is for target {m.target.name}; pair {ctx.view.name}'s {side} host wants {want}")
    target = render_target(ctx.view, pair, ctx.profile, native, rpc)
    help_text = native.help_text
    unknown = unknown_flags(list(target.activation.native_argv[1:]), help_text)
    if unknown:
        raise ConfigError(
            f"profile {ctx.profile.name} renders flag(s) {', '.join(sorted(set(unknown)))} that package {nid}'s "
            f"llama-server --help does not offer (renamed or removed in this revision)",
            hint=f"see {native.path / nm.help_file}",
        )
    key = read_api_key(ctx.view.name, pair)
    act, prof = target.activation, ctx.profile
    extra = list(prof.extra_args) if prof is not None else []
    policy = server_policy_problems(dict(pair.allow_flags), extra, list(act.native_argv[1:]),
                                    list(act.rpc_argv[1:]), help_text=help_text, api_key=key is not None)
    if policy.problems:
        raise ConfigError(f"pair {ctx.view.name}, profile {prof.name if prof else '?'}: " + "; ".join(policy.problems),
                          hint="see the flag policy in README (Security model)")
    if key is not None:
        ctx.api_key_bytes = key.file_bytes
    ctx.packages = {"native": native, "rpc": rpc}
    ctx.target = target
    return {
        "packages": {"native": nid, "rpc": rid},
        "revision": nm.revision,
        "content_digests": {"native": nm.content_digest, "rpc": rm.content_digest},
        "profile": ctx.profile.name,
        "profile_sha256": target.entry.profile_sha256,
        "argv_sha256": target.entry.argv_sha256,
        "native_argv": list(target.activation.native_argv),
        "rpc_argv": list(target.activation.rpc_argv),
        "allowed_flags": policy.allowed,
    }


# -- host actions --------------------------------------------------------------------------

def a_connect(ctx: RunContext, role: str) -> dict[str, Any]:
    t0 = time.monotonic()
    t = ctx.t(role)
    connect = getattr(t, "connect", None)
    if connect is not None:
        connect()
    ctx.timed("connect_s", time.monotonic() - t0)
    return {"seconds": round(time.monotonic() - t0, 4)}


def a_facts(ctx: RunContext, role: str) -> dict[str, Any]:
    f = read_facts(ctx.t(role), ctx.layout(role), (SERVICE_OF_ROLE[role],))
    with ctx._lock:
        ctx.facts[role] = f
        ctx.route_bytes[role] = f.route_bytes
    return f.to_dict()


def a_lease(ctx: RunContext, role: str) -> dict[str, Any]:
    from orchestrator.engine import leasing

    handle = leasing.take(ctx, role)
    with ctx._lock:
        ctx.leases[role] = handle
    d = leasing.describe(handle)
    return {**d, "renewed": "the calling run's lease"} if ctx.lease_held_by_caller else d


def a_release_lease(ctx: RunContext, role: str) -> dict[str, Any]:
    from orchestrator.engine import leasing

    handle = ctx.leases.get(role)
    if handle is None:
        return {"skipped": "no lease held by this run"}
    released = leasing.release(ctx, role, handle)
    with ctx._lock:
        ctx.leases.pop(role, None)
    return {"released": True} if released else {"kept": "held by the calling run, which releases it"}


def a_prepare(ctx: RunContext, role: str) -> dict[str, Any]:
    f = ctx.facts.get(role)
    if f is not None and f.svc_sha256 == svc_sha256():
        d: dict[str, Any] = {"helper": "up to date"}
    else:
        install_helper(ctx.t(role), ctx.layout(role))
        d = {"helper": "installed", "sha256": svc_sha256()}
    if role == "native" and ctx.mode == "deploy" and ctx.target is not None:
        d["models"] = _hash_models(ctx)
    return d


def _hash_models(ctx: RunContext) -> dict[str, Any]:
    """The model files the new pair will load, hashed on the native host (cached there by stat,
    so only a new or changed file costs a full read). A missing file, or one whose sha256 is not
    the one the inventory declares, refuses the deploy before anything changes (exit 6); the
    hashes go into the route entry, so status, acceptance and answer baselines know the weights."""
    models = ctx.inventory.pair(ctx.view.name).models
    if not models:
        return {}
    t0 = time.monotonic()
    found, problems = check_models({n: m.path for n, m in models.items()},
                                    {n: m.sha256 for n, m in models.items() if m.sha256}, ctx.host("native"),
                                    ctx.t("native"), ctx.layout("native"), expected_is="the inventory declares")
    ctx.timed("model_hash_s", time.monotonic() - t0)
    if problems:
        raise PackageError("; ".join(problems) + "; nothing was changed",
                           hint="put the declared file in place (or correct models.<name>.sha256 in the inventory)")
    hashes = {name: h.sha256 for name, h in found.items()}
    with ctx._lock:
        ctx.target = replace(ctx.target, entry=ctx.target.entry.model_copy(update={"models": hashes}))
    return {name: {"sha256": h.sha256, "size": h.size, "how": h.how} for name, h in sorted(found.items())}


def a_upload(ctx: RunContext, role: str) -> dict[str, Any]:
    pkg = ctx.packages[role]
    f = ctx.facts.get(role)
    present = f is not None and pkg.manifest.id in f.releases
    t0 = time.monotonic()
    res = ensure_release(ctx.t(role), ctx.layout(role), pkg, present, ctx.host(role), defer_present=True)
    ctx.timed("upload_s", time.monotonic() - t0)
    d = res.to_dict()
    with ctx._lock:
        ctx.uploads[role] = d
        if res.deferred:
            ctx.deferred[role] = (pkg.manifest.id, expected_hashes(pkg.manifest))
    return d


def a_secret(ctx: RunContext, role: str) -> dict[str, Any]:
    if not ctx.view.has_api_key:
        return {"skipped": "the pair has no api_key_file"}
    path = put_secret(ctx.t(role), ctx.layout(role), ctx.api_key_bytes)
    return {"path": path, "mode": "0600"}  # never the value, never its hash


def _take_deferred(ctx: RunContext, role: str) -> tuple[str, dict[str, str]] | None:
    """The present release this host's first exec must verify before stopping (deploy only)."""
    if ctx.mode != "deploy":
        return None
    with ctx._lock:
        return ctx.deferred.pop(role, None)


class UnreachableBeforeChange(HostError):
    """A host did not answer just before the first change (the RPC host's probe, or the native
    host's stop that never started): nothing was stopped."""

    nothing_changed = True


def _reach_before_change(ctx: RunContext, role: str) -> float:
    """Stopping native is the first change, and from there the other host must take a restart
    (and a rollback needs it too). One exec round trip to it now turns a host lost since `lease`
    into a refusal with the previous pair still serving (exit 4), not a pair taken down (exit 8)."""
    t0 = time.monotonic()
    try:
        ctx.t(role).run_idempotent(ctx.layout(role).alive_cmd(SERVICE_OF_ROLE[role]), check=False, timeout=30)
    except (HostError, OSError) as exc:
        raise UnreachableBeforeChange(
            f"{ctx.host(role)} did not answer just before the first change, so nothing was stopped: {exc}",
            hint="the previous pair keeps serving; repair the host, then deploy again",
        ) from None
    return time.monotonic() - t0


def a_stop(ctx: RunContext, role: str) -> dict[str, Any]:
    t0 = time.monotonic()
    if ctx.mode == "deploy" and role == "native":
        ctx.timed("rpc_reach_s", _reach_before_change(ctx, "rpc"))
    verify = _take_deferred(ctx, role)
    try:
        out, verified = services.stop(ctx.t(role), ctx.layout(role), SERVICE_OF_ROLE[role], verify=verify)
    except HostError as exc:
        if ctx.mode == "deploy" and role == "native" and never_ran(exc):  # the first change never started
            raise UnreachableBeforeChange(
                f"{ctx.host(role)} could not be reached to stop {SERVICE_OF_ROLE[role]}, so nothing was stopped: {exc}",
                hint="the previous pair keeps serving; repair the host, then deploy again") from None
        raise
    ctx.timed("stop_s", time.monotonic() - t0)
    d: dict[str, Any] = {"result": out}
    if verify:
        d["release_verified"] = {"release": verify[0], "files": verified}
    return d


def links_for(ctx: RunContext, role: str) -> tuple[str | None, str | None]:
    """(current, previous) this run puts on the host: the new release, or what is restored."""
    if ctx.mode == "rollback":
        return ctx.restore_links[role]
    a = ctx.target.activation
    return links_after_deploy(ctx.facts.get(role), a.native_package if role == "native" else a.rpc_package)


def a_switch(ctx: RunContext, role: str) -> dict[str, Any]:
    cur, prev = links_for(ctx, role)
    switch_links(ctx.t(role), ctx.layout(role), cur, prev)
    return {"current": cur, "previous": prev}


def a_restart_rpc(ctx: RunContext, role: str) -> dict[str, Any]:
    t, layout = ctx.t("rpc"), ctx.layout("rpc")
    links = links_for(ctx, "rpc")
    tgt = ctx.activating()
    t0 = time.monotonic()
    if tgt is None:  # nothing to restore: stop, put the links back as found, start nothing
        out, _ = services.stop(t, layout, RPC_SERVER)
        switch_links(t, layout, *links)
        ctx.timed("stop_s", time.monotonic() - t0)
        return {"stopped": out, "current": links[0], "previous": links[1], "started": "nothing (no previous pair)"}
    verify = _take_deferred(ctx, "rpc")
    pid, ident, stopped, verified = services.restart_listening(
        t, layout, RPC_SERVER, links, ctx.view.rpc_bind, ctx.view.rpc_port, list(tgt.activation.rpc_argv), verify=verify)
    ctx.timed("rpc_restart_to_listening_s", time.monotonic() - t0)
    with ctx._lock:
        ctx.identities["rpc"] = ident
    d = {"stopped": stopped, "current": links[0], "previous": links[1], "pid": pid,
         "listening": f"{ctx.view.rpc_bind}:{ctx.view.rpc_port}", "exe_sha256": ident.exe_sha256}
    if verify:
        d["release_verified"] = {"release": verify[0], "files": verified}
    return d


def a_start_server(ctx: RunContext, role: str) -> dict[str, Any]:
    tgt = ctx.activating()
    if tgt is None:
        return {"skipped": "no previous pair to start"}
    t, layout = ctx.t("native"), ctx.layout("native")
    t0 = time.monotonic()
    pid, ident = services.start(t, layout, LLAMA_SERVER, list(tgt.activation.native_argv))
    with ctx._lock:
        ctx.identities["native"] = ident
    t1 = time.monotonic()
    try:
        w = services.wait_health(t, layout, ctx.view.base_url, pid, log=ctx.log)
    except CheckFailed as exc:
        # llama-server often dies of its RPC peer ("recv failed" when ggml-rpc-server aborted on a
        # graph): the peer's output holds the cause, so the failure names it too.
        rpc_out = ctx.layout("rpc").log(RPC_SERVER + ".out")
        raise CheckFailed(f"{exc}\nand {ctx.host('rpc')}'s {rpc_out} ends:\n"
                          + services.read_tail(ctx.t("rpc"), rpc_out, 8)) from None
    ctx.timed("server_start_exec_s", t1 - t0)
    ctx.timed("server_start_to_healthy_s", time.monotonic() - t1)
    return {"pid": pid, "exe_sha256": ident.exe_sha256, "healthy_after_s": round(w.seconds, 4),
            "health_polls": w.polls, "alive_checks": w.alive_checks}


def a_verify(ctx: RunContext, role: str) -> dict[str, Any]:
    tgt = ctx.activating()
    if tgt is None:
        return {"skipped": "no previous pair: nothing runs"}
    if tgt.expected is None:
        raise PackageError(
            f"cannot verify {tgt.activation.native_package} / {tgt.activation.rpc_package}: "
            "their manifests are not in the local package store"
        )
    seen = {role: ctx.identities[role]} if role in ctx.identities else None
    rep = verify_identity(
        {role: ctx.t(role)}, ctx.view.layouts, ctx.view.hosts, tgt.expected,
        base_url=ctx.view.base_url, api_key=ctx.api_key, roles=(role,), seen=seen,
    )
    ctx.journal.identity(ctx.host(role), {**rep.data, "problems": rep.problems, "label": tgt.activation.label})
    if rep.problems:
        raise CheckFailed("identity does not match: " + "; ".join(rep.problems))
    return {"identity": "verified", **{k: v for k, v in rep.data.items() if k == "server"}}


def _route_successor(ctx: RunContext) -> RouteRecord | None:
    """The record this run writes (computed once, identical on both hosts)."""
    with ctx._lock:
        if ctx._next_route is not None:
            return ctx._next_route
        current = parse_route(ctx.route_bytes.get("native"))
        if ctx.mode == "deploy":
            new = ctx.target.entry
            prev = current.active if current else None
            if prev is not None and prev == new:
                prev = current.previous
            rec = next_record(current, pair=ctx.view.name, active=new, previous=prev, run_id=ctx.run_id)
        else:
            if ctx.restore is None and not ctx.route_written:
                return None  # nothing was recorded for the failed pair: leave the record as it was
            active = ctx.restore.entry if ctx.restore else None
            prev = ctx.restore_previous_entry
            rec = next_record(current, pair=ctx.view.name, active=active, previous=prev, run_id=ctx.run_id)
        ctx._next_route = rec
        return rec


def a_route(ctx: RunContext, role: str) -> dict[str, Any]:
    rec = _route_successor(ctx)
    if rec is None:
        return {"skipped": "route record unchanged (no pair was recorded by this run)"}
    data = rec.to_bytes()
    try:
        back = cas_write(ctx.t(role), ctx.layout(role).route, ctx.route_bytes.get(role), data)
    except RouteConflict as exc:
        raise CheckFailed(f"{ctx.host(role)}: {exc} (compare-and-swap refused)") from None
    if back != data:
        raise CheckFailed(f"{ctx.host(role)}: route.json read back differs from what was written")
    with ctx._lock:
        ctx.route_bytes[role] = data
        ctx.route_written = True
    return {"revision": rec.revision, "active": rec.active.names() if rec.active else None,
            "sha256": sha256_bytes(data), "read_back": "byte-identical"}


def a_accept(ctx: RunContext, role: str | None) -> dict[str, Any]:
    from orchestrator.engine import acceptance

    return acceptance.run(ctx)


def a_kernel_check(ctx: RunContext, role: str | None) -> dict[str, Any]:
    """The packages' own kernel validation harness on both hosts, before anything running changes."""
    from orchestrator.checks import kernels

    return kernels.deploy_step(ctx, role)


def a_preflight(ctx: RunContext, role: str | None) -> dict[str, Any]:
    from orchestrator.build.store import PackageStore

    return preflight_checks(ctx, PackageStore(ctx.home.store))


HANDLERS = {
    "preflight": a_preflight,
    "connect": a_connect,
    "facts": a_facts,
    "lease": a_lease,
    "prepare": a_prepare,
    "upload": a_upload,
    "secret": a_secret,
    "stop": a_stop,
    "switch": a_switch,
    "restart-rpc": a_restart_rpc,
    "start-server": a_start_server,
    "verify": a_verify,
    "route": a_route,
    "accept": a_accept,
    "kernel-check": a_kernel_check,
    "release-lease": a_release_lease,
}


def stop_everything(ctx: RunContext) -> dict[str, str]:
    """Best effort, native first: used when a rollback fails (never leave a half-running pair)."""
    out = {}
    for role in ROLES:
        try:
            out[ctx.host(role)] = services.stop(ctx.t(role), ctx.layout(role), SERVICE_OF_ROLE[role])[0]
        except (HostError, OSError, Exception) as exc:  # keep going: the other host must stop too
            out[ctx.host(role)] = f"stop failed: {exc}"
    return out
