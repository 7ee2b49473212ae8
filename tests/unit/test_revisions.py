"""build/revisions.py: one source revision per pair, judged from the local store's manifests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.build import revisions
from orchestrator.errors import HostStateError, PackageError

A, B = "a" * 40, "b" * 40


class Store:
    """The store's one method these functions use (pure logic: a dict of id -> revision)."""

    def __init__(self, revs: dict[str, str]) -> None:
        self.revs = revs

    def get(self, pid: str) -> SimpleNamespace:
        if pid not in self.revs:
            raise PackageError(f"no package {pid!r}")
        return SimpleNamespace(manifest=SimpleNamespace(revision=self.revs[pid]))


STORE = Store({"n-a": A, "r-a": A, "r-b": B})


def test_one_revision_passes() -> None:
    assert revisions.mixed_problem(STORE, "n-a", "r-a") is None  # type: ignore[arg-type]
    revisions.require_one_revision(STORE, "p", "n-a", "r-a", what="starting x")  # type: ignore[arg-type]


@pytest.mark.parametrize("rpc", ["r-b", "unknown"])
def test_two_or_unknown_revisions_are_refused_naming_both(rpc: str) -> None:
    problem = revisions.mixed_problem(STORE, "n-a", rpc)  # type: ignore[arg-type]
    assert problem is not None and "n-a" in problem and rpc in problem and A[:12] in problem
    with pytest.raises(HostStateError) as ei:
        revisions.require_one_revision(STORE, "p", "n-a", rpc, what="starting x")  # type: ignore[arg-type]
    assert "nothing was started" in ei.value.message and "pairctl deploy --pair p" in (ei.value.hint or "")
    assert ei.value.exit_code == 6


def test_a_missing_link_is_no_pair_to_judge() -> None:
    assert revisions.mixed_problem(STORE, None, "r-b") is None  # type: ignore[arg-type]
