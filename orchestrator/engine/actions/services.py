"""Actions that change what runs: stop, switch, restart-rpc, start-server, each running the
command, links and pair its plan step carries (plan.py) and proving before it what the change
needs (reach, lease, room, one revision)."""

from __future__ import annotations

import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.build.revisions import mixed_problem, require_one_revision
from orchestrator.build.store import PackageStore
from orchestrator.engine.actions.base import Action
from orchestrator.engine.activate import UnreachableBeforeChange, before_change
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Activation, Exec, Planning, Step, Target, present_release, rel_text, service_exec
from orchestrator.errors import CheckFailed, DiskFull, HostError, HostStateError
from orchestrator.hosts import services, space
from orchestrator.hosts.identity import read_identities
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, SERVICE_OF_ROLE, switch_links, unique_tmp
from orchestrator.hosts.probes import ProbeError, release_of_link
from orchestrator.hosts.rpc_guard import install_guard, install_route_key
from orchestrator.hosts.units import UnitReadback
from orchestrator.remote.transport import FileStat, FreeBytes, HostClock, fs_batch, never_ran
from orchestrator.roles import ROLES


def _reach_before_change(ctx: RunEnv, role: str) -> float:
    """Stopping native is the first change, and from there the RPC host must take a restart: one
    round trip now turns a host lost since `lease` into a refusal (exit 4), not a pair taken down (8)."""
    t0 = time.monotonic()
    try:
        ctx.t(role).run_idempotent(ctx.layout(role).alive_cmd(SERVICE_OF_ROLE[role]), check=False, timeout=30)
    except (HostError, OSError) as exc:
        raise UnreachableBeforeChange(
            f"{ctx.host(role)} did not answer just before the first change, so nothing was stopped: {exc}",
            hint="the previous pair keeps serving; repair the host, then deploy again",
        ) from None
    return time.monotonic() - t0


def _space_on(ctx: RunEnv, role: str) -> int:
    """Before the first change, on one host: room in run/ for links, record, pidfiles and logs, and
    run/ takes a new file (one SFTP batch; a failed probe redone alone for its refusal)."""
    t, run = ctx.t(role), ctx.layout(role).run
    free, probed = fs_batch(t, [FreeBytes(run), HostClock(unique_tmp(posixpath.join(run, "write-probe")))])
    sp = space.free_space(t, run, free)
    sp.require(space.SWITCH_NEEDED_BYTES, "the switch (route record, pidfiles, logs)")
    if not isinstance(probed, FileStat):
        space.require_writable(t, run, "the switch (links, route record, pidfiles, logs)")
    return sp.free_bytes


def _prove_both_before_first_change(ctx: RunEnv) -> dict[str, int]:
    """What a deploy proves before its first change, both hosts in parallel: the RPC host answers,
    both leases are still this run's, both roots have room and take new files. Failures are
    raised in a fixed order: RPC reach, RPC lease, room on native, room on RPC, native lease."""

    def rpc_side() -> int:
        ctx.timed("rpc_reach_s", _reach_before_change(ctx, "rpc"))
        before_change(ctx, "rpc")
        return _space_on(ctx, "rpc")

    def native_side() -> int:
        free = _space_on(ctx, "native")
        before_change(ctx, "native")
        return free

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="before-change") as pool:
        futs = {"rpc": pool.submit(rpc_side), "native": pool.submit(native_side)}
        errors = {r: f.exception() for r, f in futs.items()}
    rpc_err, nat_err = errors["rpc"], errors["native"]
    room = (space.NoSpace, space.NotWritable)
    # the RPC side's reach and lease come first; then room (native, then RPC), then native's lease
    order = (rpc_err if not isinstance(rpc_err, room) else None, nat_err if isinstance(nat_err, room) else None)
    if first := next((e for e in (*order, rpc_err, nat_err) if e is not None), None):
        raise first
    return {ctx.host(r): futs[r].result() for r in ("native", "rpc")}


def _planned(ctx: RunEnv, role: str, step: Step) -> tuple[Exec, tuple[str, dict[str, str]] | None]:
    """The step's planned command for this host and, when it verifies a present release first,
    that release's deferred hashes; a plan and a run that disagree are refused before anything runs."""
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


class Stop(Action, name="stop", changes=True, uses_pair=True):
    """Stop this host's service; a deploy's native stop is the first change, proven safe first."""

    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        r = p.roles[0]
        f = p.facts.get(r)
        pid = f.running.get(SERVICE_OF_ROLE[r]) if f else None
        ex = service_exec(p.view, "stop", r, p.act, verify_release=present_release(r, p.facts, p.target))
        return f"stop {SERVICE_OF_ROLE[r]}" + (f" (pid {pid})" if pid else " (not running)" if f else ""), {
            p.view.hosts[r]: ex
        }

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        t0 = time.monotonic()
        if "first-change" in step.may:
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
                # down the half that still serves
                ctx.timed("rpc_reach_s", _reach_before_change(ctx, "rpc"))
                _writable_for_restore(ctx, step.pair, step.route is not None and step.route.record is not None)
            before_change(ctx, role, step)
        ex, verify = _planned(ctx, role, step)
        try:
            out, verified = services.stop(
                ctx.t(role), ctx.layout(role), SERVICE_OF_ROLE[role], verify=verify, cmd=ex.cmd
            )
        except HostError as exc:
            if "first-change" in step.may and never_ran(exc):  # the first change never started
                raise UnreachableBeforeChange(
                    f"{ctx.host(role)} could not be reached to stop {SERVICE_OF_ROLE[role]}, "
                    f"so nothing was stopped: {exc}",
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


class Switch(Action, name="switch", changes=True):
    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        cur, prev = p.links[p.roles[0]]
        host = p.view.hosts[p.roles[0]]
        return f"{host}: current -> {rel_text(cur)}, previous -> {rel_text(prev)} (symlinks replaced by rename)", {}

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        cur, prev = _planned_links(ctx, role, step)
        before_change(ctx, role, step)
        if "switch-own" in step.may:
            ctx.recorder.switched(role)
        try:
            switch_links(ctx.t(role), ctx.layout(role), cur, prev)
        except (HostError, OSError) as exc:  # a rollback on a read-only root whose `current` is already right
            if not ("restore" in step.may and space.refuses_writes(str(exc)) and _current_on(ctx, role) == cur):
                raise
            return {"current": cur, "previous": "left as it was: " + str(exc).splitlines()[0][:200]}
        return {"current": cur, "previous": prev}


class RestartRpc(Action, name="restart-rpc", changes=True, uses_pair=True):
    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        cur, prev = p.links["rpc"]
        vr = present_release("rpc", p.facts, p.target)
        argv = {p.view.hosts["rpc"]: service_exec(p.view, "restart-rpc", "rpc", p.act, (cur, prev), verify_release=vr)}
        if p.act is None:
            return (
                f"stop ggml-rpc-server; links back: current -> {rel_text(cur)}, previous -> {rel_text(prev)}; "
                "no pair to start"
            ), argv
        return (
            f"stop ggml-rpc-server; current -> {rel_text(cur)}, previous -> {rel_text(prev)}; start it bound to "
            f"{p.view.rpc_bind}:{p.view.rpc_port}; wait until it lives and listens; read its identity"
        ), argv

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        t, layout = ctx.t("rpc"), ctx.layout("rpc")
        links = _planned_links(ctx, "rpc", step)
        tgt = step.pair
        before_change(ctx, "rpc", step)
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
        if "switch-own" in step.may:
            ctx.recorder.switched("rpc")
        units: services.Units = {}
        try:
            pid, ident, stopped, verified = services.restart_listening(
                t, layout, RPC_SERVER, links, ctx.view.rpc_bind, ctx.view.rpc_port, list(ex.service_argv),
                verify=verify, sup=ex.sup, units=units, cmd=ex.cmd,
            )  # fmt: skip
        except space.NotWritable as exc:
            kept = _keep_unchanged_rpc(ctx, links, exc) if "restore" in step.may else None
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


def _writable_for_restore(ctx: RunEnv, tgt: Target, writes_route: bool) -> None:
    """Before a rollback stops native: the run/ folders it will write take a new file, else refuse with
    what runs still serving. Not the RPC host's where `current` there names the release restored; not
    native's where its `current` does, no route record is written, pairctl's own supervisor starts it
    (a unit writes run/) and no run/llama-server.boot is left for the stop to remove (one that stays
    would start the stopped server at the next boot: the helper's stop refuses then): its restored
    llama-server's pidfiles and logs then go to the host's runtime dir (pairctl-svc.sh, issue 49)."""
    act = tgt.activation

    def writes_run(role: str, pkg: str) -> bool:
        if _current_on(ctx, role) != pkg:
            return True
        if role != "native":
            return False
        lay = ctx.layout(role)
        return writes_route or lay.manager.units or ctx.t(role).stat(lay.log(f"{LLAMA_SERVER}.boot")) is not None

    roles = tuple(r for r, pkg in (("native", act.native_package), ("rpc", act.rpc_package)) if writes_run(r, pkg))
    for role in roles:
        try:
            space.require_writable(ctx.t(role), ctx.layout(role).run, "the rollback (links, pidfiles, logs)")
        except space.NotWritable as exc:
            # only a folder that refuses the file (a full one that still takes it goes on, as
            # before); a host lost meanwhile fails the steps as it did
            if space.refuses_writes(exc.message):
                raise
        except DiskFull:
            pass


def _keep_unchanged_rpc(
    ctx: RunEnv, links: tuple[str | None, str | None], exc: space.NotWritable
) -> dict[str, Any] | None:
    """A rollback's restart-rpc on an RPC root that takes no new file: when `current` there already
    names the release restored and its server runs, keep it (verify proves it) rather than fail.
    None (the refusal stands) in a deploy, or when anything else runs there."""
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
    """Before any start: the pair started is of one revision; with `links`, so are the releases
    both hosts' `current` links name right now (a timed-out step or a hand edit may have changed them)."""
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


class StartServer(Action, name="start-server", changes=True, uses_pair=True):
    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        if p.act is None:
            return "nothing to start (no previous pair)", {}
        return f"start llama-server from releases/{p.act.native_package}; wait for {p.view.base_url}/health 200", {
            p.view.hosts["native"]: service_exec(p.view, "start-server", "native", p.act)
        }

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        tgt = step.pair
        if tgt is None:
            return {"skipped": "no previous pair to start"}
        t, layout = ctx.t("native"), ctx.layout("native")
        ex, _ = _planned(ctx, "native", step)
        before_change(ctx, "native", step)
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
            (rpc_out,) = services.files_of(ctx.t("rpc"), ctx.layout("rpc"), RPC_SERVER, RPC_SERVER + ".out")
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
