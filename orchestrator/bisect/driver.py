"""The pair under a bisect, on the qualification's EngineDriver: one hold of both leases for the
whole run, deploys under it, and the restore of what ran before. A plan judgement's nested
qualification gets `UnderHold`, whose hold is a view of the bisect's (renewed, never released)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from orchestrator.engine.deploy import RunResult
from orchestrator.errors import ConfigError, LeaseHeldError
from orchestrator.paths import Home
from orchestrator.qualify.engine_driver import QUALIFY_LEASE_TTL_S, EngineDriver

BISECT_LEASE_TTL_S = QUALIFY_LEASE_TTL_S  # renewed by every deploy and after every build
RESET_HINT = "`pairctl bisect --pair PAIR --reset` discards the bisect; restore the pair by hand (rollback or deploy)"
T = TypeVar("T")


class BisectDriver(EngineDriver):
    """EngineDriver plus a deploy with acceptance (a checks judgement) under the held leases."""

    def __init__(self, home: Home, inventory: Any, pair: str, *, argv: list[str]) -> None:
        super().__init__(home, inventory, pair, argv=argv)
        self.found_snapshot: dict[str, Any] | None = None
        self._bisect_found: Any = None
        self._bisect_links: tuple[str | None, str | None] | None = None
        self.own_runs: tuple[str, ...] = ()  # this bisect's earlier runs (their leases are not waited for)

    @contextmanager
    def hold(self, run_id: str) -> Iterator[Any]:
        """Both leases for the whole bisect. A stop after a deploy does not keep them: the bisect
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

    def saved_snapshot(self) -> dict[str, Any]:
        """The snapshot as the bisect's state keeps it (JSON): the active pair, the route record
        as found (its signed bytes) and the `previous` links."""
        assert self.found_snapshot is not None and self._bisect_found is not None
        return {
            "active": self.found_snapshot,
            "route_record": self._bisect_found.to_bytes().decode(),
            "previous_links": list(self._bisect_links or (None, None)),
        }

    def use_snapshot(self, saved: dict[str, Any]) -> dict[str, Any]:
        """Restore to `saved` (taken by the bisect's first run) instead of what runs now: after a
        kill, what runs now is the candidate the killed run was judging."""
        from orchestrator.hosts.route import parse_route

        rec = parse_route(str(saved["route_record"]).encode(), where="the bisect state's snapshot")
        if rec is None:
            raise ConfigError("the bisect state's snapshot holds no route record", hint=RESET_HINT)
        links = saved.get("previous_links") or [None, None]
        self.found_snapshot = dict(saved["active"])
        self._bisect_found, self._bisect_links = rec, (links[0], links[1])
        return self.found_snapshot

    def _wait_busy(self, what: str, attempt_fn: Callable[[], T]) -> T:
        """As EngineDriver's, except a lease held by this bisect's own killed earlier run is not
        waited for (only the dead-run release frees it): said at once."""
        try:
            return attempt_fn()
        except LeaseHeldError as exc:
            text = f"{exc.message} {exc.hint or ''}"
            dead = next((r for r in self.own_runs if f"run {r}" in text or f"--dead-run {r}" in text), None)
            if dead is None:
                return super()._wait_busy(what, attempt_fn)
            raise LeaseHeldError(
                f"pair {self.pair} is still held by this bisect's earlier run {dead} (stopped without releasing "
                f"its leases): {exc.message}",
                hint=f"check the pair (`pairctl status --pair {self.pair}`), then `pairctl lease release "
                f"{self.pair} --dead-run {dead}` and `pairctl bisect --pair {self.pair} --resume`; the resume "
                "puts back what ran before the bisect",
            ) from None

    def deploy_checked(self, ids: tuple[str, str], profile: str, checks: tuple[str, ...], why: str) -> RunResult:
        """A full deploy with acceptance limited to `checks` (all when empty); the engine rolls
        it back on failure (RolledBack carries the receipt)."""
        return self._deploy(*ids, profile, why, checks=checks)

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
