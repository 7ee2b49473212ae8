"""Judging what the hosts say about a pair before anything is decided from it.

The hosts are untrusted input. Every command that reads the route record judges both hosts' records
and links here: same bytes on both, signed by this home (`mac`, HMAC-SHA256 with `<home>/route.key`)
and byte for byte what pairctl writes, argv digests right, `current` naming the recorded active
release, anchored in the writing home's evidence chain (`unpulled` for another home's record whose
receipts are not here: a warning, offline first), and no `activating` record of a finished run.
Each problem names host, path and the command that resolves it.

A `current` that disagrees with a signed record while both releases are installed is a switch cut
short (kind `switched`): deploy and rollback resolve it themselves, so crash recovery needs no repair.
Deploy lets pass an unsigned record, an unaccepted activation and a switch cut short; rollback the
last two.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

from orchestrator.engine import route_states
from orchestrator.engine.actions import ACTIONS
from orchestrator.engine.plan import PairView
from orchestrator.errors import ConfigError, EvidenceError, HostStateError, PairctlError
from orchestrator.evidence import atomic
from orchestrator.evidence.receipt import Receipt
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.probes import HostFacts
from orchestrator.hosts.route import RouteRecord, entry_argv_ok, parse_route
from orchestrator.paths import Home
from orchestrator.roles import ROLES, Role

KEY_NAME = "route.key"
# what a record from another home looks like here when it does not name its home (`evidence_home`,
# written by an older pairctl): unanchored; this says so, not "deleted"
OTHER_HOME = (
    "written from another operator's home that shares route.key by a pairctl that did not name its home in the "
    "record (deploy again, or repair, to write one that does)"
)
CHAIN_WALK_LIMIT = 500  # receipts walked back from the chain head to find the route's writer

# kinds of problem (Problem.kind)
PARSE, DIFFER, MISSING, UNSIGNED, FORGED, ARGV, PAIR, LINKS, SWITCHED, RELEASE, ACTIVATING, EVIDENCE, UNPULLED = (
    "parse",
    "differ",
    "missing",
    "unsigned",
    "forged",
    "argv",
    "pair",
    "links",
    "switched",
    "release",
    "activating",
    "evidence",
    "unpulled",  # written by another operator home whose receipts are not here (yet): a warning
)
DEPLOY_ALLOWS = frozenset({UNSIGNED, ACTIVATING, SWITCHED, UNPULLED})
ROLLBACK_ALLOWS = frozenset({ACTIVATING, SWITCHED, UNPULLED})


def route_key(home: Home) -> bytes:
    """The key route records are signed with, created 0600 on first use by link (never replace),
    so two first runs agree on one key. A key others can read is refused: it could forge records."""
    path = home.root / KEY_NAME
    home.root.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(path):
        atomic.write_once(path, secrets.token_hex(32).encode() + b"\n", mode=0o600)
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
        raise ConfigError(
            f"{path}: the route signing key must be a plain file only you can read (mode 0600)",
            hint=f"chmod 600 {path}",
        )
    key = path.read_bytes().strip()
    if len(key) < 32:
        raise ConfigError(
            f"{path}: the route signing key is too short ({len(key)} bytes)",
            hint=f"remove {path} and run `pairctl repair --pair PAIR --yes` to sign anew",
        )
    return key


@dataclass(frozen=True)
class Problem:
    kind: str
    text: str
    hint: str

    def __str__(self) -> str:
        return f"{self.text} (fix: {self.hint})"


@dataclass
class Judgement:
    """The record both hosts agree on (None: none, or none that parses) and what is wrong."""

    record: RouteRecord | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def switched(self) -> bool:
        """Some host's `current` left switched by a run cut short (see the module doc)."""
        return any(p.kind == SWITCHED for p in self.problems)

    def refusing(self, allowed: Collection[str]) -> list[Problem]:
        return [p for p in self.problems if p.kind not in allowed]

    def refuse(self, command: str, allowed: Collection[str]) -> None:
        """Raise (before any change) when a problem not in `allowed` stands: EvidenceError (10)
        when only the evidence anchor is wrong, else HostStateError (6)."""
        bad = self.refusing(allowed)
        if not bad:
            return
        text = f"{command} refused, nothing was changed: " + "; ".join(p.text for p in bad)
        hint = "; ".join(dict.fromkeys(p.hint for p in bad))
        if all(p.kind == EVIDENCE for p in bad):
            raise EvidenceError(text, hint=hint)
        raise HostStateError(text, hint=hint)


def _where(view: PairView, role: Role) -> str:
    return f"{view.hosts[role]}:{view.layouts[role].route}"


def judge(
    view: PairView,
    facts: Mapping[str, HostFacts],
    key: bytes,
    evidence: EvidenceStore | None,
    *,
    run_id: str | None = None,
) -> Judgement:
    """Every problem with both hosts' route records and links; pure apart from reading evidence."""
    pair = view.name
    repair = f"`pairctl repair --pair {pair}` shows the record it would rebuild from the links (--yes writes it)"
    recs, problems = _parse_records(view, facts, repair, key)
    problems += _release_problems(view, facts, repair)
    record = recs.get("native") or recs.get("rpc")
    if record is None:
        if not any(p.kind == PARSE for p in problems) and any(facts[r].current for r in ROLES):
            cur = ", ".join(f"{view.hosts[r]}: {facts[r].current}" for r in ROLES if facts[r].current)
            problems.append(
                Problem(
                    MISSING,
                    f"no route record on either host ({_where(view, 'native')}, "
                    f"{_where(view, 'rpc')}) although current links name a release ({cur})",
                    repair,
                )
            )
        return Judgement(None, problems)
    role_of_record: Role = "native" if recs.get("native") else "rpc"
    where = _where(view, role_of_record)
    raw = facts[role_of_record].route_bytes
    problems += _signature_problems(record, where, raw, key, pair, repair)
    signed = _signed_as_written(record, raw, key)
    problems += _link_problems(view, facts, record, signed, repair)
    if evidence is not None:
        problems += _evidence_problems(record, evidence, key, run_id, pair, repair)
    return Judgement(record, problems)


def _parse_records(
    view: PairView, facts: Mapping[str, HostFacts], repair: str, key: bytes
) -> tuple[dict[Role, RouteRecord | None], list[Problem]]:
    """Each host's record as parsed (a role missing: it does not parse), and whether they differ."""
    problems: list[Problem] = []
    recs: dict[Role, RouteRecord | None] = {}
    for role in ROLES:
        try:
            recs[role] = parse_route(facts[role].route_bytes, where=_where(view, role), pair=view.name)
        except HostStateError as exc:
            problems.append(Problem(PARSE, exc.message, repair))
    settling = _split_settle(recs, facts, key)
    if settling is not None:  # the other host's settled copy is dropped: judged as `activating`
        recs = {settling: recs[settling]}
    elif len(recs) == 2 and facts["native"].route_bytes != facts["rpc"].route_bytes:
        problems.append(
            Problem(
                DIFFER,
                f"the route records differ: {_where(view, 'native')} has "
                f"{_describe(recs['native'])}, {_where(view, 'rpc')} has "
                f"{_describe(recs['rpc'])}",
                repair,
            )
        )
    return recs, problems


def _split_settle(recs: Mapping[Role, RouteRecord | None], facts: Mapping[str, HostFacts], key: bytes) -> Role | None:
    """The role whose copy is `activating` when a run was cut short between its hosts' writes of one
    record: both signed here, the other copy that record settled or the settled revision it came from."""
    a, b = recs.get("native"), recs.get("rpc")
    if a is None or b is None or a.state == b.state or "activating" not in (a.state, b.state):
        return None
    if not all(_signed_as_written(r, facts[role].route_bytes, key) for role, r in (("native", a), ("rpc", b))):
        return None
    role: Role = "native" if a.state == "activating" else "rpc"
    new, old = (a, b) if role == "native" else (b, a)
    if new.model_copy(update={"state": old.state, "mac": None}) == old.model_copy(update={"mac": None}):
        return role
    return role if _activated_from(new, old) else None


def _activated_from(new: RouteRecord, old: RouteRecord) -> bool:
    """`new` is the `activating` record a deploy's route step makes from the settled `old`."""
    if (new.pair, new.revision, new.evidence_home) != (old.pair, old.revision + 1, old.evidence_home):
        return False
    if new.updated_by == old.updated_by or new.active is None:
        return False
    kept = route_states.state_of_previous(old) if old.previous else None
    if old.active is None or route_states.same_pair(old.active, new.active):  # a first deploy, or a re-deploy
        return new.previous == old.previous and new.previous_state == kept
    return route_states.same_pair(new.previous, old.active) and new.previous_state == route_states.settled(old.state)


def found_record(facts: Mapping[str, HostFacts], key: bytes) -> RouteRecord | None:
    """The record a run that puts a pair back starts from: the native host's, or the `activating`
    copy of a run cut short between its hosts' writes (the one judge takes)."""
    try:
        recs = {role: parse_route(facts[role].route_bytes) for role in ROLES}
    except HostStateError:
        return None
    return recs[_split_settle(recs, facts, key) or "native"]


def _signed_as_written(rec: RouteRecord, raw: bytes | None, key: bytes) -> bool:
    """Signed with this home's key, and the bytes on the host are the ones pairctl writes for it."""
    return bool(rec.mac is not None and rec.mac_ok(key) and raw == rec.to_bytes())


def _release_problems(view: PairView, facts: Mapping[str, HostFacts], repair: str) -> Iterator[Problem]:
    """A `current` link that names a release not installed on its host."""
    for role in ROLES:
        f = facts[role]
        if f.current and f.current not in f.releases:
            root = view.layouts[role].root
            yield Problem(
                RELEASE,
                f"{view.hosts[role]}: {root}/run/current names release {f.current}, which is not in {root}/releases/",
                f"on {view.hosts[role]}, point current at an installed release "
                f"(ln -sfn {root}/releases/ID {root}/run/current) "
                f"or remove it, then {repair}",
            )


def _signature_problems(
    record: RouteRecord, where: str, raw: bytes | None, key: bytes, pair: str, repair: str
) -> Iterator[Problem]:
    """The record names another pair, is unsigned, forged, or carries an entry whose argv was edited."""
    if record.pair != pair:
        yield Problem(PAIR, f"{where} is the record of pair {record.pair!r}, not {pair!r}", repair)
    rev = f"{where} (revision {record.revision})"
    if record.mac is None:
        yield Problem(UNSIGNED, f"{rev} carries no signature: written by an older pairctl or by hand", repair)
    elif not record.mac_ok(key):
        yield Problem(
            FORGED,
            f"{rev} does not verify against this home's "
            "route key: it was edited on the host, or written from another operator's home",
            repair,
        )
    elif raw != record.to_bytes():
        # The signature covers what the parser kept; bytes pairctl never wrote (a key given twice,
        # another encoding, a BOM) could read differently to another parser.
        yield Problem(
            FORGED,
            f"{rev} is signed, but its bytes are not the ones pairctl "
            "writes (a key given twice, another encoding or layout): it was rewritten on the host",
            repair,
        )
    for label, entry in (("active", record.active), ("previous", record.previous)):
        if entry is not None and not entry_argv_ok(entry):
            yield Problem(
                ARGV,
                f"{where}: the {label} entry's argv_sha256 does not match its argv (edited after pairctl wrote it)",
                repair,
            )


def _link_problems(
    view: PairView, facts: Mapping[str, HostFacts], record: RouteRecord, signed: bool, repair: str
) -> Iterator[Problem]:
    """Each host's `current` against the release the record names active: a switch cut short
    (signed record, both installed) or links that disagree."""
    for role in ROLES:
        want = record.active.package(role) if record.active else None
        linked = facts[role].current
        if linked == want:
            continue
        text = (
            f"{view.hosts[role]}: {view.layouts[role].root}/current names "
            f"{linked or 'nothing'} but the route record names "
            f"{want or 'nothing'} active"
        )
        releases = facts[role].releases
        if signed and want in releases and linked in releases and record.active is not None:
            yield Problem(
                SWITCHED,
                text + " (a run cut short between its switch and its route record)",
                f"free a dead run's leases as status names them, then `pairctl rollback --pair {view.name}` "
                f"puts back the recorded pair {record.active.names()}, or deploy again",
            )
        else:
            yield Problem(LINKS, text, repair)


def _evidence_problems(
    record: RouteRecord, evidence: EvidenceStore, key: bytes, run_id: str | None, pair: str, repair: str
) -> Iterator[Problem]:
    """The record against the writing home's evidence: not pulled, an activation never accepted,
    an anchor that does not hold, or a record put back over a newer one."""
    writer = writer_evidence(record, evidence)
    if writer is not None and writer is not evidence and writer.run_status(record.updated_by)[0] == "unknown":
        writer = None  # pulled before that run's receipt was pushed: the remote only appends, so not a deletion
    if record.updated_by == run_id:
        return
    if writer is None:
        if record.mac_ok(key):
            yield Problem(
                UNPULLED,
                f"route record revision {record.revision} was written by run {record.updated_by} from operator "
                f"home {record.evidence_home}, whose receipts this home has not pulled: not checked against them",
                "`pairctl receipts pull` (the inventory's evidence_remote) fetches them",
            )
        return
    if record.state == "activating":
        state, why = writer.run_status(record.updated_by)
        if state not in ("running", "elsewhere"):
            yield Problem(
                ACTIVATING,
                f"route record revision {record.revision} names "
                f"{record.active.names() if record.active else 'nothing'} as activating by run "
                f"{record.updated_by}, which is over ({why}): that pair was never accepted",
                f"`pairctl rollback --pair {pair}` puts the last accepted pair back (or deploy again)",
            )
    if record.mac is not None and record.mac_ok(key):
        anchor, replayed = _anchor(record, writer, pair)
        if replayed is None and writer is not evidence:
            replayed = _replayed_here(record, evidence, pair)
        yield from [
            Problem(EVIDENCE, t, f"`pairctl receipts verify`; then {repair} to re-anchor the record") for t in anchor
        ]
        if replayed:
            yield Problem(FORGED, replayed, repair)


def writer_evidence(record: RouteRecord, evidence: EvidenceStore) -> EvidenceStore | None:
    """The evidence of the home that wrote `record`: this home's (also for records written before
    homes were named), else the pulled copy of the writing home's (None: not pulled)."""
    home = record.evidence_home
    if home is None or home == evidence.home_id(create=False):
        return evidence
    return evidence.team_store(home)


def _replayed_here(record: RouteRecord, evidence: EvidenceStore, pair: str) -> str | None:
    """A record another home wrote, older than a revision this home wrote since: put back."""
    mine = highest_recorded(evidence, pair)
    if mine is None or mine <= record.revision:
        return None
    return (
        f"route record revision {record.revision} was written by run {record.updated_by} from operator home "
        f"{record.evidence_home}, but this home later wrote revision {mine}: an earlier record was put back"
    )


def switched_links(
    record: RouteRecord, facts: Mapping[str, HostFacts], judged: Judgement
) -> dict[str, tuple[str | None, str | None]]:
    """(current, previous) that put back the recorded active pair on each host a cut-short run
    switched: previous is the record's previous release where kept there, else what the link named."""
    out: dict[str, tuple[str | None, str | None]] = {}
    if record.active is None or not judged.switched:
        return out
    for role in ROLES:
        want = record.active.package(role) if record.active else None
        linked = facts[role].current
        if linked == want:
            continue
        p = record.previous.package(role) if record.previous else None
        out[role] = (want, p if p in facts[role].releases and p != want else linked)
    return out


def anchor_problems(record: RouteRecord, evidence: EvidenceStore, pair: str) -> list[str]:
    """The run that wrote `record` (signed by this home) left its receipt in the pair's chain,
    right after the head the record names; its journal counts while it runs or awaits sealing."""
    return _anchor(record, evidence, pair)[0]


def highest_recorded(evidence: EvidenceStore, pair: str) -> int | None:
    """The highest route revision any run of this home recorded writing for PAIR (the newest
    CHAIN_WALK_LIMIT receipts): repair starts above it, so a revision never goes down."""
    revs = [rev for r in chain(evidence, pair, CHAIN_WALK_LIMIT) if (rev := _route_write(r)) is not None]
    return max(revs) if revs else None


def chain(evidence: EvidenceStore, pair: str, limit: int) -> Iterator[Receipt]:
    """PAIR's receipts, newest first, at most `limit`; the walk ends where the chain cannot be read."""
    try:
        r = evidence.latest(pair)
        for _ in range(limit):
            if r is None:
                return
            yield r
            r = evidence.load(r.previous) if r.previous else None
    except PairctlError:
        return


def _route_write(receipt: Receipt) -> int | None:
    """The highest route revision a run recorded writing (route, route-accepted, route-repair
    steps; per-host or local step data), None when it wrote none."""
    revs: list[int] = []
    for s in receipt.steps:
        if s.data.get("action") not in ACTIONS or not ACTIONS[s.data["action"]].writes_route:
            continue
        for d in (s.data, *(v for v in s.data.values() if isinstance(v, dict))):
            if d.get("read_back") == "byte-identical" and type(d.get("revision")) is int:
                revs.append(d["revision"])
    return max(revs) if revs else None


def _anchor(record: RouteRecord, evidence: EvidenceStore, pair: str) -> tuple[list[str], str | None]:
    """anchor_problems, and (one walk) whether a later run of this home wrote the same or a newer revision:
    a signed record of an earlier run put back on the hosts (with its links) is not the pair's state."""
    run = record.updated_by
    state, _ = evidence.run_status(run)
    if state in ("running", "dead", "elsewhere"):
        return [], None
    mine = record.evidence_home in (None, evidence.home_id(create=False))
    what = f"route record revision {record.revision} was written by run {run} from " + (
        "this home" if mine else f"operator home {record.evidence_home} (its receipts as pulled here)"
    )
    try:
        r = evidence.latest(pair)
    except PairctlError as exc:
        return [f"{what}, but pair {pair}'s evidence chain cannot be read: {exc}"], None
    if r is None:
        return [
            f"{what}, but there is no evidence chain for pair {pair} under {evidence.root}: {OTHER_HOME} "
            "or this home's evidence was deleted"
        ], None
    newer: str | None = None
    head_seen = record.evidence_head is None
    for _ in range(CHAIN_WALK_LIMIT):
        head_seen = head_seen or r.sha256 == record.evidence_head
        if r.run_id == run:
            return _anchor_at(r, record, what, pair), newer
        rev = _route_write(r)
        if newer is None and rev is not None and rev >= record.revision:  # equal: another record of its revision
            newer = (
                f"{what}, but a later run ({r.command} {r.run_id}, receipt {r.sha256[:12]}) wrote revision {rev}: "
                "an earlier record was put back on the hosts"
            )
        if r.previous is None:
            break
        try:
            r = evidence.load(r.previous)
        except PairctlError as exc:
            return [f"{what}; pair {pair}'s evidence chain breaks before reaching its receipt: {exc}"], None
    # the writer was not found: receipts met on the walk cannot be ordered against it, so a higher
    # revision among them says nothing of a replay (the missing evidence is the problem: exit 10)
    if not head_seen:  # the chain it followed is not this one: not evidence of a deletion here
        return [
            f"{what}, but neither its receipt nor the receipt it followed ({(record.evidence_head or '')[:12]}) is in "
            f"pair {pair}'s evidence chain under {evidence.root}: {OTHER_HOME}, or this home's receipts were deleted"
        ], None
    return [
        f"{what}, but its receipt is not in pair {pair}'s evidence chain under {evidence.root}, "
        f"although the receipt it followed ({record.evidence_head[:12] if record.evidence_head else 'none'}) is: "
        "the newest receipts were deleted"
    ], None


def _anchor_at(r: Receipt, record: RouteRecord, what: str, pair: str) -> list[str]:
    """The writer's receipt `r` follows the chain head the record names."""
    if r.previous != record.evidence_head:
        return [
            f"{what}; its receipt {r.sha256} follows {r.previous or 'nothing'} in pair {pair}'s chain, "
            f"but the record names {record.evidence_head or 'no receipt'} as the head it followed "
            "(the chain was rewritten)"
        ]
    return []


def _describe(rec: RouteRecord | None) -> str:
    if rec is None:
        return "no record"
    return f"revision {rec.revision} by run {rec.updated_by}"
