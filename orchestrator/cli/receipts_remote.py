"""`pairctl receipts push|pull|init-remote` and `verify --remote`: the team's evidence remote
(orchestrator/evidence/team.py), configured by the inventory's `evidence_remote`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli.context import Ctx, evidence_store_for, get_ctx
from orchestrator.errors import ConfigError, PairctlError

if TYPE_CHECKING:
    from orchestrator.evidence.store import EvidenceStore
    from orchestrator.evidence.team import RemoteAccess
    from orchestrator.evidence.verify import VerifyReport


def access_of(c: Ctx) -> RemoteAccess:
    """The inventory's remote; its allowed_signers (what decides whose pushes are believed) is
    judged by owner and mode like every config file pairctl trusts (config/trust.py): exit 3."""
    from pathlib import Path

    from orchestrator.config import trust
    from orchestrator.config.evidence_remote import resolve_remote

    access = resolve_remote(c.inventory())
    if access is None:
        raise ConfigError(
            f"the inventory {c.inventory_ref} names no evidence_remote",
            hint="add `evidence_remote: {url: ssh://HOST/PATH.git, allowed_signers: FILE}` "
            "(docs/guides/team-evidence.md)",
        )
    if access.allowed_signers is not None and Path(access.allowed_signers).exists():
        why = trust.unsafe_reason(Path(access.allowed_signers))
        if why:
            raise ConfigError(
                f"refusing evidence_remote.allowed_signers {access.allowed_signers}: {why}", hint=trust.FIX
            )
    return access


def push_cmd(ctx: typer.Context) -> None:
    """Commit this home's new receipts (signed with your SSH key) and push them to the team's remote."""
    from orchestrator.evidence import team
    from orchestrator.evidence.store import _operator

    c = get_ctx(ctx)
    store = evidence_store_for(c)
    res = team.push(store, access_of(c), _operator(None))
    doc = {"home": store.home_id(), "commit": res.commit, "added": res.added, "pushed": res.pushed, "lost": res.lost}
    if res.lost:
        typer.echo(f"pairctl: warning: {team.lost_message(store, res.lost)}", err=True)
    c.say(doc, f"home {doc['home']}: {res.added} new receipt(s), commit {res.commit or '-'} pushed")


def pull_cmd(ctx: typer.Context) -> None:
    """Fetch every operator home's receipts from the team's remote into read-only copies here."""
    from orchestrator.errors import EvidenceError
    from orchestrator.evidence import team

    c = get_ctx(ctx)
    res = team.pull(evidence_store_for(c), access_of(c))
    c.say(
        {"homes": res.homes, "problems": res.problems},
        *(f"home {home}: {n} new receipt(s)" for home, n in sorted(res.homes.items())),
    )
    if res.problems:
        raise EvidenceError(f"{len(res.problems)} problem(s); first: {res.problems[0]}")


def init_remote_cmd(ctx: typer.Context) -> None:
    """Create (or update) the bare repository the inventory's evidence_remote names, on its host,
    over SSH with strict host keys: append-only (receive.denyNonFastForwards, receive.denyDeletes)
    and a pre-receive hook that refuses a dropped or changed receipt, a non-fast-forward and a
    commit not signed by the key allowed_signers binds to the branch's home (`homes/HOME-ID`).
    Run it again after changing allowed_signers: the hook reads the copy it leaves there."""
    from orchestrator.evidence.team import init_remote, read_signers

    c = get_ctx(ctx)
    a = access_of(c)
    init_remote(a, read_signers(a.allowed_signers))
    c.say(
        {"url": a.url, "hook": "pre-receive", "allowed_signers": a.allowed_signers},
        f"{a.url}: an append-only bare repository; its pre-receive hook accepts only appended receipts "
        f"signed by each home's own key in {a.allowed_signers}",
    )


def quarantine_cmd(
    ctx: typer.Context,
    stray: str = typer.Argument(..., metavar="HOME-ID", help="The home whose branch homes/HOME-ID to set aside."),
    reason: str = typer.Option(..., "--reason", metavar="TEXT", help="Why (kept in the signed receipt)."),
) -> None:
    """Set a stray or rogue branch aside: a sealed receipt here (who, why, when, the branch's tip),
    pushed in a signed commit of this home's branch. `receipts verify --remote` then reports that
    branch as quarantined, with the decision, instead of failing the team; if the branch moves
    past the recorded tip, verify fails again."""
    from orchestrator.errors import UsageError
    from orchestrator.evidence import team
    from orchestrator.evidence.store import HOME_ID, _operator

    c = get_ctx(ctx)
    store = evidence_store_for(c)
    access = access_of(c)
    if not HOME_ID.match(stray):
        raise UsageError(f"{stray!r} cannot name an operator home (letters, digits, . _ - only)")
    if stray == store.home_id():
        raise UsageError("a home cannot quarantine its own branch")
    team.pull(store, access)
    tip = team.branch_tip(store, stray)
    if tip is None:
        raise UsageError(f"the evidence remote {access.url} has no branch homes/{stray}")
    who: set[str] = set()
    found = team.signature_problems(store, stray, access.allowed_signers, who)
    j = store.begin(team.QUARANTINE, ["receipts", "quarantine", stray], inputs={"home": stray, "tip": tip})
    with j.step("decision") as step:
        step.data.update(
            {
                "home": stray,
                "branch": f"homes/{stray}",
                "tip": tip,
                "reason": reason,
                "remote": access.url,
                "signers": sorted(who),
                "problems": found,
            }
        )
    sha = j.finish("passed", f"branch homes/{stray} set aside at {tip[:12]}: {reason}")
    res = team.push(store, access, _operator(None))
    doc = {"home": stray, "tip": tip, "reason": reason, "receipt": sha, "by": _operator(None), "pushed": res.pushed}
    c.say(
        doc, f"homes/{stray} quarantined at {tip[:12]} by {doc['by']} (receipt {sha[:16]}, commit {res.commit or '-'})"
    )


def verify_remote(c: Ctx, store: EvidenceStore, rep: VerifyReport) -> None:
    """Pull, then add to `rep`: every home's commit signatures and append-only history, every
    pulled home's chains, and every receipt here that differs from the remote's copy."""
    from orchestrator.evidence import team
    from orchestrator.evidence.verify import Problem

    access = access_of(c)
    found: list[tuple[str, str]] = []
    for state in team.remote_state(access):
        if state == "unhooked":
            rep.warnings.append(
                f"{access.url} has no pairctl pre-receive hook (made before it existed): it takes whatever is pushed "
                "and only verify sees it; run `pairctl receipts init-remote` to install it"
            )
        else:
            found.append(
                ("trust", f"the evidence repository is not safe to believe: {state.removeprefix('untrusted: ')}")
            )
    res = team.pull(store, access)
    me = store.home_id()
    found += [("pull", p) for p in res.problems]
    homes = team.team_homes(store)
    per_home: dict[str, list[tuple[str, str]]] = {}
    chains: dict[str, tuple[int, dict[str, int]]] = {}
    for home in homes:
        mine: list[tuple[str, str]] = []
        who: set[str] = set()
        mine += [("signature", p) for p in team.signature_problems(store, home, access.allowed_signers, who)]
        rep.signers[home] = sorted(who)
        copy = store if home == me else store.team_store(home)
        if copy is not None:
            pruned = set(store.pruned()) if home == me else set()
            mine += [("differs", p) for p in team.local_differences(store, home, copy, pruned)]
            if copy is not store:
                sub = copy.verify()
                mine += [(p.kind, f"home {home}: {p.message}") for p in sub.problems]
                chains[home] = (sub.receipts, sub.chains)
        per_home[home] = mine
    # a decision counts from this home, or from a home whose own branch verifies: a rogue branch
    # cannot set an honest one aside
    sound = [h for h, m in per_home.items() if h != me and not [k for k, t in m if not _only_warning(k, t)]]
    decisions = team.quarantine_decisions(
        [(me, store), *((h, s) for h in sound if (s := store.team_store(h)) is not None)]
    )
    for home in homes:
        mine = per_home[home]
        d = decisions.get(home) if home != me else None
        if d is not None:
            tip = team.branch_tip(store, home)
            if tip == d["tip"]:
                rep.quarantined[home] = {**d, "problems": [t for _, t in mine]}
                continue  # its receipts and chains are not the team's
            moved = f"home {home}: its branch moved to {str(tip)[:12]} past its quarantine at {d['tip'][:12]}"
            mine.append(("quarantine", moved))
        if home in chains:
            rep.receipts += chains[home][0]
            rep.chains.update({f"{home}/{k}": v for k, v in chains[home][1].items()})
        found += mine
    for kind, text in found:
        if _only_warning(kind, text):
            rep.warnings.append(text)
        else:
            rep.problems.append(Problem(f"remote-{kind}", access.url, text, None, "~"))


def _only_warning(kind: str, text: str) -> bool:
    return kind == "signature" and text.startswith("no allowed signers")


def register(app: typer.Typer) -> None:
    app.command("push")(push_cmd)
    app.command("pull")(pull_cmd)
    app.command("init-remote")(init_remote_cmd)
    app.command("quarantine")(quarantine_cmd)


def push_after_run(c: Ctx | None) -> None:
    """After a command that sealed receipts: push them when the inventory names a remote. A failed
    push is a warning (the receipts stay here; the next command or `receipts push` retries) and
    never changes the command's exit code."""
    from orchestrator.evidence import store as ev

    roots = set(ev.WRITTEN)
    ev.WRITTEN.clear()
    if not roots or c is None or c._inventory is None:
        return
    try:
        from orchestrator.config.evidence_remote import resolve_remote
        from orchestrator.evidence import team

        access = resolve_remote(c._inventory)
        if access is None:
            return
        for root in roots:
            store = ev.EvidenceStore(root)
            res = team.push(store, access, ev._operator(None))
            if res.lost:
                typer.echo(f"pairctl: warning: {team.lost_message(store, res.lost)}", err=True)
    except (PairctlError, ValueError, OSError) as exc:
        text = getattr(exc, "message", None) or str(exc)
        typer.echo(
            f"pairctl: warning: receipts not pushed to the evidence remote ({text}); they are kept here and "
            "`pairctl receipts push` (or the next command) sends them",
            err=True,
        )
