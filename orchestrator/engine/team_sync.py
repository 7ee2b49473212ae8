"""The team's evidence remote as the engine meets it: pull another home's receipts before its route
record is judged, and compare this home's evidence with the remote's for `status`. Offline first: a
remote that does not answer is a warning, never a refusal of its own.
"""

from __future__ import annotations

from orchestrator.config.evidence_remote import resolve_remote
from orchestrator.config.inventory import Inventory
from orchestrator.errors import PairctlError
from orchestrator.evidence import team
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.route import parse_route


def pull_for_route(evidence: EvidenceStore, inventory: Inventory, route_bytes: bytes | None) -> str | None:
    """Pull when the record on the hosts was written by another home whose run is not here yet;
    a warning when the remote could not be reached (None: nothing to do, or pulled)."""
    access = resolve_remote(inventory)
    if access is None:
        return None
    try:
        rec = parse_route(route_bytes)
    except PairctlError:
        return None  # judged (and refused) by route_trust
    if rec is None or rec.evidence_home in (None, evidence.home_id(create=False)):
        return None
    writer = evidence.team_store(rec.evidence_home)
    if writer is not None and writer.run_status(rec.updated_by)[0] != "unknown":
        return None
    try:
        team.pull(evidence, access)
    except PairctlError as exc:
        return f"evidence remote not pulled: {exc.message}"
    return None


def remote_problems(evidence: EvidenceStore, inventory: Inventory) -> tuple[list[str], list[str]]:
    """(problems, warnings): receipts the remote holds that this home's evidence (or its copy of
    another home's) lacks or holds otherwise, after pulling; against the last fetch when offline."""
    access = resolve_remote(inventory)
    if access is None:
        return [], []
    warnings: list[str] = []
    problems: list[str] = []
    try:
        problems += team.pull(evidence, access).problems
    except PairctlError as exc:
        warnings.append(f"evidence remote: {exc.message} (compared with the last fetched copy)")
    problems += team.local_differences(evidence, evidence.home_id(), evidence)
    for home, copy in evidence.team_stores().items():
        problems += team.local_differences(evidence, home, copy)
    if team.ahead(evidence):
        warnings.append("this home has receipts not yet on the evidence remote (`pairctl receipts push` sends them)")
    return problems, warnings
