"""The route-record judge (engine/route_trust.py) on hostile records, with no host at all:
every kind of problem it names is shown to be raised, and a clean record to raise none."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.engine import route_states, route_trust
from orchestrator.engine.plan import pair_view
from orchestrator.errors import ConfigError, HostStateError
from orchestrator.hosts.probes import facts_from
from orchestrator.hosts.route import RouteEntry, next_record
from orchestrator.paths import Home

KEY = b"k" * 64
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _entry(n: str) -> RouteEntry:
    return RouteEntry.build(
        native_package=n,
        rpc_package=n,
        package_revision="a" * 40,
        profile={"name": "lab", "ctx_size": 4096},
        native_argv=["x", n],
        rpc_argv=["y"],
    )


def _facts(cur, route: bytes | None, releases=("A", "B")):
    return facts_from(
        root_exists=True,
        current_link=f"releases/{cur}" if cur else None,
        previous_link=None,
        release_names=list(releases),
        svc_bytes=None,
        route_bytes=route,
        procs={},
    )


@pytest.fixture
def view(tmp_path):
    return pair_view(load_inventory("lab", {"PAIRCTL_HOME": str(tmp_path)}), "lab")


def _record(active="B", previous="A", key=KEY):
    rec = next_record(None, pair="lab", active=_entry(active), previous=_entry(previous), run_id="run1", now=NOW)
    return rec.sign(key) if key else rec


def _kinds(view, native: bytes | None, rpc: bytes | None, cur=("B", "B"), releases=("A", "B")) -> set[str]:
    facts = {"native": _facts(cur[0], native, releases), "rpc": _facts(cur[1], rpc, releases)}
    return {p.kind for p in route_trust.judge(view, facts, KEY, None).problems}


def test_a_signed_record_matching_the_links_is_clean(view):
    data = _record().to_bytes()
    assert _kinds(view, data, data) == set()
    assert _kinds(view, None, None, cur=(None, None)) == set()  # a fresh pair: nothing to judge


def test_each_hostile_record_is_named(view):
    good = _record()
    data = good.to_bytes()
    assert _kinds(view, _record(key=None).to_bytes(), _record(key=None).to_bytes()) == {route_trust.UNSIGNED}
    other = _record(key=b"o" * 64).to_bytes()
    assert _kinds(view, other, other) == {route_trust.FORGED}
    tampered = good.model_copy(
        update={
            "previous": good.previous.model_copy(update={"native_argv": ["x", "A", "--tools", "exec_shell_command"]})
        }
    ).to_bytes()
    assert _kinds(view, tampered, tampered) == {route_trust.FORGED, route_trust.ARGV}
    assert _kinds(view, data, b"{not json") == {route_trust.PARSE}
    assert _kinds(view, data, good.model_copy(update={"revision": 40}).sign(KEY).to_bytes()) == {route_trust.DIFFER}
    assert _kinds(view, None, None) == {route_trust.MISSING}
    assert _kinds(view, data, data, cur=(None, "B")) == {route_trust.LINKS}
    unsigned = _record(key=None).to_bytes()
    assert _kinds(view, unsigned, unsigned, cur=("A", "B")) == {route_trust.UNSIGNED, route_trust.LINKS}
    assert route_trust.RELEASE in _kinds(view, data, data, releases=("A",))


def test_links_a_cut_short_run_switched_are_resolved_by_deploy_and_rollback(view):
    """A link to an installed release beside this home's signed record naming installed releases
    is what a run killed between its switch and its route step leaves (issue 33 item 5): its own
    kind, allowed to deploy and rollback, and the links that put the recorded pair back."""
    data = _record(active="B", previous="A").to_bytes()
    assert _kinds(view, data, data, cur=("B", "A")) == {route_trust.SWITCHED}
    assert _kinds(view, data, data, cur=("A", "A")) == {route_trust.SWITCHED}
    facts = {"native": _facts("B", data), "rpc": _facts("A", data)}
    j = route_trust.judge(view, facts, KEY, None)
    j.refuse("deploy", route_trust.DEPLOY_ALLOWS)
    j.refuse("rollback", route_trust.ROLLBACK_ALLOWS)
    assert "pairctl rollback --pair lab" in j.problems[0].hint and "repair" not in j.problems[0].hint
    assert j.record is not None
    assert route_trust.switched_links(j.record, facts, j) == {"rpc": ("B", "A")}
    # a link to a release the host does not keep is damage, not a cut-short switch
    assert _kinds(view, data, data, cur=("B", "C"), releases=("A", "B")) >= {route_trust.LINKS, route_trust.RELEASE}


def test_refusal_allows_only_what_the_command_can_resolve(view):
    facts = {r: _facts("B", _record(key=None).to_bytes()) for r in ("native", "rpc")}
    j = route_trust.judge(view, facts, KEY, None)
    j.refuse("deploy", route_trust.DEPLOY_ALLOWS)  # an unsigned record: deploy replaces it with a signed one
    with pytest.raises(HostStateError, match="rollback refused, nothing was changed.*no signature") as exc:
        j.refuse("rollback", route_trust.ROLLBACK_ALLOWS)
    assert "pairctl repair --pair lab" in str(exc.value)


def test_the_signing_key_is_made_0600_and_a_readable_one_refused(tmp_path):
    home = Home(tmp_path / "home")
    key = route_trust.route_key(home)
    path = home.root / route_trust.KEY_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and route_trust.route_key(home) == key and len(key) >= 32
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        route_trust.route_key(home)


def test_links_outside_the_install_root_are_not_releases():
    from orchestrator.hosts.probes import ProbeError, release_of_link

    assert release_of_link("/r/releases/A", "/r") == "A" and release_of_link("releases/A", "/r") == "A"
    for bad in ("/tmp/evil/releases/A", "/etc", "releases/..", "releases/", "releases/.x"):
        with pytest.raises(ProbeError):
            release_of_link(bad, "/r")


def _written_by(store, previous_head: str | None):
    """A real run of `store`'s home (its receipt in the chain) and the record it signed."""
    from orchestrator.evidence.store import EvidenceStore

    assert isinstance(store, EvidenceStore)
    j = store.begin("deploy", ["deploy"], pair="lab")
    rec = next_record(None, pair="lab", active=_entry("B"), previous=None, run_id=j.run_id, now=NOW)
    j.finish("passed", "deployed")
    return rec.model_copy(update={"evidence_head": previous_head}).sign(KEY)


def test_a_record_from_another_home_is_not_called_a_deletion(tmp_path):
    """Issue 33 item 10: two operator homes sharing route.key on one pair. The second home saw the
    first's record as 'the newest receipts were deleted?': a false alarm. The record's evidence
    head tells them apart: a chain that holds the head the writer followed but not the writer's
    receipt lost its newest receipts; one that holds neither is another home's (or lost it all)."""
    from orchestrator.evidence.store import EvidenceStore

    first, second = EvidenceStore(tmp_path / "a" / "evidence"), EvidenceStore(tmp_path / "b" / "evidence")
    h0 = first.begin("deploy", ["deploy"], pair="lab").finish("passed", "first")
    second.begin("deploy", ["deploy"], pair="lab").finish("passed", "the second home's own run")
    rec = _written_by(first, h0)
    assert route_trust.anchor_problems(rec, first, "lab") == []
    (other,) = route_trust.anchor_problems(rec, second, "lab")
    assert route_trust.OTHER_HOME in other and "newest receipts were deleted" not in other
    (none,) = route_trust.anchor_problems(rec, EvidenceStore(tmp_path / "c" / "evidence"), "lab")
    assert route_trust.OTHER_HOME in none
    # the first home loses its newest receipt (the writer's), the head moved back: a deletion
    head = first.latest("lab")
    assert head is not None and head.run_id == rec.updated_by
    (tmp_path / "a" / "evidence" / "receipts" / f"{head.sha256}.json").unlink()
    (tmp_path / "a" / "evidence" / "heads" / "lab").write_text(h0 + "\n")
    (deleted,) = route_trust.anchor_problems(rec, first, "lab")
    assert "the newest receipts were deleted" in deleted and route_trust.OTHER_HOME not in deleted


def test_a_run_cut_short_between_its_two_route_accepted_writes_is_judged_activating(view):
    """SIGKILL between the hosts' route-accepted writes (seen in test_bisect_killed): one host holds
    the run's `activating` record, the other the same record settled. Not records that differ
    (repair only): the pair as never accepted, the `activating` copy, which rollback and deploy
    resolve. Anything else that differs stays DIFFER."""
    rec = _record().model_copy(update={"state": "activating", "mac": None}).sign(KEY)
    settled = rec.model_copy(update={"state": "identity-verified", "mac": None}).sign(KEY)
    for native, rpc in ((rec, settled), (settled, rec)):
        j = route_trust.judge(
            view, {"native": _facts("B", native.to_bytes()), "rpc": _facts("B", rpc.to_bytes())}, KEY, None
        )
        assert j.problems == [] and j.record is not None and j.record.state == "activating"
    other_run = settled.model_copy(update={"updated_by": "run2", "mac": None}).sign(KEY)
    assert _kinds(view, rec.to_bytes(), other_run.to_bytes()) == {route_trust.DIFFER}
    unsigned = settled.model_copy(update={"mac": None})
    assert route_trust.DIFFER in _kinds(view, rec.to_bytes(), unsigned.to_bytes())
    restamped = settled.model_copy(update={"updated_at": "2026-01-02T00:00:00Z", "mac": None}).sign(KEY)
    assert _kinds(view, rec.to_bytes(), restamped.to_bytes()) == {route_trust.DIFFER}
    next_rev = settled.model_copy(update={"revision": rec.revision + 1, "mac": None}).sign(KEY)
    assert _kinds(view, rec.to_bytes(), next_rev.to_bytes()) == {route_trust.DIFFER}


def test_a_run_cut_short_between_its_two_route_writes_is_judged_activating(view):
    """SIGKILL between the hosts' `route` writes: one host holds the new run's signed `activating`
    record, the other the settled record it was made from (the revision before). The interrupted
    activation (rollback and deploy resolve it, and rollback starts from the `activating` copy
    whichever host holds it), not records that differ; every near miss stays DIFFER."""
    base = _record()  # run1 accepted B over A
    new = route_states.activate(base, _entry("C"), _entry("B"), pair="lab", run_id="run2", now=NOW).sign(KEY)
    assert new.state == "activating" and new.revision == base.revision + 1
    cur = ("C", "C")
    for native, rpc in ((new, base), (base, new)):
        facts = {"native": _facts("C", native.to_bytes(), "ABC"), "rpc": _facts("C", rpc.to_bytes(), "ABC")}
        j = route_trust.judge(view, facts, KEY, None)
        assert j.problems == [] and j.record == new
        assert route_trust.found_record(facts, KEY) == new
    again = route_states.activate(base, _entry("B"), _entry("B"), pair="lab", run_id="run2", now=NOW).sign(KEY)
    assert _kinds(view, again.to_bytes(), base.to_bytes()) == set()  # a re-deploy of the active pair

    def resigned(**update):
        return new.model_copy(update={**update, "mac": None}).sign(KEY)

    near_misses = {
        "same run": resigned(updated_by="run1"),
        "unsigned": new.model_copy(update={"mac": None}),
        "another home's key": new.model_copy(update={"mac": None}).sign(b"o" * 64),
        "base not the previous": resigned(previous=_entry("A")),
        "base's state not carried": resigned(previous_state="identity-verified"),
        "a revision skipped": resigned(revision=base.revision + 2),
        "same revision": resigned(revision=base.revision),
        "another home": resigned(evidence_home="elsewhere"),
    }
    for why, rec in near_misses.items():
        kinds = _kinds(view, rec.to_bytes(), base.to_bytes(), cur=cur, releases="ABC")
        assert route_trust.DIFFER in kinds, why
    # the base must be what was written, signed: an unsigned or re-encoded base is not the previous record
    unsigned_base = base.model_copy(update={"mac": None})
    assert route_trust.DIFFER in _kinds(view, new.to_bytes(), unsigned_base.to_bytes(), cur=cur, releases="ABC")
    assert route_trust.DIFFER in _kinds(view, new.to_bytes(), base.to_bytes() + b" ", cur=cur, releases="ABC")
    assert (
        route_trust.found_record(
            {"native": _facts("C", base.to_bytes(), "ABC"), "rpc": _facts("C", unsigned_base.to_bytes(), "ABC")}, KEY
        )
        == base
    )


def test_deploy_starts_from_the_activating_copy_whichever_host_a_cut_run_reached_first(view):
    """The hosts' `route` writes run at once, so a run killed between them leaves its `activating`
    N+1 on either host. Deploy allows that (ACTIVATING) but started its plan, its record and its
    back-out pair from the native host's record: with rpc ahead it wrote N+1 again (two records
    of one revision) and a failure backed out to N's pair. Its base is now the same either way."""
    from types import SimpleNamespace

    from orchestrator.engine.deploy import _base_record

    base = _record()
    new = route_states.activate(base, _entry("C"), _entry("B"), pair="lab", run_id="run2", now=NOW).sign(KEY)
    seen = []
    for native, rpc in ((new, base), (base, new)):
        facts = {"native": _facts("C", native.to_bytes(), "ABC"), "rpc": _facts("C", rpc.to_bytes(), "ABC")}
        hosts = SimpleNamespace(facts=facts, route_bytes=lambda role, f=facts: f[role].route_bytes)
        seen.append(_base_record(SimpleNamespace(hosts=hosts, inputs=SimpleNamespace(route_key=KEY))))
    assert seen == [new, new]
    nxt = route_states.activate(seen[0], _entry("D"), _entry("C"), pair="lab", run_id="run3", now=NOW)
    assert nxt.revision == new.revision + 1
