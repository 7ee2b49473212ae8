"""The model files a pair serves, identified by sha256 on the native host.

The helper (`pairctl-svc model-hash`) caches each file's sha256 under its stat (device, inode,
size, mtime and ctime in ns), so a model of tens of GB is read again only when it changes. Status
and acceptance re-read them against the route entry: a file replaced under a running server
changes what it serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.hosts.probes import ModelHash, parse_model_hashes
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import Transport


def hash_models(transport: Transport, layout: Any, paths: Iterable[str]) -> dict[str, ModelHash]:
    """sha256 of each file on the host, by path (one exec; a missing file has sha256 None)."""
    paths = sorted(set(paths))
    if not paths:
        return {}
    res = transport.run(layout.model_hash_cmd(paths), check=True, timeout=3600)
    return parse_model_hashes(as_text(res.stdout))


def check_models(
    paths: Mapping[str, str],
    expected: Mapping[str, str],
    host: str,
    transport: Transport,
    layout: Any,
    *,
    expected_is: str,
    mismatch_means: str = "",
    kind: str = "model",
) -> tuple[dict[str, ModelHash], list[str]]:
    """Hash the model files `paths` (name -> path) on the host (one exec) and compare each with
    `expected` (name -> sha256; without one it need only exist). Returns what was found by name
    and a problem per missing or differing file ("..., `expected_is` SHA `mismatch_means`")."""
    seen = hash_models(transport, layout, paths.values())
    found, problems = {}, []
    for name, path in sorted(paths.items()):
        h = seen.get(path)
        what = f"{kind} {name}" if name == path else f"{kind} {name} ({path})"
        if h is not None and h.how == "notfile":
            problems.append(f"{host}: {what} is not a regular file (a directory?)")
        elif h is None or h.sha256 is None:
            problems.append(f"{host}: {what} is missing")
        elif name in expected and h.sha256 != expected[name]:
            problems.append(
                f"{host}: {what} has sha256 {h.sha256}, {expected_is} {expected[name]}"
                + (f" {mismatch_means}" if mismatch_means else "")
            )
        else:
            found[name] = h
    return found, problems


def recorded_model_problems(
    recorded: Mapping[str, str], models: Mapping[str, Any], host: str, transport: Transport, layout: Any
) -> list[str]:
    """The route entry's model hashes (`recorded`, name -> sha256) against the files the
    inventory's `models` name now, re-hashed on the native host."""
    if not recorded:
        return []
    problems = [
        f"{host}: model {n} is in the route entry but not in the inventory, so it cannot be checked"
        for n in sorted(recorded)
        if n not in models
    ]
    return problems + _changed_since_deploy(
        {n: models[n].path for n in recorded if n in models}, recorded, host, transport, layout
    )


def recorded_files(profile: Any) -> dict[str, str]:
    """The answer-changing files (path -> sha256) a route entry's recorded profile declares."""
    files = profile.get("files") if isinstance(profile, Mapping) else None
    if not isinstance(files, Mapping):
        return {}
    return {str(p): str(s) for p, s in files.items()}


def recorded_file_problems(profile: Any, host: str, transport: Transport, layout: Any) -> list[str]:
    """The files the route entry's profile declares (control vectors, adapters, grammars...)
    re-hashed on the native host: one replaced under a running server changes what it answers."""
    files = recorded_files(profile)
    return _changed_since_deploy({p: p for p in files}, files, host, transport, layout, "file") if files else []


def _changed_since_deploy(
    paths: Mapping[str, str],
    recorded: Mapping[str, str],
    host: str,
    transport: Transport,
    layout: Any,
    kind: str = "model",
) -> list[str]:
    """`check_models`' problems with what the route entry recorded at deploy time."""
    expected_is, means = "the route entry records", "(changed since it was deployed)"
    return check_models(
        paths, recorded, host, transport, layout, expected_is=expected_is, mismatch_means=means, kind=kind
    )[1]
