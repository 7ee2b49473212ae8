"""Leases: the pure parser and durations, then the real lease logic on a local directory
(LocalTransport: real mkdir/rename, no mocks). The SSH side is in tests/integration/test_leases.py."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError, LeaseError, LeaseHeldError, RollbackFailed
from orchestrator.hosts import leases as L
from orchestrator.remote.local import LocalTransport

T0 = datetime(2026, 12, 2, 16, 0, 0, tzinfo=timezone.utc)
NONCE = "0123456789abcdef0123456789abcdef"
GOLDEN = (
    '{"expires_at":"2026-12-02T18:00:00Z","host":"lab-native","nonce":"0123456789abcdef0123456789abcdef",'
    '"owner":"op@box","purpose":"deploy lab","schema":1,"taken_at":"2026-12-02T16:00:00Z"}\n'
)


def test_lease_json_golden_roundtrip() -> None:
    lease = L.make_lease("lab-native", "op@box", "deploy lab", 7200, nonce=NONCE, now=T0)
    assert lease.to_json().decode() == GOLDEN
    back = L.parse_lease(GOLDEN)
    assert back == lease
    assert back.expires_at - back.taken_at == timedelta(hours=2)
    assert "nonce" not in back.public() and "nonce" not in repr(back)
    assert not back.expired(T0) and back.expired(T0 + timedelta(hours=2))
    assert back.remaining_s(T0 + timedelta(hours=1)) == 3600


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: "not json", "not JSON"),
        (lambda d: "[1]", "not a JSON object"),
        (lambda d: {**d, "schema": 2}, "schema"),
        (lambda d: {k: v for k, v in d.items() if k != "owner"}, "owner"),
        (lambda d: {**d, "nonce": "XYZ"}, "hex"),
        (lambda d: {**d, "taken_at": "yesterday"}, "ISO 8601"),
        (lambda d: {**d, "taken_at": "2026-12-02T16:00:00"}, "time zone"),
        (lambda d: {**d, "expires_at": d["taken_at"]}, "not after"),
        (lambda d: {**d, "broken": "x"}, "broken"),
    ],
)
def test_parse_lease_rejects(mutate, match: str) -> None:
    d = json.loads(GOLDEN)
    m = mutate(d)
    text = m if isinstance(m, str) else json.dumps(m)
    with pytest.raises(LeaseError, match=match):
        L.parse_lease(text)
    with pytest.raises(LeaseError):
        L.parse_lease(b"\xff\xfe")


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                           ("1d", 86400), ("1.5h", 5400), (" 2H ", 7200), ("5min", 300), ("1w", 604800)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5m", "2x", "h", "5m junk", "1h-1m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_make_lease_rejects() -> None:
    with pytest.raises(ConfigError):
        L.make_lease("h", "o", "p", 0)
    with pytest.raises(ConfigError):
        L.make_lease("h", "o", "p", 30 * 86400)
    with pytest.raises(ConfigError):
        L.make_lease("h", " ", "p", 60)
    with pytest.raises(ConfigError):
        L.make_lease("h", "o", "p", 60, nonce="not-hex")


# -- the real logic on a local directory --------------------------------------------------------


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return LocalTransport("h1"), str(root)


def lock_dir(root: str) -> str:
    return os.path.join(root, "leases", "host.lock")


def test_take_show_release(host) -> None:
    t, root = host
    assert L.lease_state(t, root).state == "free"
    lease = L.take_lease(t, root, "op", "deploy", 600)
    st = L.lease_state(t, root)
    assert st.state == "held" and st.lease == lease
    assert oct(os.stat(lock_dir(root)).st_mode & 0o777) == "0o755"
    assert oct(os.stat(os.path.join(lock_dir(root), "lease.json")).st_mode & 0o777) == "0o644"
    released = L.release_lease(t, root, lease.nonce)
    assert released.nonce == lease.nonce
    assert L.lease_state(t, root).state == "free"
    assert os.listdir(os.path.join(root, "leases")) == []  # no tombstones left


def test_second_taker_refused_with_holder(host) -> None:
    t, root = host
    L.take_lease(t, root, "alice@a", "deploy B", 3600)
    with pytest.raises(LeaseHeldError, match=r"leased by alice@a for 'deploy B' until .*Z \(60 min left\)"):
        L.take_lease(t, root, "bob@b", "qualify", 60)


def test_wrong_nonce_refused_and_lease_untouched(host) -> None:
    t, root = host
    lease = L.take_lease(t, root, "op", "deploy", 600)
    before = open(os.path.join(lock_dir(root), "lease.json"), "rb").read()
    with pytest.raises(LeaseError, match="wrong nonce"):
        L.release_lease(t, root, "f" * 32)
    assert open(os.path.join(lock_dir(root), "lease.json"), "rb").read() == before
    with pytest.raises(LeaseError, match="no lease is held"):
        L.release_lease(LocalTransport("h2"), os.path.join(root, "elsewhere"), lease.nonce)


def test_expired_lease_broken_only_on_request(host) -> None:
    t, root = host
    old = L.take_lease(t, root, "old-op", "stale", 1)
    time.sleep(1.1)
    with pytest.raises(LeaseHeldError, match="EXPIRED") as ei:
        L.take_lease(t, root, "new-op", "deploy", 60)
    assert "--break-expired" in str(ei.value)
    new = L.take_lease(t, root, "new-op", "deploy", 60, break_expired=True)
    assert new.broken is not None
    assert new.broken["state"] == "expired" and new.broken["lease"]["owner"] == "old-op"
    assert new.broken["broken_by"] == "new-op" and "nonce" not in new.broken["lease"]
    # the record is also in the new lease.json, so `show` can tell
    assert L.read_lease(t, root).broken == new.broken
    with pytest.raises(LeaseError, match="wrong nonce"):
        L.release_lease(t, root, old.nonce)


def test_live_lease_never_broken(host) -> None:
    t, root = host
    L.take_lease(t, root, "op", "deploy", 600)
    with pytest.raises(LeaseHeldError, match="leased by op"):
        L.take_lease(t, root, "x", "y", 60, break_expired=True)


def test_run_lease_broken_only_for_that_run(host) -> None:
    """`lease release --dead-run` breaks a held lease only when its purpose names that run (the
    caller has proven the run over); another run's or a hand-taken lease is left as found."""
    t, root = host
    assert L.parse_run_of("pairctl deploy lab (run 20261202T214826Z-5039-735202)") == "20261202T214826Z-5039-735202"
    assert L.parse_run_of("manual maintenance") is None and L.parse_run_of("(run x) trailing") is None
    assert L.break_run_lease(t, root, "r1", by="op", why="killed") is None  # free: nothing to do
    L.take_lease(t, root, "op", "pairctl deploy lab (run r2)", 600)
    before = open(os.path.join(lock_dir(root), "lease.json"), "rb").read()
    with pytest.raises(LeaseError, match="not run r1's lease: .*run r2"):
        L.break_run_lease(t, root, "r1", by="op", why="killed")
    assert open(os.path.join(lock_dir(root), "lease.json"), "rb").read() == before
    rec = L.break_run_lease(t, root, "r2", by="op2", why="run over: killed")
    assert rec["state"] == "held" and rec["lease"]["purpose"].endswith("(run r2)") and rec["broken_by"] == "op2"
    assert rec["why"] == "run over: killed" and "nonce" not in rec["lease"]
    assert L.lease_state(t, root).free and os.listdir(os.path.join(root, "leases")) == []
    L.take_lease(t, root, "op", "manual maintenance", 600)
    with pytest.raises(LeaseError, match="not run r2's lease"):
        L.break_run_lease(t, root, "r2", by="op", why="killed")


def test_renew_extends_only_the_holders_live_lease(host) -> None:
    """A run holding a pair across steps (qualification) renews its lease; a wrong nonce, a
    released or an expired lease is refused and nothing on the host changes."""
    t, root = host
    lease = L.take_lease(t, root, "op", "pairctl qualify lab (run q1)", 60)
    file = os.path.join(lock_dir(root), "lease.json")
    renewed = L.renew_lease(t, root, lease.nonce, 3600)
    assert renewed.nonce == lease.nonce and renewed.taken_at == lease.taken_at and renewed.purpose == lease.purpose
    assert 3590 <= renewed.remaining_s() <= 3600 and L.read_lease(t, root) == renewed
    assert L.renew_lease(t, root, lease.nonce, 60) == renewed  # never shortened
    assert os.listdir(lock_dir(root)) == ["lease.json"]  # no temp file left
    before = open(file, "rb").read()
    with pytest.raises(LeaseError, match="cannot renew: the lease this run holds is gone .*leased by op"):
        L.renew_lease(t, root, "f" * 32, 3600)
    assert open(file, "rb").read() == before
    L.release_lease(t, root, lease.nonce)
    with pytest.raises(LeaseError, match="gone .*free"):
        L.renew_lease(t, root, lease.nonce, 3600)
    assert L.lease_state(t, root).free
    short = L.take_lease(t, root, "op", "q2", 1)
    time.sleep(1.1)
    with pytest.raises(LeaseError, match="EXPIRED.*may already be someone else's"):
        L.renew_lease(t, root, short.nonce, 3600)
    assert L.lease_state(t, root).state == "expired"


def test_half_made_lease_is_held_until_grace(host) -> None:
    t, root = host
    os.makedirs(lock_dir(root))  # a taker killed between mkdir and writing lease.json
    st = L.lease_state(t, root)
    assert st.state == "half-made" and "holder unknown" in st.describe()
    with pytest.raises(LeaseHeldError, match="holder unknown"):
        L.take_lease(t, root, "x", "y", 60, break_expired=True)  # too young to break
    old = time.time() - 600
    os.utime(lock_dir(root), (old, old))
    with pytest.raises(LeaseHeldError, match="holder unknown"):
        L.take_lease(t, root, "x", "y", 60)  # old, but breaking needs the flag
    lease = L.take_lease(t, root, "x", "y", 60, break_expired=True)
    assert lease.broken["state"] == "half-made" and lease.broken["lease"] is None


def test_unreadable_lease_never_broken(host) -> None:
    t, root = host
    os.makedirs(lock_dir(root))
    with open(os.path.join(lock_dir(root), "lease.json"), "w") as f:
        f.write("{garbage")
    old = time.time() - 10_000
    os.utime(lock_dir(root), (old, old))
    st = L.lease_state(t, root)
    assert st.state == "unreadable"
    with pytest.raises(LeaseHeldError, match="unreadable"):
        L.take_lease(t, root, "x", "y", 60, break_expired=True)


def test_concurrent_takers_exactly_one_wins(host) -> None:
    t, root = host
    results: list[object] = []
    barrier = threading.Barrier(8)

    def taker(i: int) -> None:
        barrier.wait()
        try:
            results.append(L.take_lease(LocalTransport("h1"), root, f"op{i}", "race", 60))
        except LeaseHeldError as exc:
            results.append(exc)

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    winners = [r for r in results if isinstance(r, L.Lease)]
    assert len(winners) == 1, results
    assert L.read_lease(t, root).nonce == winners[0].nonce


def test_take_leases_releases_first_when_second_fails(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    ta, tb = LocalTransport("host-a"), LocalTransport("host-b")
    L.take_lease(tb, str(b), "someone", "busy", 600)
    with pytest.raises(LeaseHeldError, match="someone"):
        L.take_leases([(tb, str(b)), (ta, str(a))], "op", "deploy", 60)
    assert L.lease_state(ta, str(a)).state == "free"  # taken first (name order), then given back


def test_hold_pair_leases_releases_on_every_path(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    pair = [(LocalTransport("n"), str(a)), (LocalTransport("r"), str(b))]
    with L.hold_pair_leases(pair, owner="op", purpose="deploy", ttl_s=60) as held:
        assert [l.host for l in held.leases] == ["n", "r"]
        assert all(L.lease_state(t, r).state == "held" for t, r in pair)
        assert [h["owner"] for h in held.public()["hosts"]] == ["op", "op"] and "nonce" not in str(held.public())
    assert all(L.lease_state(t, r).state == "free" for t, r in pair)
    assert held.end() == {"released": ["n", "r"]}

    with pytest.raises(RuntimeError, match="boom"):
        with L.hold_pair_leases(pair, owner="op", purpose="deploy", ttl_s=60):
            raise RuntimeError("boom")
    assert all(L.lease_state(t, r).state == "free" for t, r in pair)

    # a failed rollback keeps both leases: nobody deploys onto an unknown state
    with pytest.raises(RollbackFailed) as ei:
        with L.hold_pair_leases(pair, owner="op", purpose="deploy", ttl_s=60):
            raise RollbackFailed("rollback failed")
    assert all(L.lease_state(t, r).state == "held" for t, r in pair)
    assert any("leases KEPT" in n for n in getattr(ei.value, "__notes__", []))


def test_hold_pair_leases_release_failure_after_the_body_raises_or_is_recorded(tmp_path) -> None:
    """After a body that did its work, a lease that cannot be released (here: someone broke and
    re-took it) raises by default; with record_release_error it is only recorded in `ended`."""
    a = tmp_path / "a"
    a.mkdir()
    t = LocalTransport("n")

    def steal() -> None:
        os.rename(lock_dir(str(a)), str(a / "leases" / ".stolen"))
        L.take_lease(t, str(a), "thief", "other", 60)

    with pytest.raises(LeaseError, match="release failed on n"):
        with L.hold_pair_leases([(t, str(a))], owner="op", purpose="q", ttl_s=60):
            steal()
    shutil.rmtree(a / "leases")
    with L.hold_pair_leases([(t, str(a))], owner="op", purpose="q", ttl_s=60, record_release_error=True) as held:
        steal()
    assert "release failed on n" in held.end()["release_failed"]
    assert L.read_lease(t, str(a)).owner == "thief"  # the other holder's lease is untouched

