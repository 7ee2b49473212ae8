"""`pairctl diff`: what runs on a pair against what the inventory and a profile ask now.

A read: no lease, no receipt. Per host, the running release and argv (from /proc) against what a
deploy would render now (engine/targets.py `render_recorded`), as a unified diff, one flag a line.
"""

from __future__ import annotations

import difflib
from typing import Any

from orchestrator.build.store import PackageStore
from orchestrator.config.inventory import Inventory
from orchestrator.engine import targets
from orchestrator.engine.plan import pair_view
from orchestrator.errors import HostStateError
from orchestrator.hosts.identity import read_identities
from orchestrator.hosts.probes import argv_from, read_facts
from orchestrator.hosts.route import parse_route
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool
from orchestrator.roles import ROLES, SERVICE_OF_ROLE


def argv_lines(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The program, then one flag with its values a line (a value like -1 is a value, not a flag)."""
    out: list[str] = []
    for a in argv:
        is_flag = a.startswith("-") and len(a) > 1 and not a[1].isdigit() and a[1] != "."
        if not out or is_flag:
            out.append(a)
        else:
            out[-1] += " " + a
    return out


def pair_diff(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    *,
    profile: str | None = None,
    packages: tuple[str, str] | None = None,
) -> dict[str, Any]:
    view = pair_view(inventory, pair_name)
    spec = inventory.pair(pair_name)
    store = PackageStore(home.store)
    with TransportPool(inventory) as pool:
        t = {r: pool.get(view.hosts[r]) for r in ROLES}
        facts = {r: read_facts(t[r], view.layouts[r], (SERVICE_OF_ROLE[r],)) for r in ROLES}
        prepared = tuple(r for r in ROLES if facts[r].svc_sha256)
        idents = read_identities({r: t[r] for r in prepared}, view.layouts, prepared) if prepared else {}
        dirs = {r: facts[r].folders[SERVICE_OF_ROLE[r]] for r in prepared}
    rec = parse_route(facts["native"].route_bytes, where=f"{view.hosts['native']}:route.json", pair=pair_name)
    if packages is None:
        if rec is not None and rec.active is not None:
            packages = (rec.active.native_package, rec.active.rpc_package)
        elif facts["native"].current and facts["rpc"].current:
            packages = (facts["native"].current, facts["rpc"].current)
        else:
            raise HostStateError(
                f"diff: pair {pair_name} was never deployed and no packages were named, so there is no release "
                "to render a profile for",
                hint=f"`pairctl diff --pair {pair_name} --native ID --rpc ID` compares against those packages",
            )
    want_profile = profile or spec.profile
    target = targets.render_recorded(view, spec, packages[0], packages[1], want_profile, {}, store, "wanted")
    wanted = {"native": target.activation.native_argv, "rpc": target.activation.rpc_argv}
    out: dict[str, Any] = {
        "pair": pair_name,
        "profile": want_profile,
        "route_profile": rec.active.profile_name if rec is not None and rec.active is not None else None,
        "hosts": {},
        "same": True,
    }
    for r in ROLES:
        host = view.hosts[r]
        ident = idents.get(r)
        running = list(ident.argv) if ident is not None and ident.running else []
        want = list(wanted[r])
        if running and r in dirs and dirs[r] != view.layouts[r].run:  # runs from the runtime dir: its log is there
            want = list(argv_from(want, view.layouts[r].root, SERVICE_OF_ROLE[r], dirs[r]))
        pkg = packages[0] if r == "native" else packages[1]
        lines = list(
            difflib.unified_diff(
                argv_lines(running),
                argv_lines(want),
                fromfile=f"{host}: running from {facts[r].current}" if running else f"{host}: not running",
                tofile=f"{host}: {want_profile} on {pkg}",
                lineterm="",
                n=1,
            )
        )
        same = running == want and facts[r].current == pkg
        out["hosts"][host] = {
            "role": r,
            "service": SERVICE_OF_ROLE[r],
            "running": ident is not None and ident.running,
            "current": facts[r].current,
            "wanted_release": pkg,
            "running_argv": running,
            "wanted_argv": want,
            "diff": lines,
            "same": same,
        }
        out["same"] = out["same"] and same
    return out
