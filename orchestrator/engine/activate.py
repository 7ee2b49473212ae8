"""The executors of the playbooks' actions (HANDLERS) and what they prove before a change.

Each runs what its plan step carries (plan.py: commands, links, route records, the pair it starts,
whether its plan restores one) and decides none of it. The order of business is in
playbooks/deploy.yaml; what a failure leads to (abort, back-out, both stopped) in engine/deploy.py.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.build.revisions import mixed_problem, require_one_revision
from orchestrator.build.store import PackageStore
from orchestrator.engine import leasing
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Activation, Exec, Step, Target, service_exec
from orchestrator.engine.runner import Handler
from orchestrator.engine.targets import preflight_checks
from orchestrator.errors import CheckFailed, ConfigError, DiskFull, HostError, HostStateError, PackageError
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts import services, space
from orchestrator.hosts.identity import read_identities, verify_identity
from orchestrator.hosts.layout import (
    LLAMA_SERVER,
    RPC_SERVER,
    SERVICE_OF_ROLE,
    install_helper,
    put_secret,
    svc_sha256,
    switch_links,
    unique_tmp,
)
from orchestrator.hosts.models import check_models
from orchestrator.hosts.probes import ProbeError, read_facts, release_of_link
from orchestrator.hosts.release import ensure_release
from orchestrator.hosts.route import RouteConflict, RouteRecord, cas_write
from orchestrator.hosts.rpc_guard import install_guard, install_route_key
from orchestrator.hosts.units import UnitReadback
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import HOST_FILE_MAX, FileStat, FreeBytes, HostClock, fs_batch, never_ran

ROLES = ("native", "rpc")


def a_connect(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    t0 = time.monotonic()
    t = ctx.t(role)
    connect = getattr(t, "connect", None)
    if connect is not None:
        connect()
    ctx.timed("connect_s", time.monotonic() - t0)
    return {"seconds": round(time.monotonic() - t0, 4)}


def a_facts(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    f = read_facts(ctx.t(role), ctx.layout(role), (SERVICE_OF_ROLE[role],))
    ctx.hosts.found(role, f)
    d = f.to_dict()
    if ctx.layout(role).manager.units and step.restores:
        # a rollback has no prepare step: its systemd host gets the helper that speaks units
        # (replaced by rename; running supervisors keep the copy they read) and the manager check;
        # its units are checked once the pair to restore is known (engine/deploy.py rollback)
        if f.svc_sha256 != svc_sha256():
            install_helper(ctx.t(role), ctx.layout(role))
            d["helper"] = "installed"
        d |= _check_manager(ctx, role)
    return d


def a_lease(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    handle = leasing.take(ctx, role)
    ctx.hosts.lease_taken(role, handle)
    d = leasing.describe(handle)
    return {**d, "renewed": "the calling run's lease"} if ctx.lease_held_by_caller else d


def a_release_lease(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    handle = ctx.hosts.leases.get(role)
    if handle is None:
        return {"skipped": "no lease held by this run"}
    released = leasing.release(ctx, role, handle)
    ctx.hosts.lease_released(role)
    return {"released": True} if released else {"kept": "held by the calling run, which releases it"}


def a_prepare(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    f, layout = ctx.hosts.facts.get(role), ctx.layout(role)
    linked = layout.state is None or ctx.t(role).readlink(layout.run) == layout.state  # run/ -> state_dir
    if f is not None and f.svc_sha256 == svc_sha256() and linked:
        d: dict[str, Any] = {"helper": "up to date"}
    else:
        install_helper(ctx.t(role), ctx.layout(role))
        d = {"helper": "installed", "sha256": svc_sha256()}
    if ctx.layout(role).manager.units:
        d |= _check_manager(ctx, role)
        if step.pair is not None:
            d["unit_verified"] = verify_unit_before_change(ctx, role, step.pair)
    if (svc_user := ctx.inventory.host(ctx.host(role)).service_user) is not None:
        d["service_user"] = _check_service_user(ctx, role, svc_user, step.pair)
    if role == "native" and step.pair is not None:
        d["models"] = _hash_models(ctx)
        if files := _hash_files(ctx, step.pair):
            d["files"] = files
    return d


# id and setpriv as the host has them; each path the service reads is tried as that user
_SERVICE_USER_SH = (
    'u=$1; shift; id -u -- "$u" || exit 2; command -v setpriv >/dev/null || exit 3; g=$(id -g -- "$u"); '
    'for p in "$@"; do setpriv --reuid="$u" --regid="$g" --init-groups -- test -r "$p" || echo "unreadable=$p"; done'
)


def _check_service_user(ctx: RunEnv, role: str, user: str, tgt: Target | None) -> dict[str, Any]:
    """The inventory's service_user exists on the host (not as root), setpriv is there and (native
    host) it can read every model and declared file the servers load, before any change: the
    supervisor starts nothing without them, and a rollback would fail the same way."""
    paths: list[str] = []
    if role == "native":
        paths = [m.path for m in ctx.inventory.pair(ctx.view.name).models.values()]
        if tgt is not None:
            paths += sorted(tgt.entry.profile.get("files") or {})
    res = ctx.t(role).run(Cmd(("sh", "-c", _SERVICE_USER_SH, "_", user, *paths)), check=False, timeout=120)
    lines = as_text(res.stdout).split()
    unreadable = [ln.removeprefix("unreadable=") for ln in lines if ln.startswith("unreadable=")]
    why = {2: "does not exist", 3: "exists, but setpriv (util-linux) is not installed"}.get(res.exit_status)
    if why is None and lines[:1] == ["0"]:
        why = "is root"
    if why is None and unreadable:
        why = f"cannot read {', '.join(unreadable[:4])}"
    if why is None and res.exit_status != 0:
        why = f"could not be checked (exit {res.exit_status})"
    if why is not None:
        raise HostStateError(
            f"{ctx.host(role)}: service_user {user} {why} on this host; nothing was changed",
            hint=f"create it (useradd --system --no-create-home {user}), install util-linux and let it read the "
            "models (chmod/chgrp), or remove service_user from this host in the inventory",
        )
    return {"user": user, "uid": int(lines[0]) if lines and lines[0].isdigit() else None, "checked": len(paths)}


def _check_manager(ctx: RunEnv, role: str) -> dict[str, Any]:
    """The host's service manager must answer before anything is stopped, or the start after the
    stop (and the rollback's) would fail and leave the pair down (hosts/managers)."""
    return ctx.layout(role).manager.check(ctx.t(role), ctx.layout(role), ctx.host(role))


def verify_unit_before_change(ctx: RunEnv, role: str, tgt: Target | None) -> str | None:
    """What this run's start will install (a systemd unit) is staged and checked by the host now,
    before anything is stopped (hosts/managers): one the host rejects refuses the run unchanged."""
    if not ctx.layout(role).manager.units or tgt is None:
        return None
    ex = service_exec(ctx.view, "restart-rpc" if role == "rpc" else "start-server", role, tgt.activation)
    name = ex.service or SERVICE_OF_ROLE[role]
    return ctx.layout(role).manager.verify_staged(
        ctx.t(role), ctx.layout(role), ctx.host(role), name, list(ex.service_argv), ex.sup
    )


def _hash_models(ctx: RunEnv) -> dict[str, Any]:
    """The model files the new pair will load, hashed on the native host (cached there by stat,
    so only a new or changed file costs a full read). A missing file, or one whose sha256 is not
    the one the inventory declares, refuses the deploy before anything changes (exit 6); the
    hashes go into the route entry, so status, acceptance and answer baselines know the weights."""
    models = ctx.inventory.pair(ctx.view.name).models
    if not models:
        return {}
    t0 = time.monotonic()
    found, problems = check_models(
        {n: m.path for n, m in models.items()},
        {n: m.sha256 for n, m in models.items() if m.sha256},
        ctx.host("native"),
        ctx.t("native"),
        ctx.layout("native"),
        expected_is="the inventory declares",
    )
    ctx.timed("model_hash_s", time.monotonic() - t0)
    if problems:
        raise PackageError(
            "; ".join(problems) + "; nothing was changed",
            hint="put the declared file in place (or correct models.<name>.sha256 in the inventory)",
        )
    ctx.recorder.models_hashed({name: h.sha256 for name, h in found.items()})  # they seal the route entry
    return {name: {"sha256": h.sha256, "size": h.size, "how": h.how} for name, h in sorted(found.items())}


def _hash_files(ctx: RunEnv, tgt: Target) -> dict[str, Any]:
    """The answer-changing files the profile's extra_args name (RouteProfile.files), hashed on the
    native host before anything changes: a missing file or one whose sha256 is not the declared
    one refuses the deploy (exit 6). The declared hashes are in the profile the route entry
    records, so status and acceptance re-hash the files against them."""
    files = dict(tgt.entry.profile.get("files") or {})
    if not files:
        return {}
    found, problems = check_models(
        {p: p for p in files}, files, ctx.host("native"), ctx.t("native"), ctx.layout("native"),
        expected_is="the profile declares", kind="file",
    )  # fmt: skip
    if problems:
        raise PackageError(
            "; ".join(problems) + "; nothing was changed",
            hint="put the declared file in place on the native host, or correct the profile's files.<path>",
        )
    return {p: {"sha256": h.sha256, "size": h.size, "how": h.how} for p, h in sorted(found.items())}


def a_upload(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    pkg, up = step.packages[role], step.uploads[ctx.host(role)]  # present or not: decided by the plan
    t0 = time.monotonic()
    res = ensure_release(ctx.t(role), ctx.layout(role), pkg, up.present, ctx.host(role), defer_present=True)
    ctx.timed("upload_s", time.monotonic() - t0)
    d = res.to_dict()
    ctx.recorder.uploaded(role, d)
    if res.deferred:
        ctx.hosts.defer(role, up.release, dict(up.files))
    return d


def a_secret(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    if not ctx.view.has_api_key:
        return {"skipped": "the pair has no api_key_file"}
    if step.key is None:
        raise ConfigError(f"pair {ctx.view.name}: api_key_file was not read before the secret step")
    path = put_secret(ctx.t(role), ctx.layout(role), step.key.file_bytes)
    return {"path": path, "mode": "0600"}  # never the value, never its hash


class UnreachableBeforeChange(HostError):
    """A host did not answer just before the first change (the RPC host's probe, or the native
    host's stop that never started): nothing was stopped."""

    nothing_changed = True


def _reach_before_change(ctx: RunEnv, role: str) -> float:
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


def _before_change(
    ctx: RunEnv, role: str, step: Step | None = None, *, next_within_s: float = leasing.HEARTBEAT_S
) -> None:
    """Immediately before a change on `role`'s host: the lease is still this run's (renewed;
    LeaseLost otherwise, and nothing is changed)."""
    leasing.recheck(ctx, role, next_within_s=next_within_s, restores=step is not None and step.restores)


def _space_on(ctx: RunEnv, role: str) -> int:
    """Before the first change, on one host: room for what the switch writes (route record twice,
    pidfiles, the new services' logs) and run/ and the root take new files, so a full or
    read-only disk is refused with nothing stopped. One batch of SFTP requests (free space by
    the server's statvfs, a file made and removed in each); a probe that failed is made again
    alone, for the refusal exactly as `space.require_writable` words it."""
    t, layout = ctx.t(role), ctx.layout(role)
    checks = ((layout.run, "the switch (pidfiles, logs)"), (layout.root, "the switch (current link, route record)"))
    probes = [HostClock(unique_tmp(posixpath.join(path, "write-probe"))) for path, _ in checks]
    got = fs_batch(t, [FreeBytes(layout.root), *probes])
    sp = space.free_space(t, layout.root, got[0])
    sp.require(space.SWITCH_NEEDED_BYTES, "the switch (route record, pidfiles, logs)")
    for (path, what), r in zip(checks, got[1:], strict=True):
        if not isinstance(r, FileStat):
            space.require_writable(t, path, what)
    return sp.free_bytes


def _prove_both_before_first_change(ctx: RunEnv) -> dict[str, int]:
    """What a deploy proves before its first change, on both hosts at once (each host's reads
    batched, the two hosts in parallel): the RPC host answers an exec, both leases are still
    this run's (renewed), both roots have room and take new files. Failures are raised in the
    order the checks used to run one by one: RPC reach, RPC lease, room on native, room on RPC,
    native lease."""

    def rpc_side() -> int:
        ctx.timed("rpc_reach_s", _reach_before_change(ctx, "rpc"))
        _before_change(ctx, "rpc")
        return _space_on(ctx, "rpc")

    def native_side() -> int:
        free = _space_on(ctx, "native")
        _before_change(ctx, "native")
        return free

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="before-change") as pool:
        futs = {"rpc": pool.submit(rpc_side), "native": pool.submit(native_side)}
        errors = {r: f.exception() for r, f in futs.items()}
    rpc_err, nat_err = errors["rpc"], errors["native"]
    # the RPC side's reach and lease come first; then room (native, then RPC), then native's lease
    if rpc_err is not None and not isinstance(rpc_err, (space.NoSpace, space.NotWritable)):
        raise rpc_err
    if nat_err is not None and isinstance(nat_err, (space.NoSpace, space.NotWritable)):
        raise nat_err
    if rpc_err is not None:
        raise rpc_err
    if nat_err is not None:
        raise nat_err
    return {ctx.host(r): futs[r].result() for r in ("native", "rpc")}


def _planned(ctx: RunEnv, role: str, step: Step) -> tuple[Exec, tuple[str, dict[str, str]] | None]:
    """The step's planned command for this host and, when the plan has it verify a present
    release first, that release's hashes as the upload deferred them; a plan and a run that
    disagree (no command, or no such release deferred) are refused before anything runs."""
    ex = step.execs.get(ctx.host(role))
    if ex is None:
        raise HostStateError(f"{ctx.host(role)}: the plan carries no command for this step; nothing was run")
    verify = ctx.hosts.take_deferred(role) if ex.verify_release else None
    got = verify[0] if verify else None
    if got != ex.verify_release:
        raise HostStateError(
            f"{ctx.host(role)}: the plan verifies release {ex.verify_release or 'none'} first, the run "
            f"{got or 'none'}; nothing was run"
        )
    return ex, verify


def _planned_links(ctx: RunEnv, role: str, step: Step) -> tuple[str | None, str | None]:
    """The (current, previous) links the plan put on this host's step (decided there, never here)."""
    links = step.links.get(ctx.host(role))
    if links is None:
        raise HostStateError(f"{ctx.host(role)}: the plan carries no links for this step; nothing was changed")
    return links


def _ran(ex: Exec) -> dict[str, Any]:
    """What the receipt records of a planned command: its argv as shown (secrets masked) and bound."""
    return {"argv": list(ex.argv()), "bound_s": ex.bound_s}


def a_stop(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    t0 = time.monotonic()
    if not step.restores and role == "native":
        try:  # the first change: both hosts reached and both leases proven this run's first
            free = _prove_both_before_first_change(ctx)
        except HostError as exc:
            if getattr(exc, "nothing_changed", False):  # a full disk, or a host already named unreachable
                raise
            # a host lost since `lease` (the lease re-check could not reach it): still a refusal
            raise UnreachableBeforeChange(
                f"{exc}; just before the first change, so nothing was stopped",
                hint="the previous pair keeps serving; repair the host, then deploy again",
            ) from None
    else:
        free = None
        if role == "native" and step.pair is not None:
            # restoring needs the RPC host (restart-rpc); one that does not answer now (after the
            # reconnect budget) means nothing can be restored, and stopping native would only take
            # down the half that still serves (issue 33: the model traffic between them was fine)
            ctx.timed("rpc_reach_s", _reach_before_change(ctx, "rpc"))
            _writable_for_restore(ctx, step.pair, writes_route=step.route is None or step.route.record is not None)
        _before_change(ctx, role, step)
    ex, verify = _planned(ctx, role, step)
    try:
        out, verified = services.stop(ctx.t(role), ctx.layout(role), SERVICE_OF_ROLE[role], verify=verify, cmd=ex.cmd)
    except HostError as exc:
        if not step.restores and role == "native" and never_ran(exc):  # the first change never started
            raise UnreachableBeforeChange(
                f"{ctx.host(role)} could not be reached to stop {SERVICE_OF_ROLE[role]}, so nothing was stopped: {exc}",
                hint="the previous pair keeps serving; repair the host, then deploy again",
            ) from None
        raise
    ctx.timed("stop_s", time.monotonic() - t0)
    d: dict[str, Any] = {"result": out, **_ran(ex)}
    if free is not None:
        d["free_bytes"] = free
    if verify:
        d["release_verified"] = {"release": verify[0], "files": verified}
    return d


def a_switch(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    cur, prev = _planned_links(ctx, role, step)
    _before_change(ctx, role, step)
    if not step.restores:
        ctx.recorder.switched(role)
    try:
        switch_links(ctx.t(role), ctx.layout(role), cur, prev)
    except (HostError, OSError) as exc:  # a rollback on a read-only root whose `current` is already right
        if not (step.restores and space.refuses_writes(str(exc)) and _current_on(ctx, role) == cur):
            raise
        return {"current": cur, "previous": "left as it was: " + str(exc).splitlines()[0][:200]}
    return {"current": cur, "previous": prev}


def a_restart_rpc(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    t, layout = ctx.t("rpc"), ctx.layout("rpc")
    links = _planned_links(ctx, "rpc", step)
    tgt = step.pair
    _before_change(ctx, "rpc", step)
    t0 = time.monotonic()
    if tgt is None:  # nothing to restore: stop, put the links back as found, start nothing
        ex, _ = _planned(ctx, "rpc", step)
        out, _ = services.stop(t, layout, RPC_SERVER, cmd=ex.cmd)
        switch_links(t, layout, *links)
        ctx.timed("stop_s", time.monotonic() - t0)
        return {
            "stopped": out,
            "current": links[0],
            "previous": links[1],
            "started": "nothing (no previous pair)",
        } | _ran(ex)
    _one_revision_before_start(ctx, tgt.activation, RPC_SERVER)
    # whatever starts ggml-rpc-server (deploy, rollback, restart) puts its guard there first: the
    # supervisor preloads it and starts nothing without it (hosts/rpc_guard.py)
    guard = install_guard(t, layout)
    key = install_route_key((ctx.t("native"), ctx.layout("native")), (t, layout))
    ex, verify = _planned(ctx, "rpc", step)
    if not step.restores:
        ctx.recorder.switched("rpc")
    units: services.Units = {}
    try:
        pid, ident, stopped, verified = services.restart_listening(
            t, layout, RPC_SERVER, links, ctx.view.rpc_bind, ctx.view.rpc_port, list(ex.service_argv),
            verify=verify, sup=ex.sup, units=units, cmd=ex.cmd,
        )  # fmt: skip
    except space.NotWritable as exc:
        kept = _keep_unchanged_rpc(ctx, links, exc) if step.restores else None
        if kept is None:
            raise
        return {**kept, **_ran(ex)}
    ctx.timed("rpc_restart_to_listening_s", time.monotonic() - t0)
    ctx.hosts.started("rpc", ident)
    d: dict[str, Any] = {
        "stopped": stopped,
        "current": links[0],
        "previous": links[1],
        "pid": pid,
        "listening": f"{ctx.view.rpc_bind}:{ctx.view.rpc_port}",
        "exe_sha256": ident.exe_sha256,
        "rpc_guard": guard,
        "rpc_route_key_id": key,
        "boot": _boot_entry(ctx, "rpc", units.get(RPC_SERVER)),
        **_ran(ex),
    }
    if verify:
        d["release_verified"] = {"release": verify[0], "files": verified}
    return d


def _writable_for_restore(ctx: RunEnv, tgt: Target, *, writes_route: bool) -> None:
    """Before a rollback stops native: the roots it will write take a new file (native's always,
    the RPC host's unless `current` there already names the release restored, whose server
    restart-rpc keeps). One that does not refuses here with nothing stopped: stopping first left
    both services down with neither able to start again, where what ran kept serving (issue 49).
    Native's root itself only when its links change or the plan writes the route record there
    (run/ may be a state_dir outside it)."""
    roles = ("native",) if _current_on(ctx, "rpc") == tgt.activation.rpc_package else ("native", "rpc")
    for role in roles:
        keep = role == "native" and not writes_route and _current_on(ctx, role) == tgt.activation.native_package
        for path in (ctx.layout(role).run,) if keep else (ctx.layout(role).run, ctx.layout(role).root):
            try:
                space.require_writable(ctx.t(role), path, "the rollback (links, pidfiles, logs)")
            except space.NotWritable as exc:
                # only a root that refuses the file (a full one that still takes it goes on, as
                # before); a host lost meanwhile fails the steps as it did
                if space.refuses_writes(exc.message):
                    raise
            except DiskFull:
                pass


def _keep_unchanged_rpc(
    ctx: RunEnv, links: tuple[str | None, str | None], exc: space.NotWritable
) -> dict[str, Any] | None:
    """A rollback's restart-rpc on an RPC root that takes no new file (refused before anything
    was stopped): when `current` there already names the release being restored and its
    ggml-rpc-server still runs, that server is kept (verify then proves its identity, exe and
    argv) instead of failing the rollback, which stopped both services although the RPC side
    never changed. None (the refusal stands) in a deploy, or when anything else runs there."""
    if links[0] is None or _current_on(ctx, "rpc") != links[0]:
        return None
    try:
        ident = read_identities({"rpc": ctx.t("rpc")}, ctx.view.layouts, roles=("rpc",))["rpc"]
    except (HostError, OSError):
        return None
    if ident is None or ident.pid is None:
        return None
    pid = ident.pid
    ctx.journal.note(
        f"{ctx.host('rpc')}: the install root takes no new file ({exc.message[:200]}); its ggml-rpc-server "
        f"(pid {pid}) already runs release {links[0]}, the one being restored: kept running, verify proves it"
    )
    return {
        "kept": f"ggml-rpc-server pid {pid} (root not writable; already the pair being restored)",
        "current": links[0],
        "pid": pid,
    }


def _current_on(ctx: RunEnv, role: str) -> str | None:
    """The release `current` names on ROLE's host now (read over SFTP, not from this run's facts)."""
    try:
        return release_of_link(ctx.t(role).readlink(ctx.layout(role).current) or "-", ctx.layout(role).root)
    except ProbeError as exc:
        raise HostStateError(f"{ctx.host(role)}: {ctx.layout(role).current}: {exc}") from None


def _one_revision_before_start(ctx: RunEnv, act: Activation, service: str, *, links: bool = False) -> None:
    """Before any start: the pair being started is of one source revision (build/revisions.py);
    with `links`, so are the releases both hosts' `current` links name right now (what a step
    that timed out, another tool or a hand edit may have changed since this run read them)."""
    store = PackageStore(ctx.home.store)
    what = f"starting {service} on {ctx.host('native' if service == LLAMA_SERVER else 'rpc')}"
    require_one_revision(store, ctx.view.name, act.native_package, act.rpc_package, what=what)
    if not links:
        return
    cur = {r: _current_on(ctx, r) for r in ROLES}
    problem = mixed_problem(store, cur["native"], cur["rpc"])
    if cur["native"] != act.native_package or problem:
        raise HostStateError(
            f"pair {ctx.view.name}: {what} refused, nothing was started: current names "
            f"{cur['native'] or 'nothing'} on {ctx.host('native')} and {cur['rpc'] or 'nothing'} on "
            f"{ctx.host('rpc')}" + (f"; {problem}" if problem else f", not {act.native_package}"),
            hint=f"`pairctl status --pair {ctx.view.name}` shows both hosts; deploy one revision to both",
        )


def a_start_server(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    tgt = step.pair
    if tgt is None:
        return {"skipped": "no previous pair to start"}
    t, layout = ctx.t("native"), ctx.layout("native")
    ex, _ = _planned(ctx, "native", step)
    _before_change(ctx, "native", step)
    _one_revision_before_start(ctx, tgt.activation, LLAMA_SERVER, links=True)
    t0 = time.monotonic()
    units: services.Units = {}
    pid, ident = services.start(t, layout, LLAMA_SERVER, list(ex.service_argv), ex.sup, units=units, cmd=ex.cmd)
    ctx.hosts.started("native", ident)
    t1 = time.monotonic()
    try:
        w = services.wait_health(t, layout, ctx.view.base_url, pid, log=ctx.log)
    except CheckFailed as exc:
        # llama-server often dies of its RPC peer ("recv failed" when ggml-rpc-server aborted on a
        # graph): the peer's output holds the cause, so the failure names it too.
        rpc_out = ctx.layout("rpc").log(RPC_SERVER + ".out")
        raise CheckFailed(
            f"{exc}\nand {ctx.host('rpc')}'s {rpc_out} ends:\n" + services.read_tail(ctx.t("rpc"), rpc_out, 8)
        ) from None
    ctx.timed("server_start_exec_s", t1 - t0)
    ctx.timed("server_start_to_healthy_s", time.monotonic() - t1)
    return {
        "pid": pid,
        "exe_sha256": ident.exe_sha256,
        "healthy_after_s": round(w.seconds, 4),
        "health_polls": w.polls,
        "alive_checks": w.alive_checks,
        "boot": _boot_entry(ctx, "native", units.get(LLAMA_SERVER)),
        **_ran(ex),
    }


def _boot_entry(ctx: RunEnv, role: str, unit: UnitReadback | None = None) -> dict[str, Any]:
    """After a start: what brings the service back at boot, as the host's manager keeps it
    (hosts/managers). Recorded, never a failure of the step: "no boot persistence" says so."""
    t0 = time.monotonic()
    out = ctx.layout(role).manager.boot_after_start(ctx.t(role), ctx.layout(role), unit)
    ctx.timed("boot_entry_s", time.monotonic() - t0)
    if out.get("warning"):
        ctx.log.warning("boot persistence", host=ctx.host(role), warning=out["warning"])
    return dict(out)


def a_verify(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    tgt = step.pair
    if tgt is None:
        return {"skipped": "no previous pair: nothing runs"}
    if tgt.expected is None:
        raise PackageError(
            f"cannot verify {tgt.activation.native_package} / {tgt.activation.rpc_package}: "
            "their manifests are not in the local package store"
        )
    ident = ctx.hosts.identity(role)
    seen = {role: ident} if ident is not None else None
    rep = verify_identity(
        {role: ctx.t(role)},
        ctx.view.layouts,
        ctx.view.hosts,
        tgt.expected,
        base_url=ctx.view.base_url,
        api_key=step.key.value if step.key is not None else None,
        roles=(role,),
        seen=seen,
    )
    ctx.journal.identity(ctx.host(role), {**rep.data, "problems": rep.problems, "label": tgt.activation.label})
    if rep.problems:
        raise CheckFailed("identity does not match: " + "; ".join(rep.problems))
    return {"identity": "verified", **{k: v for k, v in rep.data.items() if k == "server"}}


def _room_for_route(ctx: RunEnv, data: bytes, sha: str) -> None:
    """Before either host's record is written: both install roots take a file of the record's
    size (one SFTP write and remove each, checked once for both hosts' steps). A root that
    filled up or went read-only after the switch's own check otherwise took the record on one
    host only: records of two revisions, which only `repair` resolved (issue 33 item 9)."""

    def probe() -> None:
        for r in ROLES:
            t, root = ctx.t(r), ctx.layout(r).root
            tmp = unique_tmp(f"{root}/route-room")
            try:
                t.put_bytes(data, tmp, mode=0o600)
                t.remove(tmp)
            except (HostError, OSError) as exc:
                if not space.refuses_writes(str(exc)):
                    raise  # not about room (a host lost): the step fails as it would have
                raise space.NotWritable(
                    f"{ctx.host(r)}: {root} does not take the route record ({str(exc).splitlines()[0][:200]}); "
                    "the record was written on neither host",
                    hint=f"free space under {root} on {ctx.host(r)} or make it writable (`df {root}`, `mount`)",
                ) from None

    ctx.recorder.room_once(sha, probe)


_SAME = "byte-identical"


def _write_route(ctx: RunEnv, role: str, step: Step, rec: RouteRecord) -> str:
    """The step's planned record onto ROLE's host by compare-and-swap on the bytes this run read
    (or wrote) there, once both roots proved they take it; read back byte-identical."""
    data = rec.to_bytes()
    sha = sha256_bytes(data)
    _room_for_route(ctx, data, sha)
    _before_change(ctx, role, step)
    try:
        back = cas_write(ctx.t(role), ctx.layout(role).route, ctx.hosts.route_bytes(role), data)
    except RouteConflict as exc:
        # never retry stale bytes: what is there now becomes the base, and whoever writes next
        # (this run's rollback) decides again from it
        if step.action == "route":
            try:
                ctx.hosts.route_seen(role, ctx.t(role).read_bytes(ctx.layout(role).route, max_bytes=HOST_FILE_MAX))
            except FileNotFoundError:
                pass
            raise CheckFailed(
                f"{ctx.host(role)}: {exc} (compare-and-swap refused; re-read for the next decision)"
            ) from None
        raise CheckFailed(f"{ctx.host(role)}: {exc} (compare-and-swap refused)") from None
    if back != data:
        raise CheckFailed(f"{ctx.host(role)}: route.json read back differs from what was written")
    ctx.hosts.route_written(role, data)
    return sha


def a_route(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    rec = step.route.record if step.route is not None else None
    if rec is None:
        return {"skipped": "route record unchanged (no pair was recorded by this run)"}
    sha = _write_route(ctx, role, step, rec)
    active = rec.active.names() if rec.active else None
    return {"revision": rec.revision, "active": active, "state": rec.state, "sha256": sha, "read_back": _SAME}


def a_route_accepted(ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
    """Acceptance passed (or was skipped): the record the route step wrote, `activating` ->
    `active` (the whole suite passed) or `identity-verified` (skipped or partial), same revision,
    by compare-and-swap on the bytes this run wrote (both decided by the plan)."""
    rec = step.route.settled if step.route is not None else None
    if rec is None:
        return {"skipped": "no activation recorded by this run"}
    sha = _write_route(ctx, role, step, rec)
    return {"revision": rec.revision, "state": rec.state, "sha256": sha, "read_back": _SAME}


def a_accept(ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
    from orchestrator.engine import acceptance

    tgt = step.pair
    if tgt is not None and not ctx.inputs.options.skip_accept:
        # the suite's requests are bounded (checks/budget.py): the next heartbeat comes within
        # the whole suite's bound, announced in the lease so nobody judges this run dead meanwhile
        bound = acceptance.suite_bound_s(tgt.entry.profile)
        for r in ("native", "rpc"):
            _before_change(ctx, r, step, next_within_s=bound)
    return acceptance.run(ctx, step)


def a_kernel_check(ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
    """The packages' own kernel validation harness on both hosts, before anything running changes."""
    from orchestrator.checks import kernels

    return kernels.deploy_step(ctx, role)


def a_preflight(ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
    return preflight_checks(ctx, PackageStore(ctx.home.store))


HANDLERS: dict[str, Handler] = {
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
    "route-accepted": a_route_accepted,
    "accept": a_accept,
    "kernel-check": a_kernel_check,
    "release-lease": a_release_lease,
}


def links_back(ctx: RunEnv, restore_links: Mapping[str, tuple[str | None, str | None]]) -> dict[str, str]:
    """Best effort after a failed rollback of a deploy: the links this deploy switched go back as
    it found them (by rename, under this run's lease), so they agree with the route record again
    - but only when every such host answers: putting back one host of two would leave a mixed
    pair (new links on one host, previous on the other) for `repair` to record."""
    switched = ctx.recorder.switched_roles()
    changed = [r for r in ROLES if r in switched and restore_links.get(r, (None, None))[0]]
    if not changed:
        return {"links": "none switched by this deploy"}
    for role in changed:
        try:
            leasing.recheck(ctx, role, restores=True)  # after a failed rollback
        except Exception as exc:
            return {"links": f"left as they are ({ctx.host(role)} did not answer: {str(exc)[:200]})"}
    out = {}
    for role in changed:
        cur, prev = restore_links[role]
        try:
            switch_links(ctx.t(role), ctx.layout(role), cur, prev)
            out[ctx.host(role)] = f"current {cur}, previous {prev}"
        except Exception as exc:  # keep going: the other host must get its links back too
            out[ctx.host(role)] = f"links left: {exc}"
    return out


def stop_everything(ctx: RunEnv) -> dict[str, str]:
    """Best effort, native first: used when a rollback fails (never leave a half-running pair)."""
    out = {}
    for role in ROLES:
        try:
            out[ctx.host(role)] = services.stop(ctx.t(role), ctx.layout(role), SERVICE_OF_ROLE[role])[0]
        except (HostError, OSError, Exception) as exc:  # keep going: the other host must stop too
            out[ctx.host(role)] = f"stop failed: {exc}"
    return out
