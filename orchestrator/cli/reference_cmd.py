"""`pairctl reference set|show`: the package pair a route's answers are compared with.

Setting one writes a receipt (command `reference`) into the pair's chain, which `checks.reference`
reads; its answers are recorded by its next acceptance.
"""

from __future__ import annotations

from typing import Any

import typer

from orchestrator.build.store import PackageStore
from orchestrator.checks.reference import COMMAND, FIELD, ReferenceState, load_state
from orchestrator.cli.context import evidence_store_for, get_ctx
from orchestrator.errors import ConfigError, PackageError
from orchestrator.roles import Role

app = typer.Typer(help="A route's reference package pair: the yardstick of its answers.", no_args_is_help=True)


def _revision(store: PackageStore, package_id: str, role: Role) -> str:
    try:
        return str(store.get(package_id).manifest.revision)
    except (PackageError, KeyError, FileNotFoundError):
        raise ConfigError(
            f"--{role}-package {package_id}: no such package in the local store",
            hint="`pairctl packages list` shows the built packages",
        ) from None


def state_dict(pair: str, st: ReferenceState) -> dict[str, Any]:
    return {
        "pair": pair,
        "reference": st.pin.as_dict() if st.pin else None,
        "answers": [
            {
                "key": a.key,
                "receipt": a.receipt,
                "fixture_set": a.raw.get("fixture_set"),
                "models": a.raw.get("models"),
                "fixtures": len(a.raw.get("answers") or []),
                "numerics": a.raw.get("numerics"),
                "floor": a.raw.get("floor"),
                "gates": a.raw.get("derived_gates"),
            }
            for a in st.answers.values()
        ],
    }


@app.command("set")
def set_(
    ctx: typer.Context,
    pair: str = typer.Option(..., "--pair", help="Pair (route) whose reference this becomes."),
    package: str | None = typer.Option(None, "--package", help="One package for both roles."),
    native_package: str | None = typer.Option(None, "--native-package", help="Package of the native host."),
    rpc_package: str | None = typer.Option(None, "--rpc-package", help="Package of the RPC host."),
    reason: str = typer.Option(..., "--reason", help="Why this pair becomes the yardstick (kept in the receipt)."),
) -> None:
    """Promote a package pair to PAIR's reference (a receipt records it); exit 2 on bad input."""
    c = get_ctx(ctx)
    c.inventory().pair(pair)
    native, rpc = native_package or package, rpc_package or package
    if not native or not rpc or (package and (native_package or rpc_package)):
        raise ConfigError("give --package, or both --native-package and --rpc-package")
    if not reason.strip():
        raise ConfigError("--reason must say why this pair becomes the reference")
    store = PackageStore(c.home.store)
    revs = {_revision(store, native, "native"), _revision(store, rpc, "rpc")}
    if len(revs) != 1:
        raise ConfigError(
            f"{native} and {rpc} come from different revisions ({', '.join(sorted(revs))}); "
            "a reference is a matched pair"
        )
    evidence = evidence_store_for(c)
    before = load_state(evidence, pair)
    argv = ["reference", "set", "--pair", pair, "--native-package", native, "--rpc-package", rpc, "--reason", reason]
    journal = evidence.begin(command=COMMAND, argv=argv, pair=pair, inputs={})
    with journal:
        journal.set(
            FIELD,
            {
                "native_package": native,
                "rpc_package": rpc,
                "revision": revs.pop(),
                "reason": reason,
                "previous": before.pin.as_dict() if before.pin else None,
            },
        )
        receipt = journal.finish("passed", f"reference of {pair} set to {native} / {rpc}")
    out = {**state_dict(pair, load_state(evidence, pair)), "receipt": receipt}
    c.say(
        out,
        f"reference of {pair}: {native} / {rpc} (receipt {receipt[:16]}); its answers are recorded "
        "by its next acceptance",
    )


@app.command("show")
def show(ctx: typer.Context, pair: str = typer.Option(..., "--pair", help="Pair (route) to show.")) -> None:
    """The reference of PAIR, how it became one, and the answer sets recorded for it."""
    c = get_ctx(ctx)
    c.inventory().pair(pair)
    out = state_dict(pair, load_state(evidence_store_for(c), pair))
    if c.json_output:
        c.emit_json(out)
        return
    pin = out["reference"]
    if pin is None:
        c.line(f"pair {pair} has no reference yet: its first accepted pair becomes it")
        return
    c.line(
        f"reference of {pair}: {pin['native_package']} / {pin['rpc_package']} ({pin['how']}, "
        f"receipt {str(pin['receipt'])[:16]})"
    )
    for a in out["answers"]:
        n, f, g = a.get("numerics") or {}, a.get("floor") or {}, a.get("gates") or {}
        c.line(
            f"  answers {a['key'][:12]}: {a['fixtures']} fixtures of {a['fixture_set']}, receipt {a['receipt'][:16]}; "
            f"KV {n.get('cache_type_k')}/{n.get('cache_type_v')}, FA {n.get('flash_attn')}; replay floor max "
            f"|dlogprob| {f.get('max_abs_dlogprob')}, gates |dlogprob| {g.get('max_abs_dlogprob')} "
            f"KL {g.get('max_kl')}"
        )
    if not out["answers"]:
        c.line("  no answers recorded yet: accept the reference pair to record them")
