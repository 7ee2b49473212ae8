"""Actions that check and change nothing: preflight (local), kernel-check, verify (identity),
accept; those that read a host and hold it: connect, facts, lease, release-lease; and those that
put files there before anything running changes: prepare (helper, manager, service user, model
and file hashes), upload, secret. None of them changes what runs."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.build.store import PackageStore
from orchestrator.engine import leasing
from orchestrator.engine.actions.base import Action
from orchestrator.engine.activate import before_change
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Exec, Planning, Step, Target, service_exec
from orchestrator.engine.targets import preflight_checks
from orchestrator.errors import CheckFailed, ConfigError, HostStateError, PackageError
from orchestrator.hosts.identity import verify_identity
from orchestrator.hosts.layout import LEASES_LINK, SERVICE_OF_ROLE, install_helper, put_secret, svc_sha256
from orchestrator.hosts.models import check_models
from orchestrator.hosts.probes import read_facts
from orchestrator.hosts.release import ensure_release
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text


class Preflight(Action, name="preflight", local=True):
    def execute(self, ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
        return preflight_checks(ctx, PackageStore(ctx.home.store))


class KernelCheck(Action, name="kernel-check", uses_pair=True):
    def execute(self, ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
        from orchestrator.checks import kernels

        assert step.kernel is not None  # planned only with --kernel-check
        return kernels.deploy_step(ctx, step.kernel)


class Verify(Action, name="verify", uses_pair=True, uses_key=True):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
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


class Accept(Action, name="accept", local=True, uses_pair=True, uses_key=True):
    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        return "acceptance checks: " + (", ".join(p.checks) if p.checks else "the suite's defaults"), {}

    def execute(self, ctx: RunEnv, role: str | None, step: Step) -> dict[str, Any]:
        from orchestrator.engine import acceptance

        tgt = step.pair
        if tgt is not None and not ctx.inputs.options.skip_accept:
            # the suite's requests are bounded (checks/budget.py): the next heartbeat comes within
            # the whole suite's bound, announced in the lease so nobody judges this run dead meanwhile
            bound = acceptance.suite_bound_s(tgt.entry.profile)
            for r in ("native", "rpc"):
                before_change(ctx, r, step, next_within_s=bound)
        return acceptance.run(ctx, step)


class Connect(Action, name="connect"):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        t0 = time.monotonic()
        t = ctx.t(role)
        connect = getattr(t, "connect", None)
        if connect is not None:
            connect()
        ctx.timed("connect_s", time.monotonic() - t0)
        return {"seconds": round(time.monotonic() - t0, 4)}


class Facts(Action, name="facts"):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        f = read_facts(ctx.t(role), ctx.layout(role), (SERVICE_OF_ROLE[role],))
        ctx.hosts.found(role, f)
        d = f.to_dict()
        if ctx.layout(role).manager.units and "install-helper" in step.may:
            # a rollback has no prepare step: its systemd host gets the helper that speaks units
            # (replaced by rename; running supervisors keep the copy they read) and the manager check;
            # its units are checked once the pair to restore is known (engine/deploy.py rollback)
            if f.svc_sha256 != svc_sha256():
                install_helper(ctx.t(role), ctx.layout(role))
                d["helper"] = "installed"
            d |= _check_manager(ctx, role)
        return d


class Lease(Action, name="lease"):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        handle = leasing.take(ctx, role)
        ctx.hosts.lease_taken(role, handle)
        d = leasing.describe(handle)
        if ctx.t(role).readlink(ctx.layout(role).leases) != LEASES_LINK:  # an older layout (or none yet)
            install_helper(ctx.t(role), ctx.layout(role))  # moves it into run/ under this lease
            d["layout"] = "links, route record and leases moved into run/"
        return {**d, "renewed": "the calling run's lease"} if ctx.lease_held_by_caller else d


class ReleaseLease(Action, name="release-lease"):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        handle = ctx.hosts.leases.get(role)
        if handle is None:
            return {"skipped": "no lease held by this run"}
        released = leasing.release(ctx, role, handle)
        ctx.hosts.lease_released(role)
        return {"released": True} if released else {"kept": "held by the calling run, which releases it"}


class Prepare(Action, name="prepare", uses_pair=True):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        f, layout = ctx.hosts.facts.get(role), ctx.layout(role)
        linked = layout.state is None or ctx.t(role).readlink(layout.run) == layout.state  # run/ -> state_dir
        if f is not None and f.svc_sha256 == svc_sha256() and linked:
            d: dict[str, Any] = {"helper": "up to date"}
        else:
            install_helper(ctx.t(role), ctx.layout(role), strict="restore" not in step.may)  # a deploy's
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
    """The inventory's service_user exists on the host (not as root), setpriv is there and it can
    read every model and declared file (native), before any change: without them nothing starts."""
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
    """The models the new pair will load, hashed on the native host (cached by stat); missing or
    undeclared sha256 refuses the deploy before any change (exit 6). The hashes go into the route entry."""
    models = ctx.inventory.pair(ctx.view.name).models
    if not models:
        return {}
    paths, declared = {n: m.path for n, m in models.items()}, {n: m.sha256 for n, m in models.items() if m.sha256}
    hint = "put the declared file in place (or correct models.<name>.sha256 in the inventory)"
    return _hashed(ctx, paths, declared, hint, "model_hash_s", expected_is="the inventory declares")


def _hash_files(ctx: RunEnv, tgt: Target) -> dict[str, Any]:
    """The answer-changing files the profile's extra_args name, hashed on the native host before
    any change: missing or not the declared sha256 refuses the deploy (exit 6)."""
    files = dict(tgt.entry.profile.get("files") or {})
    if not files:
        return {}
    hint = "put the declared file in place on the native host, or correct the profile's files.<path>"
    return _hashed(ctx, {p: p for p in files}, files, hint, None, expected_is="the profile declares", kind="file")


def _hashed(
    ctx: RunEnv, paths: dict[str, str], declared: dict[str, str], hint: str, timing: str | None, **how: str
) -> dict[str, Any]:
    """`paths` hashed on the native host against `declared`, as the receipt records them; a
    problem refuses the run, nothing changed."""
    t0 = time.monotonic()
    found, problems = check_models(paths, declared, ctx.host("native"), ctx.t("native"), ctx.layout("native"), **how)
    if timing is not None:
        ctx.timed(timing, time.monotonic() - t0)
    if problems:
        raise PackageError("; ".join(problems) + "; nothing was changed", hint=hint)
    return {k: {"sha256": h.sha256, "size": h.size, "how": h.how} for k, h in sorted(found.items())}


class Upload(Action, name="upload"):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        pkg, up = step.packages[role], step.uploads[ctx.host(role)]  # present or not: decided by the plan
        t0 = time.monotonic()
        res = ensure_release(ctx.t(role), ctx.layout(role), pkg, up.present, ctx.host(role), defer_present=True)
        ctx.timed("upload_s", time.monotonic() - t0)
        d = res.to_dict()
        ctx.recorder.uploaded(role, d)
        if res.deferred:
            ctx.hosts.defer(role, up.release, dict(up.files))
        return d


class Secret(Action, name="secret", uses_key=True):
    def execute(self, ctx: RunEnv, role: str, step: Step) -> dict[str, Any]:
        if not ctx.view.has_api_key:
            return {"skipped": "the pair has no api_key_file"}
        if step.key is None:
            raise ConfigError(f"pair {ctx.view.name}: api_key_file was not read before the secret step")
        path = put_secret(ctx.t(role), ctx.layout(role), step.key.file_bytes)
        return {"path": path, "mode": "0600"}  # never the value, never its hash
