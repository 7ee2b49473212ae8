"""engine/route_states.py against a model of what each command promises (issue 29).

A hypothesis RuleBasedStateMachine drives random sequences of deploy (accepted, skip-accept,
partial checks), failed deploy, qualify (arms, then restore, also after a failed arm),
rollback, rollback --to and repair through the transitions the engine writes, and after every
step compares the record with a model kept as plain (pair, state) values: the qualification
restores the record it found, a failed deploy leaves it as it was, only a whole suite makes a
pair accepted, and every record survives its bytes (sign, parse, verify).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orchestrator.engine import route_states as rs
from orchestrator.hosts.route import RouteEntry, RouteRecord, parse_route

KEY = b"k" * 32
PACKAGES = ("pkg-a", "pkg-b", "pkg-c")
PROFILES = ("lab", "lab-alias")


def entry(pkg: str, profile: str) -> RouteEntry:
    prof = {"name": profile, "extra_args": ["--alias", "m"] if profile == "lab-alias" else []}
    argv = ["llama-server", "-m", "/m.gguf", *prof["extra_args"]]  # type: ignore[list-item]
    return RouteEntry.build(
        native_package=pkg,
        rpc_package=pkg,
        package_revision="r" + pkg[-1],
        profile=prof,
        native_argv=argv,
        rpc_argv=["ggml-rpc-server"],
    )


Pair = tuple[str, str]  # (package, profile)
Slot = tuple[Pair, str] | None  # (pair, state)

pairs = st.tuples(st.sampled_from(PACKAGES), st.sampled_from(PROFILES))


class RouteMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rec: RouteRecord | None = None
        self.active: Slot = None
        self.previous: Slot = None
        self.runs = 0

    def _run(self) -> str:
        self.runs += 1
        return f"run-{self.runs}"

    def _write(self, rec: RouteRecord) -> None:
        old = self.rec
        rec = rec.model_copy(update={"mac": None}).sign(KEY)
        back = parse_route(rec.to_bytes())
        assert back == rec and back is not None and back.mac_ok(KEY)
        assert old is None or rec.revision > old.revision or rec.revision == old.revision
        self.rec = back

    def _deploy(self, pair: Pair) -> RouteRecord:
        return rs.activate(
            self.rec, entry(*pair), entry(*self.active[0]) if self.active else None, pair="p", run_id=self._run()
        )

    def _expect_deployed(self, pair: Pair, state: str) -> None:
        if self.active is not None and self.active[0] != pair:
            self.previous = (self.active[0], rs.settled(self.active[1]))
        self.active = (pair, state)

    @rule(pair=pairs, how=st.sampled_from(["full", "skip-accept", "partial"]))
    def deploy(self, pair: Pair, how: str) -> None:
        rec = self._deploy(pair)
        self._write(rec)
        assert self.rec is not None and self.rec.state == rs.ACTIVATING
        rev = self.rec.revision
        self._write(rs.finish(rec, accepted=how == "full"))
        assert self.rec.revision == rev  # route-accepted keeps the revision
        self._expect_deployed(pair, rs.ACCEPTED if how == "full" else rs.IDENTITY_ONLY)

    @rule(pair=pairs, wrote_route=st.booleans())
    def failed_deploy(self, pair: Pair, wrote_route: bool) -> None:
        """Failed after (or before) its route step: rolled back to what it found."""
        found = self.rec
        current = found
        if wrote_route:
            current = self._deploy(pair)
            self._write(current)
        if found is None or found.active is None:
            if wrote_route:  # nothing to restore: the record names nothing active
                self._write(rs.back_out(current, found, None, pair="p", run_id=self._run()))
                self.active = None
            return
        self._write(rs.back_out(current, found, entry(*self.active[0]), pair="p", run_id=self._run()))  # type: ignore[index]

    @precondition(lambda self: self.active is not None)
    @rule(arms=st.lists(pairs, min_size=1, max_size=3), fails=st.booleans())
    def qualify(self, arms: list[Pair], fails: bool) -> None:
        found = self.rec
        assert found is not None and self.active is not None
        for arm in arms:  # each arm a --skip-accept deploy
            rec = self._deploy(arm)
            self._write(rec)
            self._write(rs.finish(rec, accepted=False))
            if fails:
                break
        restored = entry(*self.active[0])
        self._write(rs.restore(self.rec, found, restored, pair="p", run_id=self._run()))
        assert self.rec is not None
        assert (self.rec.active, self.rec.previous) == (found.active, found.previous)
        assert (self.rec.state, self.rec.previous_state) == (rs.settled(found.state), found.previous_state)

    @precondition(lambda self: self.previous is not None and self.active is not None)
    @rule()
    def rollback(self) -> None:
        assert self.rec is not None and self.previous is not None
        self._write(rs.roll_back(self.rec, entry(*self.previous[0]), pair="p", run_id=self._run()))
        self.active, self.previous = self.previous, (self.active[0], rs.settled(self.active[1]))  # type: ignore[index]

    @precondition(lambda self: self.active is not None)
    @rule(pair=pairs)
    def rollback_to(self, pair: Pair) -> None:
        assert self.rec is not None and self.active is not None
        if pair == self.active[0]:
            return  # refused: it is what runs
        self._write(rs.roll_to(self.rec, entry(*pair), pair="p", run_id=self._run()))
        was = self.active
        if self.previous is not None and self.previous[0] == pair:
            self.active = self.previous
        else:
            self.active = (pair, rs.IDENTITY_ONLY)
        self.previous = (was[0], rs.settled(was[1]))

    @precondition(lambda self: self.active is not None)
    @rule()
    def repair(self) -> None:
        """The links name what the record names: the rebuilt record says the same."""
        assert self.rec is not None and self.active is not None
        prev = entry(*self.previous[0]) if self.previous else None
        self._write(rs.rebuilt(self.rec, entry(*self.active[0]), prev, pair="p", run_id=self._run()))
        self.active = (self.active[0], rs.settled(self.active[1]))

    @invariant()
    def record_is_the_model(self) -> None:
        def slot(e: RouteEntry | None, state: str | None) -> Slot:
            return None if e is None else ((e.native_package, str(e.profile["name"])), state or rs.ACCEPTED)

        if self.rec is None:
            assert self.active is None and self.previous is None
            return
        assert slot(self.rec.active, self.rec.state) == self.active
        assert slot(self.rec.previous, self.rec.previous_state) == self.previous
        assert self.rec.state in rs.STATES


RouteMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
test_route_states = RouteMachine.TestCase


def test_a_record_without_previous_state_keeps_its_bytes() -> None:
    """Records signed before `previous_state` existed still verify: the field is left out when unset."""
    old = (
        b'{"active":null,"evidence_head":null,"mac":null,"pair":"p","previous":null,"revision":1,'
        b'"schema":"pairctl.route/1","state":"active","updated_at":"t","updated_by":"r"}\n'
    )
    rec = parse_route(old)
    assert rec is not None and rec.to_bytes() == old and rec.previous_state is None


def test_skip_accept_and_partial_checks_are_not_accepted() -> None:
    from orchestrator.checks.suite import CHECKS
    from orchestrator.engine.context import RunOptions

    assert RunOptions().accepts_fully
    assert RunOptions(checks=tuple(CHECKS)).accepts_fully
    assert not RunOptions(skip_accept=True).accepts_fully
    assert not RunOptions(checks=("identity",)).accepts_fully


def test_a_planned_record_shows_all_but_what_only_the_writing_run_knows() -> None:
    """RouteWrite.to_dict (what a dry run prints and each step's receipt records): two runs of the
    same plan (another run id, clock, chain head and mac; models hashed only by the second) print
    the same record; a record that differs in anything else prints differently."""
    from orchestrator.engine.plan import RUN_FIELDS, RouteWrite

    found = rs.activate(None, entry("pkg-a", "lab"), None, pair="p", run_id="r1")
    dry = rs.activate(found, entry("pkg-b", "lab"), found.active, pair="p", run_id="dry").sign(KEY)
    hashed = entry("pkg-b", "lab").model_copy(update={"models": {"target": "ab" * 32}})
    run = rs.activate(found, hashed, found.active, pair="p", run_id="run")
    run = run.model_copy(update={"evidence_head": "e" * 64, "updated_at": "later"}).sign(KEY)
    shown = RouteWrite("activate", 1, dry, deferred=("active.models",)).to_dict()
    assert shown == RouteWrite("activate", 1, run, deferred=("active.models",)).to_dict()
    assert shown["deferred"] == [*RUN_FIELDS, "active.models"] and "models" not in shown["record"]["active"]
    assert shown["record"]["previous"] == found.active.model_dump(mode="json")  # type: ignore[union-attr]
    # without the deferral the hashes are the plan's to show (a model whose sha256 the inventory declares)
    assert RouteWrite("activate", 1, dry).to_dict() != RouteWrite("activate", 1, run).to_dict()
    other = rs.activate(found, entry("pkg-c", "lab"), found.active, pair="p", run_id="dry")
    assert RouteWrite("activate", 1, other, deferred=("active.models",)).to_dict()["record"] != shown["record"]
