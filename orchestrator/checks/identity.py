"""Identity before and after the suite: the pair that was accepted is the pair that ran.

Two sources, compared across the suite: deploy's `verify_identity` (`ctx.identity_probe`) and the
server's own `/props` read here, plus, where the profile declares `split`, the devices' share of
the model from the load log (checks.split). The check fails if either side reports a problem
before or after, or if anything changed in between.
"""

from __future__ import annotations

from typing import Any

from orchestrator.checks import split
from orchestrator.checks.base import CheckContext, CheckResult, IdentitySnapshot, result, verdict_of

NAME = "identity"

# Facts from the probe that legitimately change across a suite are not compared.
VOLATILE = frozenset({"at", "checked_at", "uptime_s"})


def http_identity(ctx: CheckContext) -> dict[str, Any]:
    p = ctx.client.props()
    return {
        "build_info": p.build_info,
        "total_slots": p.total_slots,
        "n_ctx_per_slot": p.n_ctx_per_slot,
        "model_path": p.model_path,
    }


def http_problems(ctx: CheckContext, seen: dict[str, Any]) -> list[str]:
    p = []
    if seen["total_slots"] != ctx.profile.parallel:
        p.append(f"/props total_slots {seen['total_slots']}, profile {ctx.profile.name} wants {ctx.profile.parallel}")
    if seen["n_ctx_per_slot"] != ctx.per_slot():
        p.append(f"/props per-slot n_ctx {seen['n_ctx_per_slot']}, profile gives {ctx.per_slot()}")
    return p


def _strip(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in VOLATILE}
    if isinstance(d, list):
        return [_strip(x) for x in d]
    return d


def diff(before: Any, after: Any, path: str = "") -> list[str]:
    """Human-readable differences between two identity snapshots (pure)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for k in sorted(set(before) | set(after)):
            where = f"{path}.{k}" if path else str(k)
            if k not in before:
                out.append(f"{where}: appeared during the suite")
            elif k not in after:
                out.append(f"{where}: disappeared during the suite")
            else:
                out += diff(before[k], after[k], where)
        return out
    if before != after:
        return [f"{path}: {str(before)[:80]!r} -> {str(after)[:80]!r}"]
    return []


def snapshot(ctx: CheckContext) -> dict[str, Any]:
    """Both identity sources now; problems are part of the snapshot, never raised."""
    snap: dict[str, Any] = {"problems": []}
    try:
        snap["http"] = http_identity(ctx)
        snap["problems"] += http_problems(ctx, snap["http"])
    except Exception as exc:
        snap["http"] = None
        snap["problems"].append(f"cannot read /props: {type(exc).__name__}: {exc}")
    if ctx.profile.split is not None:
        seen = split.read_split(ctx)
        snap["split"] = seen["split"]
        snap["problems"] += seen["problems"]
    if ctx.identity_probe is not None:
        try:
            s: IdentitySnapshot = ctx.identity_probe()
            snap["probe"] = dict(s.data)
            snap["problems"] += list(s.problems)
        except Exception as exc:
            snap["probe"] = None
            snap["problems"].append(f"identity probe failed: {type(exc).__name__}: {exc}")
    return snap


def judge(before: dict[str, Any], after: dict[str, Any], *, probe_configured: bool) -> CheckResult:
    problems = [f"before: {x}" for x in before["problems"]] + [f"after: {x}" for x in after["problems"]]
    changes = diff(
        _strip({k: v for k, v in before.items() if k != "problems"}),
        _strip({k: v for k, v in after.items() if k != "problems"}),
    )
    problems += [f"changed during the suite: {c}" for c in changes]
    http = before.get("http") or {}
    figures = {
        "build_info": http.get("build_info"),
        "slots": http.get("total_slots"),
        "n_ctx_per_slot": http.get("n_ctx_per_slot"),
        "host_probe": probe_configured,
        "changed": len(changes),
        "split": {n: d["layers"] for n, d in ((before.get("split") or {}).get("devices") or {}).items()} or None,
    }
    msg = "; ".join(problems) or (
        "identical before and after the suite"
        + ("" if probe_configured else " (HTTP only: no host identity probe configured)")
    )
    return result(
        NAME, verdict_of(problems), msg, figures=figures, raw={"before": before, "after": after, "changes": changes}
    )
