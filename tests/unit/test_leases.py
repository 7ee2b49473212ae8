"""Leases: the pure parser and durations, then the real lease logic on a local directory
(LocalTransport: real mkdir/rename, no mocks). The SSH side is in tests/integration/test_leases.py."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError, LeaseError, LeaseHeldError, RollbackFailed
from orchestrator.hosts import leases as L
from orchestrator.remote.local import LocalTransport

T0 = datetime(2026, 12, 2, 16, 0, 0, tzinfo=UTC)
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


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86400),
        ("1.5h", 5400),
        (" 2H ", 7200),
        ("5min", 300),
        ("1w", 604800),
    ],
)
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


@dataclasses.dataclass
class HostClock:
    """The host's clock, injected: the real mtime clock of the (local) host plus an offset the
    test moves, so expiry and heartbeats are tested without sleeping on the wall clock."""

    offset_s: float = 0.0

    def __call__(self, transport, leases_dir: str) -> datetime:
        return L.host_now(transport, leases_dir) + timedelta(seconds=self.offset_s)

    def advance(self, s: float) -> None:
        self.offset_s += s


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
    # the nonce releases the lease: nobody but the operator account reads it (issue 16 item 10)
    assert oct(os.stat(lock_dir(root)).st_mode & 0o777) == "0o700"
    assert oct(os.stat(os.path.join(lock_dir(root), "lease.json")).st_mode & 0o777) == "0o600"
    released = L.release_lease(t, root, lease.nonce)
    assert released.nonce == lease.nonce
    assert L.lease_state(t, root).state == "free"
    assert os.listdir(os.path.join(root, "leases")) == []  # no tombstones left


def test_a_killed_runs_clock_probe_is_swept_by_the_next_lease(host) -> None:
    """A run killed between writing and removing its clock probe left `leases/.clock.*` for
    good: the next lease taken removes those older than its stale bound, never a live one."""
    t, root = host
    leases = os.path.join(root, "leases")
    os.makedirs(leases)
    for name, age in ((".clock.dead0001", 3600), (".clock.live0002", 0)):
        open(p := os.path.join(leases, name), "wb").close()
        os.utime(p, (time.time() - age, time.time() - age))
    L.take_lease(t, root, "op", "deploy", 600, stale_after_s=90)
    assert sorted(n for n in os.listdir(leases) if n.startswith(".clock")) == [".clock.live0002"]


def test_second_taker_refused_with_holder(host) -> None:
    t, root = host
    L.take_lease(t, root, "alice@a", "deploy B", 3600)
    with pytest.raises(LeaseHeldError, match=r"leased by alice@a for 'deploy B' until .*Z \(60 min left, host time\)"):
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
    clock = HostClock()
    old = L.take_lease(t, root, "old-op", "stale", 1, clock=clock)
    clock.advance(2)
    with pytest.raises(LeaseHeldError, match="EXPIRED") as ei:
        L.take_lease(t, root, "new-op", "deploy", 60, clock=clock)
    assert "--break-expired" in str(ei.value) and "lease take h1 --break-expired" in ei.value.hint
    assert "deploy" not in ei.value.hint  # deploy has no --break-expired
    new = L.take_lease(t, root, "new-op", "deploy", 60, break_expired=True, clock=clock)
    assert new.broken is not None
    assert new.broken["state"] == "expired" and new.broken["lease"]["owner"] == "old-op"
    assert new.broken["broken_by"] == "new-op" and "nonce" not in new.broken["lease"]
    # the record is also in the new lease.json, so `show` can tell
    assert L.read_lease(t, root, clock=clock).broken == new.broken
    with pytest.raises(LeaseError, match="wrong nonce"):
        L.release_lease(t, root, old.nonce, clock=clock)


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
    clock = HostClock()
    lease = L.take_lease(t, root, "op", "pairctl qualify lab (run q1)", 60, clock=clock)
    file = os.path.join(lock_dir(root), "lease.json")
    clock.advance(30)
    renewed = L.renew_lease(t, root, lease.nonce, 3600, clock=clock)
    assert renewed.nonce == lease.nonce and renewed.taken_at == lease.taken_at and renewed.purpose == lease.purpose
    st = L.lease_state(t, root, clock=clock)
    assert 3590 <= st.remaining_s() <= 3600 and st.lease == renewed
    assert 29 <= (renewed.renewed_at - lease.taken_at).total_seconds() <= 31  # the heartbeat, host time
    assert oct(os.stat(file).st_mode & 0o777) == "0o600"
    again = L.renew_lease(t, root, lease.nonce, 60, clock=clock)
    assert again.expires_at == renewed.expires_at  # never shortened
    assert os.listdir(lock_dir(root)) == ["lease.json"]  # no temp file, no clock probe left
    before = open(file, "rb").read()
    with pytest.raises(LeaseError, match="cannot renew: the lease this run holds is gone .*leased by op"):
        L.renew_lease(t, root, "f" * 32, 3600)
    assert open(file, "rb").read() == before
    L.release_lease(t, root, lease.nonce)
    with pytest.raises(LeaseError, match="gone .*free"):
        L.renew_lease(t, root, lease.nonce, 3600)
    assert L.lease_state(t, root).free
    short = L.take_lease(t, root, "op", "q2", 1, clock=clock)
    clock.advance(2)
    with pytest.raises(L.LeaseLost, match="EXPIRED.*may already be someone else's"):
        L.renew_lease(t, root, short.nonce, 3600, clock=clock)
    assert L.lease_state(t, root, clock=clock).state == "expired"


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
        assert [lease.host for lease in held.leases] == ["n", "r"]
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
    for d in (lock_dir(str(a)), str(a / "leases" / ".stolen")):  # leases/ is a link now (layout.move_layout)
        shutil.rmtree(d)
    with L.hold_pair_leases([(t, str(a))], owner="op", purpose="q", ttl_s=60, record_release_error=True) as held:
        steal()
    assert "release failed on n" in held.end()["release_failed"]
    assert L.read_lease(t, str(a)).owner == "thief"  # the other holder's lease is untouched


# -- issue 21: time is the host's; heartbeats prove a run over ---------------------------------


@pytest.mark.parametrize("skew_h", [1, -1])
def test_expiry_is_judged_by_the_hosts_clock_never_the_operators(host, monkeypatch, skew_h: int) -> None:
    """A holder whose clock is an hour behind wrote leases expired on arrival; an operator whose
    clock is an hour ahead broke a lease with 29 minutes left. Both clocks are the operator's
    (`utcnow`): neither may move what the host's clock says."""
    t, root = host
    real = L.utcnow
    monkeypatch.setattr(L, "utcnow", lambda: real() + timedelta(hours=skew_h))  # the holder's skewed clock
    lease = L.take_lease(t, root, "holder", "pairctl deploy lab (run r-skew)", 1800)
    monkeypatch.setattr(L, "utcnow", lambda: real() - timedelta(hours=skew_h))  # the other operator's
    st = L.lease_state(t, root)
    assert st.state == "held" and 1790 <= st.remaining_s() <= 1800, st.describe()
    with pytest.raises(LeaseHeldError, match="leased by holder"):
        L.take_lease(t, root, "other", "deploy", 60, break_expired=True)
    assert L.renew_lease(t, root, lease.nonce, 1800).nonce == lease.nonce  # the holder still holds it


def test_a_stale_heartbeat_proves_the_run_over_on_the_host(host) -> None:
    """Another operator cannot see the holder's pid: the proof is the holder's heartbeat on the
    host, older than the bound the holder wrote into its lease."""
    t, root = host
    clock = HostClock()
    run = "20261203T100000Z-1-1"
    lease = L.take_lease(t, root, "a@one", f"pairctl deploy lab (run {run})", 1800, stale_after_s=60, clock=clock)
    assert L.read_lease(t, root, clock=clock).stale_after_s == 60
    clock.advance(50)
    L.renew_lease(t, root, lease.nonce, 1800, clock=clock)  # the heartbeat
    clock.advance(50)
    st = L.lease_state(t, root, clock=clock)
    assert not st.stale and re.search(r"heartbeat 5[01] s ago", st.describe())
    with pytest.raises(LeaseHeldError, match="not proven over") as ei:
        L.break_run_lease(t, root, run, by="b@two", why="heartbeat", require_stale=True, clock=clock)
    assert "fresh" in ei.value.hint
    clock.advance(12)
    st = L.lease_state(t, root, clock=clock)
    assert st.stale and "the run is over" in st.describe() and st.to_dict()["stale"] is True
    with pytest.raises(LeaseHeldError) as held:
        L.take_lease(t, root, "b@two", "deploy", 60, clock=clock)
    assert f"lease release PAIR --dead-run {run}" in held.value.hint  # the exact command
    rec = L.break_run_lease(t, root, run, by="b@two", why="heartbeat", require_stale=True, clock=clock)
    assert rec["heartbeat_age_s"] in (62, 63) and rec["broken_by"] == "b@two" and "host_time" in rec
    assert L.lease_state(t, root).free and os.listdir(os.path.join(root, "leases")) == []
    # a lease taken by a person promises no heartbeat: never stale, only expiry frees it
    L.take_lease(t, root, "op", "manual (run m1)", 600, clock=clock)
    clock.advance(590)
    assert not L.lease_state(t, root, clock=clock).stale


def test_renew_refuses_a_lease_about_to_expire(host) -> None:
    """The re-check before a change: too little time left by the host's clock is a lost lease
    (the run stops before the change), and lease.json is left as it was."""
    t, root = host
    clock = HostClock()
    lease = L.take_lease(t, root, "op", "pairctl deploy lab (run r1)", 100, clock=clock)
    before = open(os.path.join(lock_dir(root), "lease.json"), "rb").read()
    clock.advance(80)
    with pytest.raises(L.LeaseLost, match=r"(19|20) s left by the host's clock is under the 30 s"):
        L.renew_lease(t, root, lease.nonce, 100, min_left_s=30, clock=clock)
    assert open(os.path.join(lock_dir(root), "lease.json"), "rb").read() == before


def test_heartbeat_fields_round_trip_and_are_checked() -> None:
    lease = L.make_lease("h", "op", "p (run r)", 600, nonce=NONCE, now=T0, stale_after_s=120)
    lease = dataclasses.replace(lease, renewed_at=T0 + timedelta(seconds=30))
    back = L.parse_lease(lease.to_json())
    assert back == lease and back.run_id == "r" and back.heartbeat_age_s(T0 + timedelta(seconds=90)) == 60
    d = json.loads(lease.to_json())
    for bad in (0, -1, "60", True):
        with pytest.raises(LeaseError, match="stale_after_s"):
            L.parse_lease(json.dumps({**d, "stale_after_s": bad}))


def test_stale_proof_needs_every_lease_of_the_run_stale(tmp_path) -> None:
    clock = HostClock()
    pair = []
    for n in ("n", "r"):
        (tmp_path / n).mkdir()
        pair.append((LocalTransport(n), str(tmp_path / n)))
    L.take_leases(pair, "a@one", "pairctl deploy lab (run r9)", 1800, stale_after_s=60)
    (tn, rn), (tr, rr) = pair
    clock.advance(61)
    nonce = L.read_lease(tn, rn).nonce
    L.renew_lease(tr, rr, nonce, 1800, clock=clock)  # the RPC host's heartbeat is fresh
    states = [L.lease_state(t, r, clock=clock) for t, r in pair]
    with pytest.raises(LeaseHeldError, match="not proven over .*r: leased"):
        L.stale_proof(states, "r9", evidence_says="unknown run")
    clock.advance(61)
    why = L.stale_proof([L.lease_state(t, r, clock=clock) for t, r in pair], "r9")
    assert re.search(r"heartbeat ages n 12[23] s, r 6[12] s exceed its 60 s bound", why), why


def test_every_host_is_reached_before_any_lease_changes(tmp_path) -> None:
    """Issue 16 item 9: the second host's connection (where its host key is checked) fails
    before the first host's lease is taken or released."""
    from orchestrator.errors import HostKeyError

    class KeyChanged(LocalTransport):
        def connect(self) -> None:
            raise HostKeyError(f"{self.name}: host key changed")

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    good, bad = LocalTransport("host-a"), KeyChanged("host-b")
    with pytest.raises(HostKeyError):
        L.take_leases([(good, str(tmp_path / "a")), (bad, str(tmp_path / "b"))], "op", "deploy", 60)
    assert not os.path.exists(tmp_path / "a" / "leases")  # nothing was written on host-a
    lease = L.take_lease(good, str(tmp_path / "a"), "op", "deploy", 60)
    with pytest.raises(HostKeyError):
        L.release_leases([(good, str(tmp_path / "a")), (bad, str(tmp_path / "b"))], lease.nonce)
    assert L.lease_state(good, str(tmp_path / "a")).state == "held"


class _Run:
    """What engine/leasing reads of a run (RunEnv's connections, layouts and nonce)."""

    def __init__(self, root: str, nonce: str) -> None:
        self._t, self._root, self._nonce = LocalTransport("h1"), root, nonce
        self.lease_held_by_caller = False
        self.hosts = self

    def t(self, role):
        return self._t

    def layout(self, role):
        return type("Layout", (), {"root": self._root})()

    def lease_nonce(self) -> str:
        return self._nonce


def test_the_run_rechecks_its_lease_before_each_change(host) -> None:
    """Issue 21 item 2: before a change the holder proves the lease its own and renews it (the
    heartbeat, with the next one promised within the step's bound); a lease broken and re-taken
    by another operator while the holder was paused stops it before the change (exit 5,
    nothing changed)."""
    from orchestrator.engine import leasing

    t, root = host
    lease = L.take_lease(t, root, "op", "pairctl deploy lab (run r1)", 1800, stale_after_s=leasing.HEARTBEAT_S)
    run = _Run(root, lease.nonce)
    out = leasing.recheck(run, "native", next_within_s=5000)  # type: ignore[arg-type]
    now = L.read_lease(t, root)
    assert now.stale_after_s == 5000 and now.renewed_at is not None and "lease_rechecked" in out
    assert now.remaining_s(L.host_now(t, os.path.join(root, "leases"))) >= 5000  # outlives the step
    shutil.rmtree(lock_dir(root))  # another operator breaks it ...
    L.take_lease(t, root, "other", "maintenance", 600)  # ... and holds the host
    with pytest.raises(L.LeaseLost, match="gone .*leased by other") as ei:
        leasing.recheck(run, "native")  # type: ignore[arg-type]
    assert ei.value.exit_code == 5 and ei.value.nothing_changed
    assert L.read_lease(t, root).owner == "other"  # the other operator's lease untouched


def test_host_clock_without_a_writable_directory_asks_the_hosts_date(tmp_path) -> None:
    """On a full disk no probe file can be written: the clock comes from the host's `date`, so a
    run can still release or renew its lease there."""
    t = LocalTransport("h1")
    now = L.host_now(t, str(tmp_path / "no-such-dir"))
    assert abs((now - L.host_now(t, str(tmp_path))).total_seconds()) <= 2
