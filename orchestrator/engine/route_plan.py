"""The route write a plan carries, decided before its first change: the route_states transition, the
record it starts from and the sealed records `route` / `route-accepted` write on both hosts (a dry
run prints them but for the fields only the writing run knows), signed and anchored at the pair's
evidence head as the run found it.
"""

from __future__ import annotations

from orchestrator.engine import route_states
from orchestrator.engine.context import RunInputs
from orchestrator.engine.plan import RouteWrite
from orchestrator.errors import PairctlError
from orchestrator.hosts.route import RouteEntry, RouteRecord, parse_route


def parsed(data: bytes | None) -> RouteRecord | None:
    """A record's bytes as a record; None: none, or one that does not parse (refused before any change)."""
    try:
        return parse_route(data)
    except PairctlError:
        return None


def _seal(inputs: RunInputs, rec: RouteRecord, state: str) -> RouteRecord:
    update = {"state": state, "evidence_head": inputs.evidence_head, "evidence_home": inputs.evidence_home}
    return rec.model_copy(update={**update, "mac": None}).sign(inputs.route_key)


def for_deploy(
    inputs: RunInputs, current: RouteRecord | None, new: RouteEntry, prior: RouteEntry | None, deferred: tuple[str, ...]
) -> RouteWrite:
    """The deploy's records, decided with its plan: `activating`, and what route-accepted settles
    it as. Sealed again once prepare hashed the models: only `deferred` and RUN_FIELDS may change."""
    pair, run = inputs.view.name, inputs.run_id
    keep = inputs.options.restore_record
    if keep is not None:
        rec = route_states.restore(current, keep, new, pair=pair, run_id=run)
        state = rec.state
    else:
        rec = route_states.activate(current, new, prior, pair=pair, run_id=run)
        state = route_states.finish(rec, accepted=inputs.options.accepts_fully).state
    rec = _seal(inputs, rec, route_states.ACTIVATING)
    settled = rec.model_copy(update={"state": state, "mac": None}).sign(inputs.route_key)
    how = "restore" if keep is not None else "activate"
    return RouteWrite(how, current.revision if current else None, rec, settled, deferred)


def for_restore(
    inputs: RunInputs,
    kind: str,
    *,
    found: RouteRecord | None,
    current: RouteRecord | None,
    restored: RouteEntry | None,
    wrote: bool,
) -> RouteWrite:
    """A restore's record (back-out | roll-back | roll-to) from the one found at the start and
    `current`, the one it replaces (a failed deploy's own, when it `wrote` one)."""
    base = current.revision if current else None
    if restored is None and not wrote:
        return RouteWrite("unchanged", base)  # nothing was recorded for the failed pair
    if kind == "back-out" and not wrote and found is not None and route_states.unchanged_by_back_out(found, restored):
        # the record already names the restored pair in its settled state: writing it again would
        # change only the revision, and a host whose root takes no new file (read-only) could not
        return RouteWrite("unchanged", base)
    pair, run = inputs.view.name, inputs.run_id
    if kind == "back-out" or found is None or restored is None:
        kind, rec = "back-out", route_states.back_out(current, found, restored, pair=pair, run_id=run)
    elif kind == "roll-to":
        rec = route_states.roll_to(found, restored, pair=pair, run_id=run)
    else:
        kind, rec = "roll-back", route_states.roll_back(found, restored, pair=pair, run_id=run)
    return RouteWrite(kind, base, _seal(inputs, rec, rec.state))
