"""Which model validates which manifest: used by `config check` and `config schema`.

A file's kind comes from `--kind`, else its folder, else its keys; `check_file` reports the
fields, then the cross-references and flag policy on the search path pairctl itself uses.
Every kind is named here, also those whose models live with the code that uses them, so a
missing one is an import error, never a kind silently skipped; the table sits with the `config`
command because it names models of every layer, and config/ imports none above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.checks.fixtures import FixtureSet
from orchestrator.config import search
from orchestrator.config.inventory import Inventory, PairSpec, api_key_file_problems, check_expanded_root
from orchestrator.config.kernels import CaseSet, KernelPatch
from orchestrator.config.loader import expand, load_model, read_yaml, validation_problems
from orchestrator.config.profiles import RouteProfile, load_profile, profile_from_record
from orchestrator.config.targets import Target
from orchestrator.engine.actions import ACTIONS
from orchestrator.engine.playbook import Playbook, required_steps
from orchestrator.errors import ConfigError
from orchestrator.paths import KERNELS, default_home
from orchestrator.qualify.plan import QualifyPlan
from orchestrator.roles import ROLES


def schemas() -> dict[str, type[BaseModel]]:
    """Every manifest kind and the model that validates it."""
    return {
        "target": Target,
        "profile": RouteProfile,
        "inventory": Inventory,
        "playbook": Playbook,
        "plan": QualifyPlan,
        "kernel": KernelPatch,
        "kernel-cases": CaseSet,
        "fixtures": FixtureSet,
    }


def _kind_of(path: Path) -> str | None:
    """The kind a file's location says (None: its folder says nothing)."""
    parent = path.resolve().parent
    for layer in search.current_layers():
        for kind in search.KIND_DIRS:
            if parent == layer.folder(kind).resolve():
                return kind
    if path.name == "kernel.yaml":
        return "kernel"
    if path.name == "cases.yaml" and parent.parent == KERNELS.resolve():
        return "kernel-cases"
    return None


def _keys(model: type[BaseModel]) -> tuple[set[str], set[str]]:
    fields = model.model_fields.items()
    return {f.alias or n for n, f in fields}, {f.alias or n for n, f in fields if f.is_required()}


def infer_kind(data: Any, models: dict[str, type[BaseModel]]) -> str | None:
    """The kind whose fields a mapping's top-level keys match best: most keys known, fewest
    unknown, fewest required ones missing. None when nothing matches or two kinds tie."""
    if not isinstance(data, dict) or not data:
        return None
    keys = {str(k) for k in data}
    scored: list[tuple[tuple[int, int], str]] = []
    for kind, model in models.items():
        fields, required = _keys(model)
        known = len(keys & fields)
        if known:
            scored.append(((known - len(keys - fields), -len(required - keys)), kind))
    scored.sort(reverse=True)
    if not scored or (len(scored) > 1 and scored[0][0] == scored[1][0]):
        return None
    return scored[0][1]


def default_files() -> list[Path]:
    """Every file `config check` looks at by default: what each name resolves to (operator files
    and the bundled ones they do not override), and the bundled kernel metadata."""
    files: list[Path] = []
    for kind in search.KIND_DIRS:
        files += [r.path for r in search.names(kind).values()]
    files += sorted(KERNELS.glob("*/kernel.yaml"))
    files += sorted(KERNELS.glob("*/cases.yaml"))
    return files


@dataclass(frozen=True)
class FileCheck:
    path: Path
    kind: str | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_file(path: Path, *, kind: str | None, models: dict[str, type[BaseModel]] | None = None) -> FileCheck:
    """Every problem of one file, in one pass (fields and cross-references)."""
    models = models if models is not None else schemas()
    try:
        data = read_yaml(path)
    except ConfigError as e:
        return FileCheck(path, kind, (str(e),))
    k = kind or _kind_of(path) or infer_kind(data, models)
    if k is None:
        why = f"{path}: cannot tell what kind of file this is from its folder or its keys; pass --kind (one of: "
        return FileCheck(path, None, (f"{why}{', '.join(sorted(models))})",))
    if k not in models:
        return FileCheck(path, k, (f"{path}: unknown kind {k!r}; known: {', '.join(sorted(models))}",))
    # a plan in a config repo's plans/ resolves its fixture paths against that folder (as loading
    # it by name does); one elsewhere against the bundled plans folder
    context: dict[str, Any] | None = None
    if k == "plan" and _kind_of(path) == "plan":
        context = {"base_dir": str(path.resolve().parent)}
    elif k == "profile":
        context = _profile_context(path)
    elif k == "playbook":
        context = {"actions": ACTIONS}
    problems, fields_ok = validation_problems(models[k], data, source=str(path), context=context)
    if k == "inventory" and not problems:
        problems += _expanded_root_problems(str(path), Inventory.model_validate(data))
        problems += _api_key_problems(str(path), Inventory.model_validate(data))
    if k == "playbook" and isinstance(data, dict) and path.stem in required_steps() and data.get("name") != path.stem:
        problems.append(
            f"{path}: field 'name': is {data.get('name')!r} but pairctl loads this file as the "
            f"{path.stem!r} playbook; name it {path.stem!r}"
        )
    if isinstance(data, dict):
        problems += cross_references(k, data, source=str(path), fields_ok=fields_ok)
    return FileCheck(path, k, tuple(dict.fromkeys(problems)))


# -- cross-references -----------------------------------------------------------------------


def _exists(kind: str, name: str) -> bool:
    try:
        search.resolve_ref(kind, name)
    except ConfigError:
        return False
    return True


def _missing(source: str, field: str, kind: str, name: str) -> str:
    known = sorted(search.names(kind))
    return (
        f"{source}: field '{field}': no {kind} named {name!r} on the config search path"
        f" (known: {', '.join(known) or 'none'}); add {search.KIND_DIRS[kind]}/{name}.yaml to your config repo"
        " or name an existing one"
    )


def cross_references(kind: str, data: dict[str, Any], *, source: str, fields_ok: bool) -> list[str]:
    """Names a file uses that must exist elsewhere (pure over the raw mapping, so they are
    reported even when its fields are wrong)."""
    if kind == "inventory":
        return _inventory_refs(data, source, fields_ok)
    if kind == "plan" and isinstance(data.get("profile"), str) and not _exists("profile", data["profile"]):
        return [_missing(source, "profile", "profile", data["profile"])]
    fx = data.get("answer_fixtures")
    if kind == "profile" and isinstance(fx, str) and not _exists("fixtures", fx):
        return [_missing(source, "answer_fixtures", "fixtures", fx)]
    return []


def _inventory_refs(data: dict[str, Any], source: str, fields_ok: bool) -> list[str]:
    out: list[str] = []
    hosts: dict[str, Any] = data["hosts"] if isinstance(data.get("hosts"), dict) else {}
    pairs: dict[str, Any] = data["pairs"] if isinstance(data.get("pairs"), dict) else {}
    for pname, pair in pairs.items():
        if not isinstance(pair, dict):
            continue
        at = f"pairs.{pname}"
        if not fields_ok:  # the model's own pair -> host check runs only once the fields validate
            for side in ROLES:
                h = pair.get(side)
                if isinstance(h, str) and h not in hosts:
                    known = ", ".join(sorted(map(str, hosts))) or "none"
                    out.append(
                        f"{source}: field '{at}.{side}': host {h!r} is not in hosts ({known}); "
                        "add it under hosts or name one of those"
                    )
        profile_name = pair.get("profile", "lab")
        profile = None
        if isinstance(profile_name, str):
            if not _exists("profile", profile_name):
                out.append(_missing(source, f"{at}.profile", "profile", profile_name))
            else:
                profile, problems = _pair_profile(source, at, profile_name, pair)
                out += problems
        for field in ("target_native", "target_rpc"):
            t = pair.get(field)
            if isinstance(t, str) and not _exists("target", t):
                out.append(_missing(source, f"{at}.{field}", "target", t))
        models: dict[str, Any] = pair["models"] if isinstance(pair.get("models"), dict) else {}
        if profile is not None:
            roles = [("model", profile.model)] + (
                [("draft.model", profile.draft.model)] if profile.draft is not None and profile.draft.model else []
            )
            for what, role in roles:
                if role not in models:
                    out.append(
                        f"{source}: field '{at}.models': profile {profile.name!r} uses model role {role!r} "
                        f"({what}), which this pair does not define; add models.{role} with the GGUF's path"
                    )
    return out


def _expanded_root_problems(source: str, inv: Inventory) -> list[str]:
    """Install roots as every command expands them (`${VAR}`, `~`)."""
    out: list[str] = []
    for name, h in inv.hosts.items():
        try:
            if (root := _expanded(h.install_root)) is not None:
                check_expanded_root(name, h.install_root, root)
        except ConfigError as exc:
            out.append(f"{source}: {exc}")
    return out


def _api_key_problems(source: str, inv: Inventory) -> list[str]:
    """Each pair's api_key_file as deploy reads it (expanded as commands expand it): missing,
    unreadable, a key llama-server reads differently, or readable by other users."""
    return [
        f"{source}: field 'pairs.{name}.api_key_file': {p}"
        for name, pair in inv.pairs.items()
        if pair.api_key_file and (path := _expanded(pair.api_key_file)) is not None
        for p in api_key_file_problems(name, path)
    ]


def _expanded(value: str) -> str | None:
    """VALUE as commands expand it; None for a variable unset here (left to the command that runs with it)."""
    try:
        return expand(value, {"PAIRCTL_HOME": str(default_home())})
    except ConfigError:
        return None


def _pair_spec(pair: dict[str, Any]) -> PairSpec | None:
    try:
        return PairSpec.model_validate(pair)
    except ValueError:  # its own problems are reported with the inventory's fields
        return None


def _pair_profile(source: str, at: str, name: str, pair: dict[str, Any]) -> tuple[RouteProfile | None, list[str]]:
    """A pair's profile: its own fields first (an invalid one is named once, its problems are the
    profile file's), then the flag policy under this pair's allow_flags and API key (a pair whose
    own fields are invalid allows nothing), as deploy judges it."""
    path = search.resolve_ref("profile", name)
    try:
        profile = profile_from_record(read_yaml(path), what=str(path))
    except ConfigError:
        return None, [
            f"{source}: field '{at}.profile': profile {name!r} is itself invalid; run `pairctl config check {path}`"
        ]
    try:
        load_profile(str(path), pair=_pair_spec(pair))
    except ConfigError as e:
        lines = [line.strip() for line in str(e).splitlines()[1:]] or [str(e)]
        return profile, [
            f"{source}: field '{at}.profile': profile {name!r} is refused for this pair: {line}" for line in lines
        ]
    return profile, []


def _profile_context(path: Path) -> dict[str, object]:
    """A profile checked alone may use a risky flag only where every inventory pair on the search
    path serving it allows it (with an API key); a profile no pair allows is judged with nothing
    allowed."""
    allowed: dict[str, str] | None = None
    for res in search.names("inventory").values():
        try:
            inv = load_model(Inventory, res.path)
        except ConfigError:
            continue
        for pair in inv.pairs.values():
            if not _serves(pair.profile, path):
                continue
            mine = dict(pair.allow_flags) if pair.api_key_file else {}
            allowed = mine if allowed is None else {k: v for k, v in allowed.items() if k in mine}
    return {"allow_flags": allowed or {}, "api_key": bool(allowed)}


def _serves(ref: str, path: Path) -> bool:
    """Whether a pair's profile reference names this file (by name on the search path, or as a path)."""
    if ref in (path.stem, str(path)):
        return True
    try:
        return search.resolve_ref("profile", ref).resolve() == path.resolve()
    except (ConfigError, OSError):
        return False
