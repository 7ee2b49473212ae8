"""The pair under a bisect: one hold of both leases for the whole run, deploys under it, and
the restore of what ran before, on the qualification's EngineDriver (same snapshot, same
restore: the route record written back as found, then read back and compared).

A plan judgement runs a whole qualification per step; its runner takes a hold of its own, so
it gets a driver (`UnderHold`) whose hold is a view of the bisect's: the same nonce renewed by
each arm's deploy, never released by the qualification, so no other run lands between steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.engine.deploy import RunResult
from orchestrator.paths import Home
from orchestrator.qualify.engine_driver import QUALIFY_LEASE_TTL_S, EngineDriver

BISECT_LEASE_TTL_S = QUALIFY_LEASE_TTL_S  # renewed by every deploy and after every build


class BisectDriver(EngineDriver):
    """EngineDriver plus a deploy with acceptance (a checks judgement) under the held leases."""

    def __init__(self, home: Home, inventory: Any, pair: str, *, argv: list[str]) -> None:
        super().__init__(home, inventory, pair, argv=argv)
        self.found_snapshot: dict[str, Any] | None = None

    @contextmanager
    def hold(self, run_id: str) -> Iterator[Any]:
        """Both leases for the whole bisect (renewed by every deploy and after every build).
        Unlike a qualification's hold, a stop after a deploy does not keep them: the bisect
        restores the pair first and keeps them itself (`held.keep`) when it could not."""
        with self._held_leases(run_id, "bisect", BISECT_LEASE_TTL_S, keep_after_deploy=False) as held:
            yield held

    @property
    def nonce(self) -> str | None:
        return self._lease_nonce

    def take_snapshot(self) -> dict[str, Any]:
        """What runs now, kept for the final restore (nested qualifications snapshot again)."""
        self.found_snapshot = self.snapshot()
        self._bisect_found, self._bisect_links = self._found, self._found_links
        return self.found_snapshot

    def deploy_checked(self, ids: tuple[str, str], profile: str, checks: tuple[str, ...], why: str) -> RunResult:
        """A full deploy with acceptance limited to `checks` (all when empty); the engine rolls
        it back on failure (RolledBack carries the receipt)."""
        from orchestrator.engine.deploy import deploy

        self._deploys_started += 1
        return self._wait_busy(
            why,
            lambda: deploy(
                self.home,
                self.inventory,
                self.pair,
                ids,
                profile_name=profile,
                skip_accept=False,
                checks=checks,
                argv=[*self.argv, f"({why})"],
                pool=self.pool,
                held_lease_nonce=self._lease_nonce,
            ),
        )

    def restore_found(self) -> dict[str, Any]:
        """The pair as the bisect found it: packages, profile, route record and links."""
        assert self.found_snapshot is not None
        self._found, self._found_links = self._bisect_found, self._bisect_links
        return self.restore(self.found_snapshot)


class _HeldView:
    """The bisect's held leases as a nested qualification sees them: never released by it."""

    def __init__(self, outer: Any) -> None:
        self.outer = outer

    def public(self) -> dict[str, Any]:
        return {**self.outer.public(), "held_by": "the bisect run (renewed by every deploy)"}

    def keep(self, reason: str) -> None:
        self.outer.keep(reason)

    def end(self) -> dict[str, Any]:
        return {"held_by_bisect": True}


class UnderHold(EngineDriver):
    """A qualification's driver inside a bisect: deploys renew the bisect's leases."""

    def __init__(self, outer: BisectDriver, held: Any) -> None:
        super().__init__(outer.home, outer.inventory, outer.pair, argv=outer.argv)
        self._outer_nonce = outer.nonce
        self._held = held

    @contextmanager
    def hold(self, run_id: str) -> Iterator[Any]:
        self._lease_nonce = self._outer_nonce
        try:
            yield _HeldView(self._held)
        finally:
            self._lease_nonce = None
