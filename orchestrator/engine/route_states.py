"""The route record's states and transitions, written down once; every command goes through here.

States of `active`: `activating` (deploy switched and verified identity, acceptance not finished),
`active` (the whole acceptance suite passed; route/1's wire name), `identity-verified` (acceptance
skipped or partial, or `rollback --to` a release). `previous_state` is the state `previous` had while
active (absent in older records: read as `active`). Each transition is pure and returns the successor
record, revision + 1 except `finish`; `rollout.on_revision` and `route_trust` read the states.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from orchestrator.hosts.route import RouteEntry, RouteRecord, next_record

ACTIVATING: Final = "activating"
ACCEPTED: Final = "active"
IDENTITY_ONLY: Final = "identity-verified"
STATES: Final = (ACTIVATING, ACCEPTED, IDENTITY_ONLY)


def state_of_previous(rec: RouteRecord | None) -> str:
    """The state the record's previous pair had while active (older records: accepted)."""
    return (rec.previous_state if rec is not None else None) or ACCEPTED


def settled(state: str) -> str:
    """The state a pair keeps once it is no longer being activated: an activation that never
    finished was never accepted."""
    return IDENTITY_ONLY if state == ACTIVATING else state


def same_pair(a: RouteEntry | None, b: RouteEntry | None) -> bool:
    if a is None or b is None:
        return a is b
    key = ("native_package", "rpc_package", "profile_sha256", "argv_sha256")
    return all(getattr(a, k) == getattr(b, k) for k in key)


def _next(
    found: RouteRecord | None,
    active: RouteEntry | None,
    state: str,
    previous: RouteEntry | None,
    previous_state: str | None,
    *,
    pair: str,
    run_id: str,
    now: datetime | None,
) -> RouteRecord:
    rec = next_record(found, pair=pair, active=active, previous=previous, run_id=run_id, now=now)
    return rec.model_copy(update={"state": state, "previous_state": previous_state if previous else None})


def activate(
    found: RouteRecord | None,
    new: RouteEntry,
    prior: RouteEntry | None,
    *,
    pair: str,
    run_id: str,
    now: datetime | None = None,
) -> RouteRecord:
    """`prior`: found's active pair as a rollback would render it now (None: nothing active)."""
    if found is None or found.active is None or prior is None or same_pair(prior, new):
        prev, prev_state = (found.previous, state_of_previous(found)) if found else (None, None)
    else:
        prev, prev_state = prior, settled(found.state)
    return _next(found, new, ACTIVATING, prev, prev_state, pair=pair, run_id=run_id, now=now)


def finish(rec: RouteRecord, *, accepted: bool) -> RouteRecord:
    return rec.model_copy(update={"state": ACCEPTED if accepted else IDENTITY_ONLY})


def back_out(
    current: RouteRecord | None,
    found: RouteRecord | None,
    restored: RouteEntry | None,
    *,
    pair: str,
    run_id: str,
    now: datetime | None = None,
) -> RouteRecord:
    """`current`: what the rollback replaces (the failed deploy's own record, or found)."""
    return _next(
        current,
        restored,
        settled(found.state) if found is not None and restored is not None else IDENTITY_ONLY,
        found.previous if found else None,
        state_of_previous(found) if found else None,
        pair=pair,
        run_id=run_id,
        now=now,
    )


def unchanged_by_back_out(found: RouteRecord, restored: RouteEntry | None) -> bool:
    """A back-out of a run that wrote no record would write `found` again: the same pairs and
    states, only the revision higher (the record then stays as it was)."""
    return restored is not None and same_pair(found.active, restored) and found.state == settled(found.state)


def roll_back(
    found: RouteRecord, restored: RouteEntry, *, pair: str, run_id: str, now: datetime | None = None
) -> RouteRecord:
    return _next(
        found, restored, state_of_previous(found), found.active, settled(found.state), pair=pair, run_id=run_id, now=now
    )


def roll_to(
    found: RouteRecord, restored: RouteEntry, *, pair: str, run_id: str, now: datetime | None = None
) -> RouteRecord:
    if found.previous is not None and same_pair(found.previous, restored):
        return roll_back(found, restored, pair=pair, run_id=run_id, now=now)
    return _next(found, restored, IDENTITY_ONLY, found.active, settled(found.state), pair=pair, run_id=run_id, now=now)


def restore(
    current: RouteRecord | None,
    found: RouteRecord,
    restored: RouteEntry,
    *,
    pair: str,
    run_id: str,
    now: datetime | None = None,
) -> RouteRecord:
    """`current` is what the restore replaces (its revision counts on), `found` what to restore."""
    state = settled(found.state) if same_pair(found.active, restored) else IDENTITY_ONLY
    return _next(
        current,
        restored,
        state,
        found.previous,
        state_of_previous(found) if found.previous else None,
        pair=pair,
        run_id=run_id,
        now=now,
    )


def rebuilt(
    found: RouteRecord | None,
    active: RouteEntry,
    previous: RouteEntry | None,
    *,
    pair: str,
    run_id: str,
    now: datetime | None = None,
) -> RouteRecord:
    keep = found is not None and same_pair(found.active, active)
    state = settled(found.state) if keep and found is not None else IDENTITY_ONLY
    prev_state = state_of_previous(found) if found is not None and same_pair(found.previous, previous) else None
    return _next(
        found,
        active,
        state,
        previous,
        prev_state or (IDENTITY_ONLY if previous else None),
        pair=pair,
        run_id=run_id,
        now=now,
    )
