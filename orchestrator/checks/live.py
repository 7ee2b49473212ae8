"""Build a `CheckContext` for a deployed pair: what is active (route record), how to reach it,
how to prove its identity, and which earlier results it is compared against. `open_live` is what
`pairctl accept` calls; deploy builds its own context and calls `suite.run_suite` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from orchestrator.build.manifest import PackageManifest
from orchestrator.build.store import PackageStore
from orchestrator.checks import answer_fixtures, budget
from orchestrator.checks.base import BaselineRef, CheckContext, CheckOptions, IdentitySnapshot
from orchestrator.checks.fixtures import load_fixture_set
from orchestrator.checks.reference import ReferenceState
from orchestrator.checks.reference import load_state as load_reference
from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import RouteProfile, load_profile, profile_from_record
from orchestrator.errors import ConfigError, EvidenceError, HostError, HostStateError
from orchestrator.evidence.journal import Journal
from orchestrator.hosts.identity import Expected, verify_identity
from orchestrator.hosts.layout import LLAMA_SERVER, RPC_SERVER, HostLayout
from orchestrator.hosts.models import recorded_file_problems, recorded_files, recorded_model_problems
from orchestrator.hosts.probes import ExpectedProc
from orchestrator.hosts.route import RouteRecord, parse_route
from orchestrator.remote.command import Secret
from orchestrator.remote.pool import TransportPool
from orchestrator.remote.transport import HOST_FILE_MAX, Transport
from orchestrator.roles import ROLES, Role
from orchestrator.server.client import ServerClient
from orchestrator.server.tunnel import via_for

STEP_PREFIX = "check:"


def server_host(inventory: Inventory, pair: str) -> str:
    """Where clients reach the pair's server: its bind address, the native host's for a wildcard."""
    host = inventory.server_bind(pair)
    return inventory.hosts[inventory.pair(pair).native].address if host in ("0.0.0.0", "::", "[::]", "*", "") else host


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"http://{host}:{port}"


def base_url(inventory: Inventory, pair: str) -> str:
    return http_url(server_host(inventory, pair), inventory.pair(pair).server_port)


def read_api_key(inventory: Inventory, pair: str) -> Secret | None:
    key = inventory.api_key(pair)
    return Secret(key.value) if key else None


def read_route(transport: Transport, root: str) -> RouteRecord | None:
    """The route record on the native host (None when nothing was ever deployed)."""
    try:  # over SFTP, as deploy reads it (orchestrator.hosts.probes.read_facts)
        data = transport.read_bytes(HostLayout(root).route, max_bytes=HOST_FILE_MAX)
    except FileNotFoundError:
        data = None
    return parse_route(data)


def _manifest(store: Any, package_id: str) -> Any:
    try:
        return store.get(package_id).manifest
    except Exception:
        return None


def make_identity_probe(
    *,
    transports: dict[str, Transport],
    roots: dict[str, str],
    hosts: dict[str, str],
    inventory: Inventory,
    pair: str,
    route: Any,
    manifests: dict[str, PackageManifest],
    profile: RouteProfile,
    url: str,
    api_key: Secret | None,
) -> Callable[[], IdentitySnapshot]:
    """deploy's `verify_identity` against what the route record says is active, plus the route
    record itself (revision, argv digest) re-read each time: a change during the suite shows."""
    active = route.active

    def exe(role: Role, rel: str) -> str:
        m = manifests.get(role)
        if m is None:
            raise HostError(
                f"package {getattr(active, role + '_package')} is not in the local store; cannot check its hashes"
            )
        return m.files[rel].sha256

    expected = Expected(
        native=ExpectedProc(LLAMA_SERVER, exe("native", "bin/llama-server"), tuple(active.native_argv)),
        rpc=ExpectedProc(RPC_SERVER, exe("rpc", "bin/ggml-rpc-server"), tuple(active.rpc_argv)),
        revision=active.package_revision,
        build_info=getattr(manifests.get("native"), "build_info", None),
        parallel=profile.parallel,
        per_slot_ctx=profile.per_slot_ctx(),
        rpc_bind=inventory.rpc_bind(pair),
        rpc_port=inventory.pair(pair).rpc_port,
        rpc_peers=tuple(inventory.rpc_peers(pair)),
        expect_pipeline_parallel=profile.expect_pipeline_parallel,
        rpc_revision=getattr(manifests.get("rpc"), "revision", None),
    )
    layouts: dict[str, HostLayout] = {r: HostLayout(roots[r]) for r in ROLES}
    key = api_key.value if api_key is not None else None

    def probe() -> IdentitySnapshot:
        rep = verify_identity(transports, layouts, hosts, expected, base_url=url, api_key=key)
        now = read_route(transports["native"], roots["native"])
        data = {
            **rep.data,
            "route": {
                "revision": now.revision if now else None,
                "argv_sha256": now.active.argv_sha256 if now and now.active else None,
                "profile_sha256": now.active.profile_sha256 if now and now.active else None,
            },
        }
        problems = list(rep.problems)
        if now is None or now.active is None or now.active.argv_sha256 != active.argv_sha256:
            problems.append("the route record no longer names the pair this acceptance started with")
        if active.models:  # the weights too: a model file replaced under the server changes what it serves
            problems += recorded_model_problems(
                active.models, inventory.pair(pair).models, hosts["native"], transports["native"], layouts["native"]
            )
            data["models"] = dict(active.models)
        if recorded_files(active.profile):  # extra_args' answer-changing files (RouteProfile.files)
            problems += recorded_file_problems(active.profile, hosts["native"], transports["native"], layouts["native"])
            data["files"] = recorded_files(active.profile)
        return IdentitySnapshot(data=data, problems=tuple(problems))

    return probe


def find_baseline(
    evidence: Any,
    *,
    receipt: str | None = None,
    pair: str | None = None,
    check: str = "answer_fixtures",
    models: Mapping[str, str] | None = None,
    key: str | None = None,
) -> BaselineRef | None:
    """Check results of an earlier run: the given receipt, or the newest passed receipt of
    `pair` that holds a `check:<check>` step with results from the same model files (`models`,
    name -> sha256: answers from other weights are no baseline; a receipt that did not record
    its models is passed over). A given receipt from other weights is refused."""
    want = dict(models or {})
    if receipt:
        r = evidence.load(receipt)
        ref = baseline_from_receipt(r)
        raw = ref.raw(check)
        if raw is None:
            raise EvidenceError(f"receipt {r.sha256[:16]} has no {check} results to compare against")
        if want and dict(raw.get("models") or {}) != want:
            raise ConfigError(
                f"baseline receipt {r.sha256[:16]} answered with models "
                f"{dict(raw.get('models') or {}) or 'unrecorded'}, "
                f"this pair runs {want}: answers from other weights are no baseline",
                hint="leave out --baseline-receipt to use the newest passed run on these models (or none)",
            )
        return ref
    if pair is None:
        return None
    for r in reversed(list(evidence.iter(pair=pair))):
        if r.outcome != "passed":
            continue
        ref = baseline_from_receipt(r)
        raw = ref.raw(check)
        if raw and raw.get("results") and dict(raw.get("models") or {}) == want:
            if key is not None and raw.get("answer_key") != key:
                continue  # answers to another fixture set or from another served model
            return ref
    return None


def comparisons(
    evidence: Any,
    pair: str,
    models: Mapping[str, str],
    *,
    baseline_receipt: str | None = None,
    baseline_pair: str | None = None,
    answer_key: str | None = None,
) -> tuple[BaselineRef | None, ReferenceState | None]:
    """What a run of `pair` on these model files is compared with: the answer-fixture baseline
    and the route's reference (pin and answers). One lookup for `accept` and deploy's acceptance."""
    if evidence is None:
        return None, None
    baseline = find_baseline(
        evidence, receipt=baseline_receipt, pair=baseline_pair or pair, models=models, key=answer_key
    )
    return baseline, load_reference(evidence, pair)


def baseline_from_receipt(r: Any) -> BaselineRef:
    checks = {}
    for s in r.steps:
        if s.name.startswith(STEP_PREFIX) and isinstance(s.data.get("raw"), dict):
            checks[s.name[len(STEP_PREFIX) :]] = s.data["raw"]
    return BaselineRef(receipt=r.sha256, checks=checks)


@dataclass
class Live:
    """An opened context and what must be closed after the suite."""

    ctx: CheckContext
    route: Any
    stack: ExitStack

    def close(self) -> None:
        self.stack.close()


def open_live(
    home: Any,
    inventory: Inventory,
    pair: str,
    *,
    profile_name: str | None = None,
    baseline_receipt: str | None = None,
    baseline_pair: str | None = None,
    fixtures: str | None = None,
    options: CheckOptions | None = None,
    journal: Journal | None = None,
    evidence: Any = None,
    logger: Any = None,
    identity: bool = True,
    pool: TransportPool | None = None,
) -> Live:
    """Everything `run_suite` needs for `pair`, read from the hosts and the local stores.

    `pool`: a caller's open `TransportPool` to reuse (deploy's); it is not closed here. The
    telemetry sampler always gets connections of its own, so a slow sample never blocks a check.
    """
    spec = inventory.pair(pair)
    hosts = {"native": spec.native, "rpc": spec.rpc}
    roots = {r: inventory.host(h).install_root for r, h in hosts.items()}
    stack = ExitStack()
    try:
        if pool is None:
            pool = stack.enter_context(TransportPool(inventory))
        sampler_pool = stack.enter_context(TransportPool(inventory))
        transports = {r: pool.get(h) for r, h in hosts.items()}
        route = _active_route(transports["native"], roots["native"], pair, spec.native)
        assert route.active is not None
        if profile_name:
            profile = load_profile(profile_name, pair=inventory.pair(pair))
        else:
            profile = profile_from_record(route.active.profile)
        store = PackageStore(home.store)
        manifests = {
            "native": _manifest(store, route.active.native_package),
            "rpc": _manifest(store, route.active.rpc_package),
        }
        url = base_url(inventory, pair)
        api_key = read_api_key(inventory, pair)
        limits = budget.for_profile(profile)  # every request bounded by the work it asks for (issue 21)
        opts = options or CheckOptions(request_timeout_s=limits.completion_s)
        via = via_for(transports["native"], api_key)  # the key only inside SSH (server.tunnel)
        client = stack.enter_context(ServerClient(url, api_key=api_key, timeout=limits.control_s, via=via))
        probe = (
            make_identity_probe(
                transports=transports,
                roots=roots,
                hosts=hosts,
                inventory=inventory,
                pair=pair,
                route=route,
                manifests=manifests,
                profile=profile,
                url=url,
                api_key=api_key,
            )
            if identity
            else None
        )
        models = dict(route.active.models)
        fixture_set = load_fixture_set(fixtures) if fixtures else None
        key = answer_fixtures.answer_key(profile, models, answer_fixtures.fixture_set_for(profile, fixture_set))
        baseline, reference = comparisons(
            evidence, pair, models, baseline_receipt=baseline_receipt, baseline_pair=baseline_pair, answer_key=key
        )
        ctx = CheckContext(
            client=client,
            profile=profile,
            pair=pair,
            inventory=inventory,
            transports=transports,
            sampler_transports={r: sampler_pool.get(h) for r, h in hosts.items()},
            host_roots=roots,
            host_names=hosts,
            packages=manifests,
            journal=journal,
            api_key=api_key,
            identity_probe=probe,
            baseline=baseline,
            reference=reference,
            weights_sha256=models,
            fixtures=fixture_set,
            options=opts,
            logger=logger,
        )
        return Live(ctx=ctx, route=route, stack=stack)
    except BaseException:
        stack.close()
        raise


def _active_route(transport: Transport, root: str, pair: str, native: str) -> RouteRecord:
    """The route record, which must name an active pair: nothing to accept is the state rollback
    and repair refuse too (exit 6), not an unreachable host."""
    route = read_route(transport, root)
    if route is None or route.active is None:
        raise HostStateError(
            f"accept refused: pair {pair} was never deployed (no route record on {native}), so nothing runs to accept"
            if route is None
            else f"accept refused: pair {pair}'s route record on {native} names no active pair",
            hint=f"`pairctl deploy --pair {pair} --native ID --rpc ID` deploys and accepts a pair",
        )
    return route


def checks_arg(values: Iterable[str] | None) -> list[str]:
    """`--only a,b --only c` -> [a, b, c]."""
    out: list[str] = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out
