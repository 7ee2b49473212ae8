"""Which releases a prune keeps and removes (pure)."""

from __future__ import annotations

from orchestrator.hosts.prune import TOMB, _parse_removed, plan_prune, tomb_name


def _rels(n: int) -> dict[str, float]:
    return {f"r{i}": float(i) for i in range(n)}  # r0 oldest


def test_keeps_the_newest_and_removes_oldest_first():
    p = plan_prune("h", _rels(8), keep_releases=5, protected={"r7": "current", "r6": "previous"})
    assert p.keep == ("r7", "r6", "r5", "r4", "r3")
    assert p.remove == ("r0", "r1", "r2")


def test_protected_releases_are_kept_whatever_their_age():
    p = plan_prune(
        "h",
        _rels(8),
        keep_releases=3,
        protected={"r7": "current", "r0": "previous", "r1": "named by pair other's route (active)"},
    )
    assert set(p.keep) == {"r7", "r0", "r1"}
    assert p.remove == ("r2", "r3", "r4", "r5", "r6")
    assert p.protected["r1"].startswith("named by pair other")


def test_more_protected_than_keep_removes_only_unprotected():
    p = plan_prune("h", _rels(4), keep_releases=1, protected={"r0": "current", "r1": "previous"})
    assert set(p.keep) == {"r0", "r1"} and p.remove == ("r2", "r3")


def test_nothing_to_do_under_the_limit_and_protection_of_absent_ids_is_ignored():
    p = plan_prune("h", _rels(3), keep_releases=5, protected={"elsewhere": "named by pair x's route (active)"})
    assert p.remove == () and p.protected == {}


def test_tomb_names_are_never_release_names():
    t = tomb_name("lab-9d37488533-cpu-lab")
    assert t.startswith(".") and TOMB.match(t) and TOMB.match(t).group("id") == "lab-9d37488533-cpu-lab"
    assert not TOMB.match("lab-9d37488533-cpu-lab") and not TOMB.match(".x.tmp-abcd")


def test_parse_removed_lines():
    out = "removed .a.tomb-00ff 1234\ngone .b.tomb-11aa\nnoise\n"
    assert _parse_removed(out) == {".a.tomb-00ff": 1234}
