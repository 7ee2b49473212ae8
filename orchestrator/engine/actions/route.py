"""Actions that write the route record: route, route-accepted, route-repair, each the record its
plan step carries, by compare-and-swap on the bytes this run read (or wrote), read back
byte-identical."""

from __future__ import annotations

from typing import Any

from orchestrator.engine import leasing
from orchestrator.engine.actions.base import Action
from orchestrator.engine.activate import before_change
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Exec, Planning, Step
from orchestrator.errors import CheckFailed, HostError
from orchestrator.hashing import sha256_bytes
from orchestrator.hosts import space
from orchestrator.hosts.layout import switch_links, unique_tmp
from orchestrator.hosts.route import RouteConflict, RouteRecord, cas_write
from orchestrator.remote.transport import HOST_FILE_MAX
from orchestrator.roles import ROLES


def _room_for_route(ctx: RunEnv, data: bytes, sha: str) -> None:
    """Before either host's record is written: both roots take a file of the record's size (checked
    once for both hosts), so a root full or read-only since the switch never gets one host's record only."""

    def probe() -> None:
        for r in ROLES:
            t, root = ctx.t(r), ctx.layout(r).run  # where route.json lives (layout.py)
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
    before_change(ctx, role, step)
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


class Route(Action, name="route", changes=True, writes_route=True):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        rec = step.route.record if step.route is not None else None
        if rec is None:
            return {"skipped": "route record unchanged (no pair was recorded by this run)"}
        sha = _write_route(ctx, role, step, rec)
        active = rec.active.names() if rec.active else None
        return {"revision": rec.revision, "active": active, "state": rec.state, "sha256": sha, "read_back": _SAME}


class RouteAccepted(Action, name="route-accepted", changes=True, writes_route=True):
    """Acceptance passed (or was skipped): the route step's record settled, same revision, `active`
    or `identity-verified`, by compare-and-swap on the bytes this run wrote (decided by the plan)."""

    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        if p.skip_accept:
            return "route.json: the pair identity-verified (--skip-accept: no acceptance ran), same revision", {}
        if p.checks:
            return (
                "route.json: the pair `active` (accepted) if --checks names the whole suite, else identity-verified",
                {},
            )
        return "", {}

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        rec = step.route.settled if step.route is not None else None
        if rec is None:
            return {"skipped": "no activation recorded by this run"}
        sha = _write_route(ctx, role, step, rec)
        return {"revision": rec.revision, "state": rec.state, "sha256": sha, "read_back": _SAME}


class RouteRepair(Action, name="route-repair", writes_route=True, only_in="repair"):
    """The rebuilt record onto one host, by compare-and-swap on the bytes read there; first, a
    host whose `current` was of the other revision gets the recorded pair's links back."""

    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        rec = step.route.record if step.route is not None else None
        assert rec is not None
        relinked = step.links.get(ctx.host(role))
        if relinked is not None:
            leasing.recheck(ctx, role)
            switch_links(ctx.t(role), ctx.layout(role), *relinked)
        data = rec.to_bytes()
        try:
            back = cas_write(ctx.t(role), ctx.layout(role).route, ctx.hosts.route_bytes(role), data)
        except RouteConflict as exc:
            raise CheckFailed(f"{ctx.host(role)}: {exc} (compare-and-swap refused; run repair again)") from None
        if back != data:
            raise CheckFailed(f"{ctx.host(role)}: route.json read back differs from what was written")
        ctx.hosts.route_written(role, data)
        out: dict[str, Any] = {"revision": rec.revision, "sha256": sha256_bytes(data), "read_back": "byte-identical"}
        if relinked is not None:
            out["links_put_back"] = {"current": relinked[0], "previous": relinked[1]}
        return out
