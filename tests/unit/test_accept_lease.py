"""Issue 21: `pairctl accept`'s lease lasts as long as its suite may (checks/budget.py), not a
fixed hour, and a heartbeat renews it while the suite runs; a lease lost meanwhile is reported.
Leases on a LocalTransport (real mkdir/rename in a temporary root, no mocks)."""

from __future__ import annotations

import shutil
import time

from orchestrator.checks import budget
from orchestrator.checks import runner as R
from orchestrator.config.profiles import load_profile
from orchestrator.hosts import leases as L
from orchestrator.remote.local import LocalTransport


def test_ttl_follows_the_suite_budget_and_the_number_of_checks():
    lab, prod = load_profile("lab"), load_profile("production")
    one, all_ = R.lease_ttl_s(lab, 1), R.lease_ttl_s(lab, 12)
    assert one == budget.suite_seconds(budget.for_profile(lab), 1) + R.LEASE_MARGIN_S
    assert all_ > one  # more checks, a longer bound
    assert R.lease_ttl_s(prod, 12) > all_  # a larger context, slower requests, a longer bound
    assert R.lease_ttl_s(None, 12) == R.FALLBACK_TTL_S
    assert R.heartbeat_s(30) == 10 and R.heartbeat_s(10_000) == R.HEARTBEAT_S and R.heartbeat_s(3) == 5


def _held(tmp_path, ttl):
    roots = []
    for name in ("native", "rpc"):
        root = tmp_path / name
        root.mkdir()
        roots.append((LocalTransport(f"h-{name}"), str(root)))
    return roots, R.hold_pair_leases(roots, owner="op@test", purpose="pairctl accept p (run r)", ttl_s=ttl)


def test_heartbeat_renews_while_the_body_runs(tmp_path):
    roots, hold = _held(tmp_path, 30)
    with hold as held:
        first = [L.lease_state(t, r).lease.heartbeat for t, r in roots]
        with R.heartbeat(held, 0.3) as lost:
            time.sleep(1.6)  # the host's clock has whole seconds: several beats, one second at least
        after = [L.lease_state(t, r).lease.heartbeat for t, r in roots]
        assert not lost
        assert all(a > f for a, f in zip(after, first, strict=True)), (first, after)
    assert all(L.lease_state(t, r).free for t, r in roots)


def test_a_lease_broken_during_the_suite_is_reported(tmp_path):
    roots, hold = _held(tmp_path, 30)
    try:
        with hold as held, R.heartbeat(held, 0.2) as lost:
            t, root = roots[1]
            shutil.rmtree(f"{root}/leases/host.lock")  # another operator breaks it and holds the host
            L.take_lease(t, root, "other@op", "maintenance", 600)
            time.sleep(1.0)
            assert lost and "gone" in lost[0], lost
    except L.LeaseError:
        pass  # releasing a lease that is another's fails: expected here
    assert L.lease_state(*roots[1]).lease.owner == "other@op"  # the other operator's lease untouched
