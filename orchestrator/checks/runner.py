"""`pairctl accept` end to end: open the live context, begin a receipt, run the suite, seal."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rich.table import Table
from rich.text import Text

from orchestrator.checks import budget
from orchestrator.checks.base import CheckOptions
from orchestrator.checks.live import checks_arg, open_live
from orchestrator.checks.suite import SuiteResult, run_suite, select
from orchestrator.checks.textfile import write_acceptance
from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import RouteProfile, load_profile
from orchestrator.errors import CheckFailed, ConfigError, LeaseHeldError, PairctlError, Skipped
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.leases import HeldLeases, LeaseLost, default_owner, hold_pair_leases, hosts_of, targets_of
from orchestrator.log import get_logger
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool

if TYPE_CHECKING:
    from structlog.stdlib import BoundLogger

    from orchestrator.evidence.journal import Journal

# The accept lease lasts as long as the suite may plus a margin, renewed by a heartbeat while it runs.
LEASE_MARGIN_S = 120.0
HEARTBEAT_S = 300.0  # the heartbeat's period at most; the lease promises the next within twice that
FALLBACK_TTL_S = 3600.0  # only when no profile can be loaded before the lease (open then refuses)


def lease_ttl_s(profile: RouteProfile | None, n_checks: int) -> float:
    """How long accept's lease must last: the whole suite's bound on `profile` plus a margin."""
    if profile is None:
        return FALLBACK_TTL_S
    return round(budget.suite_seconds(budget.for_profile(profile), max(1, n_checks)) + LEASE_MARGIN_S, 1)


def heartbeat_s(ttl_s: float) -> float:
    """The renewal period: a third of the TTL (three chances before it ends), HEARTBEAT_S at most."""
    return max(5.0, min(HEARTBEAT_S, ttl_s / 3))


@contextmanager
def heartbeat(held: HeldLeases, period_s: float) -> Iterator[list[str]]:
    """Renew `held` every `period_s` while the body runs (the suite's requests may each take
    minutes). Yields a list that holds why, if a renewal found the lease lost: the caller then
    fails the run, since another operator may have acted on the pair meanwhile."""
    lost: list[str] = []
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(period_s):
            try:
                held.renew()
            except LeaseLost as exc:
                lost.append(str(exc))
                return
            except PairctlError:  # a host that did not answer this time: try again next period
                continue

    t = threading.Thread(target=beat, name="accept-lease-heartbeat", daemon=True)
    t.start()
    try:
        yield lost
    finally:
        stop.set()
        t.join(timeout=period_s + 60)


def _profile_before_open(inventory: Inventory, req: AcceptRequest) -> RouteProfile | None:
    pair = inventory.pair(req.pair)
    try:
        return load_profile(req.profile or pair.profile, pair=pair)
    except PairctlError:
        return None


@dataclass(frozen=True)
class AcceptRequest:
    pair: str
    only: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    baseline_receipt: str | None = None
    baseline_pair: str | None = None
    fixtures: str | None = None
    isolation: str = "solo"
    scheduled: bool = False
    profile: str | None = None  # size checks from this profile instead of the active one


@dataclass
class AcceptOutcome:
    suite: SuiteResult
    receipt: str | None
    route: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {**self.suite.summary(), "receipt": self.receipt, "route": self.route}

    def raise_for_verdict(self) -> None:
        if not self.suite.passed:
            bad = ", ".join(f"{r.name} ({r.verdict})" for r in self.suite.failed())
            raise CheckFailed(
                f"acceptance of pair {self.suite.pair} failed: {bad}",
                hint=f"receipt {self.receipt}; `pairctl receipts show {str(self.receipt)[:12]}` "
                "has every check's raw data",
            )


def _isolation(value: str) -> Literal["solo", "recall"]:
    if value not in ("solo", "recall"):
        raise ConfigError(f"--isolation must be solo or recall, not {value!r}")
    return "solo" if value == "solo" else "recall"


def accept_pair(home: Home, inventory: Inventory, req: AcceptRequest) -> AcceptOutcome:
    isolation = _isolation(req.isolation)
    only, skip = checks_arg(req.only), checks_arg(req.skip)
    select(only, skip)  # unknown names fail before anything is touched
    inventory.pair(req.pair)
    log = get_logger(pair=req.pair, command="accept")
    evidence = EvidenceStore(home.evidence)
    argv = (
        ["accept", "--pair", req.pair]
        + [x for o in only for x in ("--only", o)]
        + [x for s in skip for x in ("--skip", s)]
    )
    for flag, value in (
        ("--baseline-receipt", req.baseline_receipt),
        ("--baseline-pair", req.baseline_pair),
        ("--fixtures", req.fixtures),
        ("--profile", req.profile),
    ):
        if value:
            argv += [flag, value]
    try:
        journal = evidence.begin(command="accept", argv=argv, pair=req.pair, inputs={})
    except LeaseHeldError as exc:  # EvidenceBusy: another pairctl run (a deploy) is writing this pair's chain
        if not req.scheduled:
            raise
        _write_metrics(home, None, pair=req.pair, skipped=True)
        raise Skipped(f"pair {req.pair} is busy; scheduled acceptance skipped: {exc.message}") from None
    try:
        with TransportPool(inventory) as pool, ExitStack() as stack:
            try:
                with journal.step("lease", host=",".join(hosts_of(inventory, req.pair))) as st:
                    ttl = lease_ttl_s(_profile_before_open(inventory, req), len(select(only, skip)))
                    period = heartbeat_s(ttl)
                    held = stack.enter_context(
                        hold_pair_leases(
                            targets_of(inventory, pool, req.pair),
                            owner=default_owner(),
                            purpose=f"pairctl accept {req.pair} (run {journal.run_id})",
                            ttl_s=ttl,
                            stale_after_s=int(2 * period),
                        )
                    )
                    st.data["leases"] = held.public()["hosts"]
                    st.data["ttl_s"] = ttl
                    st.data["heartbeat_s"] = period
            except LeaseHeldError as exc:
                if not req.scheduled:
                    raise
                journal.finish("inconclusive", f"skipped: {exc.message}")
                _write_metrics(home, None, pair=req.pair, skipped=True)
                raise Skipped(
                    f"pair {req.pair} is leased; scheduled acceptance skipped: {exc.message}",
                    hint=f"receipt {journal.receipt_hash}",
                ) from None
            with heartbeat(held, period) as lost:
                suite, route = _run(home, inventory, req, isolation, journal, evidence, pool, only, skip, log)
            if lost:
                raise LeaseLost(
                    f"pair {req.pair}: accept's lease was lost while the suite ran ({lost[0]}); another "
                    "operator may have changed the pair, so this acceptance proves nothing",
                    hint=f"`pairctl lease show {req.pair}` names the holder; accept again once it is done",
                )
        reason = (
            "every required check passed"
            if suite.passed
            else "failed: " + ", ".join(f"{r.name} ({r.verdict}: {r.message[:200]})" for r in suite.failed())
        )
        receipt = journal.finish("passed" if suite.passed else "failed", reason)
    except BaseException:
        if not journal.finished:
            journal.__exit__(*sys.exc_info())
        raise
    _write_metrics(home, suite, pair=req.pair)
    return AcceptOutcome(suite=suite, receipt=receipt, route=route)


def _run(
    home: Home,
    inventory: Inventory,
    req: AcceptRequest,
    isolation: Literal["solo", "recall"],
    journal: Journal,
    evidence: EvidenceStore,
    pool: TransportPool,
    only: list[str],
    skip: list[str],
    log: BoundLogger,
) -> tuple[SuiteResult, dict[str, Any]]:
    with journal.step("open", host=inventory.pair(req.pair).native) as st:
        live = open_live(
            home,
            inventory,
            req.pair,
            profile_name=req.profile,
            baseline_receipt=req.baseline_receipt,
            baseline_pair=req.baseline_pair,
            fixtures=req.fixtures,
            options=CheckOptions(isolation=isolation),
            journal=journal,
            evidence=evidence,
            logger=log,
            pool=pool,
        )
        a = live.route.active
        route = {
            "revision": live.route.revision,
            "native_package": a.native_package,
            "rpc_package": a.rpc_package,
            "profile": a.profile_name,
            "profile_sha256": a.profile_sha256,
            "argv_sha256": a.argv_sha256,
            "checked_with_profile": live.ctx.profile.name,
        }
        st.data.update(
            {
                "route": route,
                "base_url": live.ctx.client.base_url,
                "baseline_receipt": live.ctx.baseline.receipt if live.ctx.baseline else None,
            }
        )
    try:
        suite = run_suite(live.ctx, only=only or None, skip=skip or None)
    finally:
        live.close()
    return suite, route


def _write_metrics(home: Any, suite: SuiteResult | None, *, pair: str, skipped: bool = False) -> None:
    """The Prometheus textfile for this pair (best effort: metrics never change the verdict)."""
    try:
        one = suite.result("one_lane_near_full") if suite else None
        tps = one.figures.get("tg_tokens_per_s") if one else None
        write_acceptance(
            home.metrics,
            pair=pair,
            now=time.time(),
            passed=bool(suite and suite.passed),
            checks={r.name: r.verdict == "passed" for r in suite.results} if suite else {},
            tokens_per_second=tps,
            skipped=skipped,
        )
    except Exception:
        get_logger(pair=pair).warning("could not write the acceptance textfile", exc_info=True)


VERDICT_STYLE = {"passed": "green", "failed": "red", "error": "red", "skipped": "yellow"}


def key_figures(r: Any, limit: int = 6) -> str:
    items = [(k, v) for k, v in r.figures.items() if v is not None][:limit]
    return ", ".join(f"{k}={v}" for k, v in items)


def render_table(console: Any, outcome: AcceptOutcome) -> None:
    s = outcome.suite
    t = Table(title=f"acceptance of pair {s.pair} (profile {s.profile})")
    for i, column in enumerate(("check", "verdict", "req", "key figures", "message")):
        t.add_column(column, overflow="fold" if i >= 3 else "ellipsis")
    for r in s.results:
        t.add_row(
            Text(r.name),
            Text(r.verdict, style=VERDICT_STYLE[r.verdict]),
            "yes" if r.required else "no",
            Text(key_figures(r)),
            Text(r.message[:300]),
        )
    console.print(t)
    if s.sampler_faults:
        console.print(f"sampler faults (not check failures): {len(s.sampler_faults)}", markup=False)
    console.print(f"{'PASSED' if s.passed else 'FAILED'}  receipt {outcome.receipt}", markup=False)
