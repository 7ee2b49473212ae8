"""`pairctl status --pair NAME`: releases, services, route record, leases and killed runs of a pair.

Read-only on the hosts, no receipt, and never waits for (or blocks) a deploy holding the pair.
"""

from __future__ import annotations

from typing import Any

from orchestrator.build import revisions
from orchestrator.build.store import PackageStore, how_to_get
from orchestrator.config.inventory import Inventory
from orchestrator.engine import leasing, route_trust, team_sync
from orchestrator.engine.plan import PairView, pair_view
from orchestrator.errors import HostKeyError, HostStateError, PairctlError
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts import supervisor
from orchestrator.hosts.identity import RPC_PROBE_S, read_identities, rpc_probe
from orchestrator.hosts.layout import HostLayout
from orchestrator.hosts.leases import parse_run_of
from orchestrator.hosts.models import recorded_file_problems, recorded_files, recorded_model_problems
from orchestrator.hosts.probes import HostFacts, read_facts, rpc_probe_problem
from orchestrator.hosts.release import check_hash_output, expected_hashes, leftovers
from orchestrator.hosts.route import parse_route
from orchestrator.hosts.services import get_json
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import ConnectionLost, Transport, Unreachable
from orchestrator.roles import LLAMA_SERVER, ROLES, SERVICE_OF_ROLE


def _have(store: PackageStore, package_id: str) -> bool:
    """Whether this home holds `package_id` (a name read from a host that is no package id: no)."""
    try:
        return store.exists(package_id)
    except PairctlError:
        return False


def _bin_sha(store: PackageStore | None, package_id: str | None, name: str) -> str | None:
    if not package_id or store is None:
        return None
    try:
        return store.get(package_id).manifest.files[f"bin/{name}"].sha256
    except (PairctlError, KeyError):
        return None


def status(
    home: Home,
    inventory: Inventory,
    pair_name: str,
    *,
    argv: list[str] | None = None,
    pool: TransportPool | None = None,
    verify_files: bool = False,
) -> dict[str, Any]:
    view = pair_view(inventory, pair_name)
    store = PackageStore(home.store)
    evidence = EvidenceStore(home.evidence)
    recovered = evidence.recover_aborted(pair_name)
    own = pool is None
    pool = pool or TransportPool(inventory)
    out: dict[str, Any] = {
        "pair": pair_name,
        "hosts": {},
        "route": None,
        "problems": [],
        "warnings": [],  # worth knowing, not wrong now (exit 0): e.g. no boot persistence
        "aborted_runs_sealed": recovered,
    }
    try:
        found: dict[str, HostFacts] = {}
        out["unreachable"] = {}  # host -> why: the other host is still shown (a partial view)
        for role in ROLES:
            f = _read_host(view, role, pool, store, out, verify_files)
            if f is not None:
                found[role] = f
        if out["unreachable"]:
            # one host read: its route record is shown as that host has it, not judged (judging
            # compares both hosts' records and links; a deploy or rollback would refuse anyway)
            rec = _one_host_record(view, found, route_trust.route_key(home), out)
        else:
            _revision_problems(store, view.hosts, found, out)
            # route records and links judged as deploy and rollback judge them (engine/route_trust.py)
            if (warning := team_sync.pull_for_route(evidence, inventory, found["native"].route_bytes)) is not None:
                out["warnings"].append(warning)
            judged = route_trust.judge(view, found, route_trust.route_key(home), evidence)
            out["problems"] += [str(p) for p in judged.problems if p.kind != route_trust.UNPULLED]
            out["warnings"] += [str(p) for p in judged.problems if p.kind == route_trust.UNPULLED]
            out["host_state_problems"] = [{"kind": p.kind, "text": p.text, "fix": p.hint} for p in judged.problems]
            rec = judged.record
        if rec is not None:
            out["route"] = _route_shown(inventory, view, pool, found, rec, out)
        _health(view, rec, out)
        out["unsealed_runs"] = [u for u in evidence.unsealed() if u.get("pair") == pair_name]
        # a home rewritten after it pushed: the team's remote still holds what was written
        remote_bad, remote_warn = team_sync.remote_problems(evidence, inventory)
        out["problems"] += remote_bad
        out["warnings"] += remote_warn
        out["stale_leases"] = _stale_leases(evidence, out["hosts"])
        for s in out["stale_leases"]:  # a run that is over still holds the host: nothing restarts there
            out["problems"].append(
                f"{s['host']}: run {s['run_id']} is over ({s['why']}) but its lease is still held, so the "
                f"supervisors there stay passive; `pairctl lease release {pair_name} --dead-run {s['run_id']}` frees it"
            )
        return out
    finally:
        if own:
            pool.close()


def _read_host(
    view: PairView, role: str, pool: TransportPool, store: PackageStore, out: dict[str, Any], verify_files: bool
) -> HostFacts | None:
    """ROLE's host as status shows it (out["hosts"][host]); its facts, or None when it cannot be read."""
    host, layout = view.hosts[role], view.layouts[role]
    name = SERVICE_OF_ROLE[role]
    try:
        t = pool.get(host)
        f = read_facts(t, layout, (name,))
    except (Unreachable, ConnectionLost, HostKeyError) as exc:  # say so, show what the other host says
        out["unreachable"][host] = exc.message
        out["hosts"][host] = {
            **{"role": role, "current": None, "previous": None, "releases": [], "service": name},
            **{"running": None, "pid": None, "matches_manifest": None, "leases": []},
            **{"reachable": False, "error": exc.message},
        }
        out["problems"].append(f"{host}: not reachable, nothing read from it: {exc.message}")
        return None
    # a host pairctl never prepared has no helper to ask (and nothing of ours running)
    ident = read_identities({role: t}, {role: layout}, (role,))[role] if f.svc_sha256 else None
    h: dict[str, Any] = {
        "role": role,
        "reachable": True,
        "current": f.current,
        "previous": f.previous,
        "releases": list(f.releases),
        "service": name,
        "running": bool(ident and ident.running),
        "pid": ident.pid if ident else None,
        "matches_manifest": _matches(view, store, host, name, f, ident, out["problems"]),
        "leases": _leases(t, layout.root),
        # partial uploads of killed runs (the next deploy under the lease removes them)
        "upload_leftovers": leftovers(t, layout),
    }
    if role == "rpc" and ident is not None and ident.running:
        h["rpc_probe"] = rpc_probe(t, layout, view.rpc_bind, view.rpc_port)
        problem = rpc_probe_problem(host, name, h["rpc_probe"], RPC_PROBE_S)
        if problem:
            out["problems"].append(problem)
    h["supervisor"] = _supervisor(t, layout, view, host, name, f, out)
    if f.svc_sha256:  # a prepared host: what a reboot would bring back (hosts/managers)
        h["boot"] = layout.manager.boot_status(t, layout, name, host, running=bool(f.current), problems=out["problems"])
        if h["boot"].get("warning"):
            out["warnings"].append(f"{host}: {h['boot']['warning']}")
    if verify_files:
        h["release_files"] = _verify_current(t, layout, store, f.current, host)
        if h["release_files"].get("problem"):
            out["problems"].append(h["release_files"]["problem"])
    out["hosts"][host] = h
    return f


def _matches(
    view: PairView, store: PackageStore, host: str, name: str, f: HostFacts, ident: Any, problems: list[str]
) -> bool | None:
    """Whether the running service is current's binary (None: nothing runs, or no manifest here)."""
    if ident is None or not ident.running:
        if f.current:
            problems.append(
                f"{host}: current is {f.current} but {name} is not running; `pairctl restart --pair {view.name}` "
                "starts the pair again"
            )
        return None
    want = _bin_sha(store, f.current, name)
    matches: bool | None = want is not None and ident.exe_sha256 == want
    if f.current and not _have(store, f.current):  # missing here, not wrong there
        matches = None
        problems.append(
            f"{host}: package {f.current} (current) is not in this home ({store.root}), so running "
            f"{name} cannot be checked against its manifest; {how_to_get(f.current)}"
        )
    elif not matches:
        problems.append(f"{host}: running {name} does not match the manifest of {f.current}")
    if f.current and f"/releases/{f.current}/" not in (ident.argv[0] if ident.argv else ""):
        problems.append(f"{host}: running {name} is not from current ({f.current})")
    return matches


def _supervisor(
    t: Transport, layout: HostLayout, view: PairView, host: str, name: str, f: HostFacts, out: dict[str, Any]
) -> dict[str, Any] | None:
    """NAME's supervisor state; one that refused, died or gave up is a problem, with its fix; one
    started in the runtime dir (run/ took no new file) a warning: it serves, but not after a reboot."""
    problems: list[str] = out["problems"]
    sup = supervisor.read_state(t, layout, name)
    if sup is not None and sup.runtime_dir is not None:
        out["warnings"].append(
            f"{host}: {name} runs with its pidfiles, supervisor state and logs in {sup.runtime_dir}, because "
            f"{layout.run} took no new file (read-only?) when it started; a reboot does not bring it back until "
            f"{layout.run} is writable (its boot arguments cannot be written there): make it writable "
            f"(`mount -o remount,rw`), then `pairctl restart --pair {view.name}` starts it from run/ again"
            + _held_log(t, sup.runtime_dir, name, layout.run)
        )
    if sup is not None and sup.state == "refused":
        problems.append(
            f"{host}: the supervisor refused to start {name}: {sup.refused or 'its release failed its check'}; "
            f"`pairctl status --pair {view.name} --verify-files` names the files, then deploy or rollback"
        )
    elif sup is not None and not sup.supervisor_alive and f.current and sup.state not in ("stopped", "given-up"):
        problems.append(
            f"{host}: the supervisor of {name} is not running (killed?), so a crash of {name} is restarted "
            f"only by the crontab watchdog, within a minute, where cron runs (systemd hosts: by its unit); "
            f"`pairctl restart --pair {view.name}` starts it under a new supervisor now"
        )
    if sup is not None and sup.given_up:
        problems.append(
            f"{host}: the supervisor gave up on {name} after a crash loop ({sup.restarts} restarts, "
            f"last: {sup.last_exit or '?'}); see {sup.runtime_dir or layout.run}/{name}.out, then deploy or rollback"
        )
    return sup.as_dict() if sup else None


def _held_log(t: Transport, folder: str, name: str, run: str) -> str:
    """What llama-server's --log-file in the runtime dir holds now: that dir is in memory (tmpfs),
    and the log grows with the run (at -lv 4, every request) until the server restarts; "" for
    another service, or where there is no such file (a service user writes none there)."""
    if name != LLAMA_SERVER:
        return ""
    path = f"{folder}/{name}.log"
    try:
        st = t.stat(path)
    except OSError:
        return ""
    if st is None or not st.is_file:
        return ""
    return (
        f"; its log {path} is {st.size / 1048576:.1f} MiB and grows with every request, held in memory "
        f"until {run} is writable and {name} restarted"
    )


def _route_shown(
    inventory: Inventory,
    view: PairView,
    pool: TransportPool,
    found: dict[str, HostFacts],
    rec: Any,
    out: dict[str, Any],
) -> dict[str, Any]:
    """The route record as status shows it, with the active pair's models and files checked."""
    shown: dict[str, Any] = {
        "revision": rec.revision,
        "updated_at": rec.updated_at,
        "updated_by": rec.updated_by,
        "state": rec.state,
        "signed": rec.mac is not None,
        "evidence_head": rec.evidence_head,
        "evidence_home": rec.evidence_home,
        "active": rec.active.names() if rec.active else None,
        "active_packages": [rec.active.native_package, rec.active.rpc_package] if rec.active else None,
        "previous": rec.previous.names() if rec.previous else None,
        "previous_state": (rec.previous_state or "active") if rec.previous else None,
    }
    if "native" not in found:
        shown["read_from"] = view.hosts["rpc"]
    elif "rpc" not in found:
        shown["read_from"] = view.hosts["native"]
    native = view.hosts["native"]
    if rec.active and rec.active.models and "native" in found:
        bad = recorded_model_problems(
            rec.active.models, inventory.pair(view.name).models, native, pool.get(native), view.layouts["native"]
        )
        shown["models"] = dict(rec.active.models)
        shown["models_verified"] = not bad
        out["problems"] += bad
    if rec.active and recorded_files(rec.active.profile) and "native" in found:
        bad = recorded_file_problems(rec.active.profile, native, pool.get(native), view.layouts["native"])
        shown["files"] = recorded_files(rec.active.profile)
        shown["files_verified"] = not bad
        out["problems"] += bad
    return shown


def _health(view: PairView, rec: Any, out: dict[str, Any]) -> None:
    """llama-server's /health; a pair that should serve and does not answer is a problem (exit 1),
    hung or dead."""
    try:
        get_json(view.base_url, "/health", timeout=3)
        out["health"] = "ok"
    except Exception as exc:
        out["health"] = f"not healthy: {str(exc)[:120]}"
        if (rec is not None and rec.active is not None) or any(h.get("current") for h in out["hosts"].values()):
            out["problems"].append(f"llama-server at {view.base_url} is not healthy: {str(exc)[:120]}")


def _one_host_record(view: Any, found: dict[str, HostFacts], key: bytes, out: dict[str, Any]) -> Any:
    """The route record of the one host that answered, parsed (a damaged one is a problem)."""
    for role, f in found.items():
        try:
            rec = parse_route(f.route_bytes, where=f"{view.hosts[role]}:route.json", pair=view.name)
        except HostStateError as exc:
            out["problems"].append(exc.message)
            return None
        if rec is not None and not rec.mac_ok(key):
            out["problems"].append(f"{view.hosts[role]}: route.json is not signed by this home")
        return rec
    return None


def _revision_problems(store: PackageStore, hosts: Any, found: dict[str, HostFacts], out: dict[str, Any]) -> None:
    """Both hosts' `current` of one source revision (a pair runs one revision: build/revisions.py);
    each host's revision is shown; one this home's store does not know is a warning."""
    cur = {r: found[r].current for r in ROLES}
    for r in ROLES:
        c = cur[r]
        out["hosts"][hosts[r]]["revision"] = revisions.revision_of(store, c) if c else None
    if cur["native"] is None or cur["rpc"] is None:
        return
    revs = revisions.pair_revisions(store, cur["native"], cur["rpc"])
    if revs.native is not None and revs.rpc is not None and not revs.one:
        out["problems"].append(
            f"{hosts['native']} and {hosts['rpc']} run two source revisions: current names {revs.describe()}; "
            "a pair runs one revision (deploy one revision to both hosts)"
        )
    elif not revs.one:
        out["warnings"].append(f"cannot tell whether current is of one revision: {revs.describe()}")


def _verify_current(transport: Transport, layout: Any, store: Any, current: str | None, host: str) -> dict[str, Any]:
    """sha256 of every file in releases/CURRENT on the host (one exec) against the package manifest."""
    if not current:
        return {"verified": None}
    try:
        expected = expected_hashes(store.get(current).manifest)
    except PairctlError as exc:
        return {"verified": None, "problem": f"{host}: cannot verify release {current}: {exc}"}
    res = transport.run(layout.hash_cmd(current), check=False, timeout=300)
    if res.exit_status != 0:
        return {
            "verified": False,
            "problem": f"{host}: hashing release {current} failed (exit {res.exit_status}): "
            f"{as_text(res.stderr).strip()[-200:]}",
        }
    try:
        n = check_hash_output(expected, as_text(res.stdout), host, f"releases/{current}")
    except PairctlError as exc:
        return {"verified": False, "problem": exc.message}
    return {"verified": True, "files": n}


def _stale_leases(evidence: Any, hosts: dict[str, Any]) -> list[dict[str, Any]]:
    """Leases held by a pairctl run that this home's evidence shows over (killed, or a failed
    rollback that kept them): nothing will release them but `lease release --dead-run`."""
    out = []
    for host, h in hosts.items():
        for entry in h.get("leases") or []:
            run_id = parse_run_of((entry.get("lease") or {}).get("purpose") or "")
            if run_id is None:
                continue
            state, why = evidence.run_status(run_id)
            if state in ("ended", "dead"):
                out.append({"host": host, "run_id": run_id, "state": state, "why": why})
            elif state != "running" and entry.get("stale"):  # another home's run: its heartbeat stopped
                out.append(
                    {
                        "host": host,
                        "run_id": run_id,
                        "state": "stale",
                        "why": f"run {run_id} stopped renewing its lease (heartbeat "
                        f"{entry.get('heartbeat_age_s')} s ago, host time)",
                    }
                )
    return out


def _leases(transport: Transport, root: str) -> list[dict[str, Any]]:
    try:
        return leasing.show(transport, root)
    except Exception as exc:  # a status must still show the rest
        return [{"error": str(exc)[:200]}]
