"""What a pair renders into, before any host is touched: a deploy's target (argv, route entry, the
identity verify expects), a recorded pair a restore puts back (rendered again, never the recorded
argv), and preflight, which refuses a deploy locally and decides what the plan carries.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from orchestrator.build.manifest import PackageManifest
from orchestrator.build.store import Package, PackageStore
from orchestrator.config.flags import server_policy_problems
from orchestrator.config.inventory import PairSpec, read_api_key
from orchestrator.config.profiles import RouteProfile, load_profile, profile_from_record, unknown_flags
from orchestrator.engine.context import RunEnv
from orchestrator.engine.plan import Activation, PairView, Prepared, Target
from orchestrator.errors import ConfigError, PackageError, PairctlError
from orchestrator.hosts import services, supervisor
from orchestrator.hosts.identity import Expected
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER
from orchestrator.hosts.probes import ExpectedProc
from orchestrator.hosts.release import expected_hashes
from orchestrator.hosts.route import RouteEntry


def model_paths(pair: PairSpec) -> dict[str, str]:
    return {role: m.path for role, m in pair.models.items()}


def render_target(
    view: PairView, pair: PairSpec, profile: RouteProfile, native_pkg: Package, rpc_pkg: Package, label: str = "new"
) -> Target:
    """The activation of a new pair: argv from the profile, the route entry, the identity expected."""
    nid, rid = native_pkg.manifest.id, rpc_pkg.manifest.id
    rpc_argv = services.rpc_server_argv(view.layouts["rpc"], rid, bind=view.rpc_bind, port=view.rpc_port)
    try:
        native_argv = services.llama_server_argv(
            view.layouts["native"],
            nid,
            profile,
            model_paths=model_paths(pair),
            host=view.server_bind,
            port=view.server_port,
            rpc=[f"{view.rpc_bind}:{view.rpc_port}"],
            with_api_key=view.has_api_key,
        )
    except ValueError as exc:
        raise ConfigError(f"profile {profile.name} does not render for pair {view.name}: {exc}") from None
    entry = RouteEntry.build(
        native_package=nid,
        rpc_package=rid,
        package_revision=native_pkg.manifest.revision,
        profile=profile.model_dump(mode="json"),
        native_argv=native_argv,
        rpc_argv=rpc_argv,
    )
    return Target(
        activation=Activation(
            nid,
            rid,
            tuple(native_argv),
            tuple(rpc_argv),
            label=label,
            files=(
                supervisor.release_files_digest(expected_hashes(native_pkg.manifest)),
                supervisor.release_files_digest(expected_hashes(rpc_pkg.manifest)),
            ),
            declared=tuple(sorted(profile.files.items())),
        ),
        entry=entry,
        expected=expected_for(entry, native_pkg.manifest, rpc_pkg.manifest, view),
    )


def expected_for(
    entry: RouteEntry, native_manifest: PackageManifest, rpc_manifest: PackageManifest, view: PairView
) -> Expected:
    profile = profile_from_record(entry.profile)
    return Expected(
        native=ExpectedProc(LLAMA_SERVER, _bin_sha(native_manifest, LLAMA_SERVER), tuple(entry.native_argv)),
        rpc=ExpectedProc(RPC_SERVER, _bin_sha(rpc_manifest, RPC_SERVER), tuple(entry.rpc_argv)),
        revision=native_manifest.revision,
        build_info=native_manifest.build_info,
        parallel=profile.parallel,
        per_slot_ctx=profile.per_slot_ctx(),
        rpc_bind=view.rpc_bind,
        rpc_port=view.rpc_port,
        rpc_peers=view.rpc_peers,
        expect_pipeline_parallel=profile.expect_pipeline_parallel,
        rpc_revision=rpc_manifest.revision,
    )


def _bin_sha(manifest: PackageManifest, name: str) -> str:
    try:
        return manifest.files[f"bin/{name}"].sha256
    except KeyError:
        raise PackageError(f"package {manifest.id} has no bin/{name}") from None


def restore_target(
    view: PairView, pair: PairSpec, entry: RouteEntry, store: PackageStore, label: str, *, trusted: bool
) -> Target:
    """A recorded pair to put back, rendered NOW (never the recorded argv) with the recorded profile
    when this home signed it (`trusted`), else the operator's profile of that name; refused before
    any change when a package is not in the store or the profile cannot be had or rendered."""
    profile: RouteProfile | str = entry.profile_name
    if trusted:
        try:
            profile = profile_from_record(entry.profile)
        except (ValueError, ConfigError):
            profile = entry.profile_name
    return render_recorded(
        view, pair, entry.native_package, entry.rpc_package, profile, dict(entry.models), store, label
    )


def render_recorded(
    view: PairView,
    pair: PairSpec,
    native_id: str,
    rpc_id: str,
    profile: RouteProfile | str,
    models: dict[str, str],
    store: PackageStore,
    label: str,
) -> Target:
    """Packages and a profile (or its name, loaded from the operator's profiles) as a target, rendered now."""
    if isinstance(profile, str):
        try:
            profile = load_profile(profile)
        except PairctlError as exc:
            raise ConfigError(
                f"pair {view.name}: the {label} pair's profile {profile!r} (named by the route "
                f"record) cannot be loaded now: {exc.message}",
                hint="restore the profile file, or deploy the pair you want with --profile",
            ) from None
    native, rpc = store.get(native_id), store.get(rpc_id)
    target = render_target(view, pair, profile, native, rpc, label=label)
    unknown = unknown_flags(list(target.activation.native_argv[1:]), native.help_text)
    if unknown:
        flags = ", ".join(sorted(set(unknown)))
        raise ConfigError(
            f"pair {view.name}: profile {profile.name} now renders flag(s) {flags} "
            f"that {label} package {native.manifest.id}'s llama-server does not offer",
            hint="deploy the pair you want with a profile that fits its package",
        )
    return with_models(target, models)


def with_models(target: Target, models: Mapping[str, str | None] | None) -> Target:
    """`target` whose route entry records these model hashes (None: as it is)."""
    return target if models is None else replace(target, entry=target.entry.model_copy(update={"models": dict(models)}))


def preflight_checks(ctx: RunEnv, store: PackageStore) -> dict[str, Any]:
    """Everything that can refuse a deploy without touching a host."""
    pair = ctx.inventory.pair(ctx.view.name)
    profile, ids = ctx.inputs.profile, ctx.inputs.package_ids
    if profile is None or ids is None:
        raise ConfigError("preflight runs in a deploy (it needs the packages and the profile)")
    nid, rid = ids
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
            raise PackageError(
                f"package {m.id} is for target {m.target.name}; pair {ctx.view.name}'s {side} host wants {want}"
            )
    target = render_target(ctx.view, pair, profile, native, rpc)
    help_text = native.help_text
    unknown = unknown_flags(list(target.activation.native_argv[1:]), help_text)
    if unknown:
        raise ConfigError(
            f"profile {profile.name} renders flag(s) {', '.join(sorted(set(unknown)))} that package {nid}'s "
            f"llama-server --help does not offer (renamed or removed in this revision)",
            hint=f"see {native.path / nm.help_file}",
        )
    key = read_api_key(ctx.view.name, pair)
    act = target.activation
    extra = list(profile.extra_args)
    policy = server_policy_problems(
        dict(pair.allow_flags),
        extra,
        list(act.native_argv[1:]),
        list(act.rpc_argv[1:]),
        help_text=help_text,
        api_key=key is not None,
        files=dict(profile.files),
    )
    if policy.problems:
        raise ConfigError(
            f"pair {ctx.view.name}, profile {profile.name}: " + "; ".join(policy.problems),
            hint="see the flag policy in docs/explanation/security.md",
        )
    ctx.recorder.prepared(Prepared({"native": native, "rpc": rpc}, key, target))
    return {
        "packages": {"native": nid, "rpc": rid},
        "revision": nm.revision,
        "content_digests": {"native": nm.content_digest, "rpc": rm.content_digest},
        "profile": profile.name,
        "profile_sha256": target.entry.profile_sha256,
        "argv_sha256": target.entry.argv_sha256,
        "native_argv": list(target.activation.native_argv),
        "rpc_argv": list(target.activation.rpc_argv),
        "allowed_flags": policy.allowed,
    }
