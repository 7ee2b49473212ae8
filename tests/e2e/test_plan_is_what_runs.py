"""Issue 29 on the lab's sshd hosts with a real llama-server and ggml-rpc-server (pair `routes`,
its own install roots and ports):

- the plan is what runs: the steps `--dry-run` prints for deploy (fresh with --kernel-check, a
  present release verified first, a failed one's back-out), rollback and repair are, byte for
  byte, the steps the real run records in its receipt (supervisor options, bounds, the route
  record but for the fields only the writing run knows, and all);
- the route record's states (engine/route_states.py): a `--skip-accept` or partial `--checks`
  deploy is identity-verified, never "accept passed", and a rollout that accepts is not
  satisfied by it; a qualification (its arm on another profile, then its restore) leaves the
  record as it found it, so `rollback` returns to the previous pair with its own profile;
  `rollback --dry-run` names its target and `rollback --to RELEASE` reaches a kept release;
  `repair` of a never-deployed pair offers no record of nothing active.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config.inventory import load_inventory
from orchestrator.config.profiles import load_profile
from orchestrator.engine.actions import load_playbook
from orchestrator.engine.deploy import deploy
from orchestrator.engine.plan import RUN_FIELDS, planned_fields
from orchestrator.evidence.store import EvidenceStore
from orchestrator.ops.revision import PairPackages
from orchestrator.ops.rollout import on_revision
from orchestrator.qualify.engine_driver import EngineDriver
from orchestrator.qualify.runner import ArmPackages
from tests.faults.harness import FaultPair, fresh_pair, service_pid_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NAME = "routes"
# every action of the playbooks a dry run shows (kernel-check: the first deploy's --kernel-check)
PLAYBOOKS = ("deploy", "rollback", "repair")
COMPARED: set[str] = set()  # the actions whose dry-run step equalled the executed one, over the module


@pytest.fixture(scope="module")
def routes(request, pairctl_home):
    with fresh_pair(request, pairctl_home, NAME, (8197, 50197)) as fp:  # no route from an earlier run
        yield fp


def _json(p: Any, what: str, code: int = 0) -> dict[str, Any]:
    assert p.returncode == code, f"{what}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


def _status(fp: FaultPair) -> dict[str, Any]:
    return fp.status()[1]


def _executed(fp: FaultPair, receipt: str | None) -> list[dict[str, Any]]:
    """Each step the run executed, as the receipt records the step it was given."""
    assert receipt is not None
    return [s.data["planned"] for s in EvidenceStore(fp.home.evidence).load(receipt).steps if "planned" in s.data]


def _same_steps(plan: list[dict[str, Any]], fp: FaultPair, receipt: str | None, last: bool = False) -> None:
    """The dry run's steps (names, actions, hosts, argv, links, uploads, route records, pair) are
    the executed steps as the receipt records them, byte for byte (canonical JSON); `last`: the
    receipt's last steps (a failed deploy's back-out, after the steps that ran before it failed).
    The record on the hosts is the one the last route write showed, but for its deferred fields."""
    ran = _executed(fp, receipt)[-len(plan) :] if last else _executed(fp, receipt)
    assert [s["name"] for s in ran] == [s["name"] for s in plan]
    for want, got in zip(plan, ran, strict=True):
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), (want, got)
    COMPARED.update(s["action"] for s in plan)
    writes = [s for s in plan if s["action"] in WRITERS and "record" in s["route"]]
    if writes:
        r = writes[-1]["route"]
        want = r["settled"] if writes[-1]["action"] == "route-accepted" else r["record"]
        assert planned_fields(_record(fp), r["deferred"]) == want
        assert set(r["deferred"]) <= set(RUN_FIELDS) | {"active.models"}, r["deferred"]


def _dry_equals_run(fp: FaultPair, *args: str, how: tuple[str, ...] = ()) -> dict[str, Any]:
    """`pairctl ARGS --dry-run`, then `pairctl ARGS`: the receipt's steps are the plan's (repair:
    without, then with --yes)."""
    repair = args[0] == "repair"
    dry = _json(fp.cli("--json", *args, *(() if repair else ("--dry-run",))), f"{args[0]} --dry-run")
    assert repair or dry["outcome"] == "dry-run"
    out = _json(fp.cli("--json", *args, *(("--yes",) if repair else ())), args[0])
    _same_steps(dry["plan"], fp, out["receipt"])
    assert out["plan"] == dry["plan"]
    if not repair:
        assert all(
            any(w.startswith("sup.") for w in a)
            for s in dry["plan"]
            if s["action"] in ("restart-rpc", "start-server")
            for a in s["argv"].values()
        )
    # the route write is decided by the plan too: its transition and base revision are the dry
    # run's, and each host's record is the planned successor of that revision
    route = _routes(dry["plan"])
    want_how = how or ({"deploy": "activate", "rollback": "roll-back", "repair": "rebuilt"}[args[0]],)
    assert route and {r["transition"] for r in route.values()} <= set(want_how), route
    written = {
        (s.name, h): d["revision"]
        for s in EvidenceStore(fp.home.evidence).load(out["receipt"]).steps
        if s.name in route
        for h, d in (s.data or {}).items()
        if isinstance(d, dict) and "revision" in d
    }
    assert written, out["receipt"]
    if not repair:  # repair never writes below a revision this home recorded
        assert all(v == (route[n]["base_revision"] or 0) + 1 for (n, _), v in written.items()), written
    return {"dry": dry, "run": out}


WRITERS = ("route", "route-accepted", "route-repair")


def _routes(plan: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s["route"] for s in plan if s["action"] in WRITERS}


def test_repair_of_a_never_deployed_pair_offers_nothing(routes: FaultPair) -> None:
    p = routes.cli("repair", "--pair", NAME)
    assert p.returncode == 6, p.stdout + p.stderr
    assert "never deployed" in p.stderr and "active: null" not in p.stdout
    assert not (routes.roots["native"] / "run" / "route.json").exists()


def test_dry_run_commands_are_the_commands_run_and_route_states(routes: FaultPair) -> None:
    fp = routes
    a, b = fp.packages
    # fresh deploys: nothing present, nothing verified first; the first one checks the kernels of
    # what it uploaded, as its dry run showed (harness argv per host, the second rpc-server)
    first = _dry_equals_run(fp, "deploy", "--pair", NAME, "--packages", a, a, "--skip-accept", "--kernel-check")
    kc = next(s for s in first["dry"]["plan"] if s["action"] == "kernel-check")["kernel"]
    assert {r["package"] for r in kc["runs"]} == {a} and kc["rpc_server"] is not None, kc
    skip = _dry_equals_run(fp, "deploy", "--pair", NAME, "--packages", b, b, "--skip-accept")
    # a --skip-accept deploy is identity-verified: no accept step in its receipt, not accepted
    assert "accept" not in [s["name"] for s in skip["run"]["steps"]]
    st = _status(fp)
    assert st["route"]["state"] == "identity-verified" and st["route"]["active_packages"] == [b, b], st["route"]
    pp = PairPackages(pair=NAME, profile="lab", profile_name="lab", native=b, rpc=b)
    assert on_revision(st, pp, accepts_fully=True) is None  # `deploy --rev REV --all` deploys it again
    assert "identity-verified" in (on_revision(st, pp, accepts_fully=False) or "")
    # a present release: stop-native and restart-rpc verify it before they stop anything
    again = _dry_equals_run(fp, "deploy", "--pair", NAME, "--packages", a, a, "--checks", "identity")
    by = {s["name"]: s for s in again["dry"]["plan"]}
    assert a in next(iter(by["stop-native"]["argv"].values()))
    assert all(u["present"] and u["release"] == a for u in by["upload"]["upload"].values()), by["upload"]
    fresh = {s["name"]: s for s in skip["dry"]["plan"]}["upload"]["upload"]
    assert all(not u["present"] and u["files"] for u in fresh.values()), fresh
    assert _status(fp)["route"]["state"] == "identity-verified"  # a partial --checks is not acceptance
    # rollback: --dry-run names the pair it goes back to, and its commands are the run's
    rb = _dry_equals_run(fp, "rollback", "--pair", NAME)
    assert rb["dry"]["active"]["native_package"] == b and rb["run"]["active"]["native_package"] == b
    text = fp.cli("rollback", "--pair", NAME, "--dry-run")
    assert text.returncode == 0 and f"goes back to: {a} + {a} (lab)" in text.stdout, text.stdout + text.stderr


def test_a_failed_deploy_backs_out_as_its_dry_run_shows(routes: FaultPair) -> None:
    """A deploy whose server does not load backs out: the back-out's steps (commands, links,
    record) are the ones its dry run listed, byte for byte."""
    fp = routes
    args = ("--json", "deploy", "--pair", NAME, "--packages", fp.packages[0], fp.packages[0])
    args += ("--profile", "lab-unloadable", "--skip-accept")
    dry = _json(fp.cli(*args, "--dry-run"), "deploy --dry-run")
    assert dry["back_out"] and {s["action"] for s in dry["back_out"]} >= {"stop", "start-server", "route"}
    p = fp.cli(*args)
    assert p.returncode == 7, p.stderr[-2000:]
    latest = EvidenceStore(fp.home.evidence).latest(NAME)
    assert latest is not None and latest.command == "deploy" and latest.outcome == "failed", latest
    _same_steps(dry["back_out"], fp, latest.sha256, last=True)


def test_qualification_leaves_the_record_as_found(routes: FaultPair) -> None:
    """An arm on another profile (whose commands are its dry run's), then the restore (as after a
    failed qualification): the record's previous pair keeps its own profile, and `rollback`
    returns to it."""
    fp = routes
    a, b = fp.packages
    aliased = load_profile("lab").model_dump(mode="json") | {"name": "lab-alias", "alias": "m1"}
    prof = fp.home.root / NAME / "lab-alias.yaml"
    prof.write_text(yaml.safe_dump(aliased))
    _json(fp.cli("--json", "deploy", "--pair", NAME, "--packages", a, a, "--profile", str(prof), "--skip-accept"), "A")
    _json(fp.cli("--json", "deploy", "--pair", NAME, "--packages", b, b, "--skip-accept"), "deploy B")
    before = _status(fp)["route"]
    links = {
        r: (os.readlink(fp.roots[r] / "run" / "current"), os.readlink(fp.roots[r] / "run" / "previous"))
        for r in fp.roots
    }
    inv = load_inventory(str(fp.inventory_path), {"PAIRCTL_HOME": str(fp.home.root)})
    d = EngineDriver(fp.home, inv, NAME, argv=["test"])
    arm = load_profile("lab-draft-other", pair=inv.pair(NAME))
    arm_file = fp.home.root / NAME / "arm.yaml"
    arm_file.write_text(yaml.safe_dump(arm.model_dump(mode="json")))
    try:
        with d.hold("test-qualify"):
            snap = d.snapshot()
            dry = deploy(fp.home, inv, NAME, (a, a), profile_name=str(arm_file), skip_accept=True, dry_run=True)
            d.activate(ArmPackages(a, a), arm)
            # the qualification arm ran the steps a dry run of the same deploy prints
            _same_steps(dry.plan, fp, d.deploy_receipts[-1])
            # ... and so did its restore (the record and `previous` links as found)
            dry = deploy(
                fp.home,
                inv,
                NAME,
                (snap["native"], snap["rpc"]),
                profile_name=d._profile_file(snap["profile"]),
                skip_accept=True,
                dry_run=True,
                restore_record=d._found,
                restore_previous_links=d._found_links,
            )
            assert {s["route"]["transition"] for s in dry.plan if s["action"] == "route"} == {"restore"}
            d.restore(snap)
            _same_steps(dry.plan, fp, d.deploy_receipts[-1])
    finally:
        d.close()
    after = _status(fp)["route"]
    keys = ("active", "active_packages", "previous", "state")
    assert {k: after.get(k) for k in keys} == {k: before.get(k) for k in keys}, (before, after)
    # ... and the links too: `previous` names the found previous pair, not the arm's release
    assert {
        r: (os.readlink(fp.roots[r] / "run" / "current"), os.readlink(fp.roots[r] / "run" / "previous"))
        for r in fp.roots
    } == links
    rb = _json(fp.cli("--json", "rollback", "--pair", NAME), "rollback after qualify")
    assert rb["active"]["native_package"] == a and rb["active"]["profile_name"] == "lab-alias", rb["active"]
    argv = rb["active"]["native_argv"]
    assert argv[argv.index("--alias") + 1] == "m1", argv  # the previous pair's own profile, alias and all
    pid = service_pid_of(fp, "native")
    assert pid is not None and b"--alias\0m1\0" in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_rollback_to_a_kept_release(routes: FaultPair) -> None:
    fp = routes
    a, b = fp.packages
    st = _status(fp)["route"]
    to = b if st["active_packages"] == [a, a] else a
    out = _dry_equals_run(fp, "rollback", "--pair", NAME, "--to", to, how=("roll-to", "roll-back"))["run"]
    assert out["active"]["native_package"] == to
    assert _status(fp)["route"]["active_packages"] == [to, to]
    bad = fp.cli("rollback", "--pair", NAME, "--to", "no-such-release")
    assert bad.returncode == 3 and "not kept there" in bad.stderr, bad.stderr
    # repair of a pair whose record is sound: what it shows is what --yes runs
    _dry_equals_run(fp, "repair", "--pair", NAME)


def test_every_action_of_every_playbook_was_compared(routes: FaultPair) -> None:
    if not COMPARED:
        pytest.skip("run with the tests above (one module)")
    every = {s.action for pb in PLAYBOOKS for s in load_playbook(pb).steps}
    assert every <= COMPARED, sorted(every - COMPARED)


# -- the route model on the lab -----------------------------------------------------------------


def _record(fp: FaultPair) -> dict[str, Any]:
    data = json.loads((fp.roots["native"] / "run" / "route.json").read_bytes())
    assert (fp.roots["rpc"] / "run" / "route.json").read_bytes() == (
        fp.roots["native"] / "run" / "route.json"
    ).read_bytes()
    return data


def _slot(entry: dict[str, Any] | None, state: str | None) -> tuple[tuple[str, str], str] | None:
    return None if entry is None else ((entry["native_package"], entry["profile_name"]), state or "active")


def test_route_model_on_the_lab(routes: FaultPair) -> None:
    """Random sequences of deploy (skip-accept, partial checks), failed deploy, rollback,
    rollback --to and repair on the real pair; after every step the hosts' route.json names what
    engine/route_states.py's model says (the same model tests/unit/test_route_states.py drives
    through random sequences of thousands of steps)."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

    fp = routes
    a, b = fp.packages
    alias = fp.home.root / NAME / "lab-alias.yaml"  # written by the qualification test above
    profiles = {"lab": "lab", "lab-alias": str(alias)}

    class Lab(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            rec = _record(fp)  # each example starts from what the pair has now
            self.active = _slot(rec["active"], rec["state"])
            self.previous = _slot(rec["previous"], rec.get("previous_state"))

        def _moved(self, pair: tuple[str, str], state: str) -> None:
            assert self.active is not None
            if self.active[0] != pair:
                self.previous = (
                    self.active[0],
                    "identity-verified" if self.active[1] == "activating" else self.active[1],
                )
            self.active = (pair, state)

        @rule(
            pkg=st.sampled_from([a, b]), prof=st.sampled_from(sorted(profiles)), how=st.sampled_from(["skip", "part"])
        )
        def deploy(self, pkg: str, prof: str, how: str) -> None:
            extra = ["--skip-accept"] if how == "skip" else ["--checks", "identity"]
            _json(
                fp.cli("--json", "deploy", "--pair", NAME, "--packages", pkg, pkg, "--profile", profiles[prof], *extra),
                "deploy",
            )
            self._moved((pkg, prof), "identity-verified")

        @rule(pkg=st.sampled_from([a, b]))
        def failed_deploy(self, pkg: str) -> None:
            p = fp.cli(
                "--json",
                "deploy",
                "--pair",
                NAME,
                "--packages",
                pkg,
                pkg,
                "--profile",
                "lab-unloadable",
                "--skip-accept",
            )
            assert p.returncode == 7, p.stderr[-2000:]  # rolled back: the record as it was

        @rule()
        def rollback(self) -> None:
            p = fp.cli("--json", "rollback", "--pair", NAME)
            if self.previous is None or self.previous[0] == self.active[0]:  # type: ignore[index]
                assert p.returncode == 6, p.stderr[-2000:]
                return
            _json(p, "rollback")
            self.active, self.previous = self.previous, self.active

        @rule(pkg=st.sampled_from([a, b]))
        def rollback_to(self, pkg: str) -> None:
            """--to PKG: the recorded previous pair if it is PKG's, else what runs if it is PKG's
            (refused), else PKG with the inventory's profile, identity-verified."""
            assert self.active is not None
            p = fp.cli("--json", "rollback", "--pair", NAME, "--to", pkg)
            if self.previous is not None and self.previous[0][0] == pkg:
                if self.previous[0] == self.active[0]:
                    assert p.returncode == 6, p.stderr[-2000:]  # what runs already
                    return
                _json(p, "rollback --to the previous pair")
                self.active, self.previous = self.previous, self.active
            elif self.active[0][0] == pkg:
                assert p.returncode == 6, p.stderr[-2000:]  # what runs already
            else:
                _json(p, "rollback --to")
                self.previous, self.active = self.active, ((pkg, "lab"), "identity-verified")

        @rule()
        def repair(self) -> None:
            """From the links: the active pair and its state kept; `previous` is what the links
            name (a redeploy of the same release keeps an older previous link), so it is re-read."""
            _json(fp.cli("--json", "repair", "--pair", NAME, "--yes"), "repair")
            rec = _record(fp)
            assert _slot(rec["active"], rec["state"]) == self.active
            self.previous = _slot(rec["previous"], rec.get("previous_state"))

        @invariant()
        def record_is_the_model(self) -> None:
            rec = _record(fp)
            assert _slot(rec["active"], rec["state"]) == self.active
            assert _slot(rec["previous"], rec.get("previous_state")) == self.previous

    run_state_machine_as_test(
        Lab,
        settings=settings(
            max_examples=3,
            stateful_step_count=6,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
