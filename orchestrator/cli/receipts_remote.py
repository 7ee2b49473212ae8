"""`pairctl receipts push|pull|init-remote` and `verify --remote`: the team's evidence remote
(orchestrator/evidence/team.py), configured by the inventory's `evidence_remote`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.cli.context import Ctx, get_ctx
from orchestrator.errors import ConfigError, PairctlError

if TYPE_CHECKING:
    from orchestrator.config.evidence_remote import RemoteAccess
    from orchestrator.evidence.store import EvidenceStore
    from orchestrator.evidence.verify import VerifyReport


def access_of(c: Ctx) -> RemoteAccess:
    from orchestrator.config.evidence_remote import resolve_remote

    access = resolve_remote(c.inventory())
    if access is None:
        raise ConfigError(
            f"the inventory {c.inventory_ref} names no evidence_remote",
            hint=(
                "add `evidence_remote: {url: ssh://HOST/PATH.git, allowed_signers: FILE}` "
                "(docs/guides/team-evidence.md)"
            ),
        )
    return access


def _store(c: Ctx) -> EvidenceStore:
    from orchestrator.evidence.store import EvidenceStore

    return EvidenceStore(c.home.evidence)


def push_cmd(ctx: typer.Context) -> None:
    """Commit this home's new receipts (signed with your SSH key) and push them to the team's remote."""
    from orchestrator.evidence import team
    from orchestrator.evidence.store import _operator

    c = get_ctx(ctx)
    store = _store(c)
    res = team.push(store, access_of(c), _operator(None))
    doc = {"home": store.home_id(), "commit": res.commit, "added": res.added, "pushed": res.pushed}
    if c.json_output:
        c.emit_json(doc)
    else:
        c.console.print(
            f"home {doc['home']}: {res.added} new receipt(s), commit {res.commit or '-'} pushed", markup=False
        )


def pull_cmd(ctx: typer.Context) -> None:
    """Fetch every operator home's receipts from the team's remote into read-only copies here."""
    from orchestrator.errors import EvidenceError
    from orchestrator.evidence import team

    c = get_ctx(ctx)
    res = team.pull(_store(c), access_of(c))
    if c.json_output:
        c.emit_json({"homes": res.homes, "problems": res.problems})
    else:
        for home, n in sorted(res.homes.items()):
            c.console.print(f"home {home}: {n} new receipt(s)", markup=False)
    if res.problems:
        raise EvidenceError(f"{len(res.problems)} problem(s); first: {res.problems[0]}")


def init_remote_cmd(ctx: typer.Context) -> None:
    """Create the bare repository the inventory's evidence_remote names, on its host, append-only
    (receive.denyNonFastForwards, receive.denyDeletes), over SSH with strict host keys."""
    from orchestrator.evidence.team import init_remote

    c = get_ctx(ctx)
    a = access_of(c)
    init_remote(a)
    c.console.print(f"{a.url}: an append-only bare repository", markup=False)


def verify_remote(c: Ctx, store: EvidenceStore, rep: VerifyReport) -> None:
    """Pull, then add to `rep`: every home's commit signatures and append-only history, every
    pulled home's chains, and every receipt here that differs from the remote's copy."""
    from orchestrator.evidence import team
    from orchestrator.evidence.verify import Problem

    access = access_of(c)
    res = team.pull(store, access)
    me = store.home_id()
    found = [("pull", p) for p in res.problems]
    for home in team.team_homes(store):
        who: set[str] = set()
        found += [("signature", p) for p in team.signature_problems(store, home, access.allowed_signers, who)]
        rep.signers[home] = sorted(who)
        copy = store if home == me else store.team_store(home)
        if copy is None:
            continue
        pruned = set(store.pruned()) if home == me else set()
        found += [("differs", p) for p in team.local_differences(store, home, copy, pruned)]
        if copy is not store:
            sub = copy.verify()
            rep.receipts += sub.receipts
            rep.chains.update({f"{home}/{k}": v for k, v in sub.chains.items()})
            found += [(p.kind, f"home {home}: {p.message}") for p in sub.problems]
    for kind, text in found:
        if kind == "signature" and text.startswith("no allowed signers"):
            rep.warnings.append(text)
        else:
            rep.problems.append(Problem(f"remote-{kind}", access.url, text, None, "~"))


def register(app: typer.Typer) -> None:
    app.command("push")(push_cmd)
    app.command("pull")(pull_cmd)
    app.command("init-remote")(init_remote_cmd)


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
            team.push(ev.EvidenceStore(root), access, ev._operator(None))
    except (PairctlError, ValueError, OSError) as exc:
        text = getattr(exc, "message", None) or str(exc)
        typer.echo(
            f"pairctl: warning: receipts not pushed to the evidence remote ({text}); they are kept here and "
            "`pairctl receipts push` (or the next command) sends them",
            err=True,
        )
