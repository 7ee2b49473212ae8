"""Which model validates which manifest folder: used by `config check` and `config schema`.

Every kind is named here, also those whose models live with the code that uses them (playbooks,
qualification plans, fixture sets): a missing one is an import error, never a kind silently skipped.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from orchestrator.checks.fixtures import FixtureSet
from orchestrator.config.inventory import Inventory
from orchestrator.config.kernels import CaseSet, KernelPatch
from orchestrator.config.loader import load_model
from orchestrator.config.profiles import RouteProfile
from orchestrator.config.targets import Target
from orchestrator.engine.playbook import Playbook
from orchestrator.errors import ConfigError
from orchestrator.paths import KERNELS, MANIFESTS, PLAYBOOKS
from orchestrator.qualify.plan import QualifyPlan


def schemas() -> dict[str, type[BaseModel]]:
    """Every manifest kind and the model that validates it."""
    return {
        "target": Target, "profile": RouteProfile, "inventory": Inventory, "playbook": Playbook,
        "plan": QualifyPlan, "kernel": KernelPatch, "kernel-cases": CaseSet, "fixtures": FixtureSet,
    }

FOLDERS = {
    "target": MANIFESTS / "targets",
    "profile": MANIFESTS / "profiles",
    "inventory": MANIFESTS / "inventories",
    "plan": MANIFESTS / "plans",
    "fixtures": MANIFESTS / "fixtures",
    "playbook": PLAYBOOKS,
}


def _kind_of(path: Path) -> str | None:
    parent = path.resolve().parent
    for kind, folder in FOLDERS.items():
        if parent == folder.resolve():
            return kind
    if path.name == "kernel.yaml":
        return "kernel"
    if path.name == "cases.yaml" and parent.parent == KERNELS.resolve():
        return "kernel-cases"
    return None


def default_files() -> list[Path]:
    files: list[Path] = []
    for folder in FOLDERS.values():
        files += sorted(folder.glob("*.yaml"))
    files += sorted(KERNELS.glob("*/kernel.yaml"))
    files += sorted(KERNELS.glob("*/cases.yaml"))
    return files


def check_all(paths: list[Path] | None, *, kind: str | None, variables: dict[str, str]) -> list[tuple[Path, str | None]]:
    models = schemas()
    out: list[tuple[Path, str | None]] = []
    for p in paths or default_files():
        k = kind or _kind_of(p)
        if k is None:
            out.append((p, f"{p}: cannot tell what kind of file this is; pass --kind"))
            continue
        if k not in models:
            out.append((p, f"{p}: unknown kind {k!r}"))
            continue
        try:
            loaded = load_model(models[k], p, context=_profile_context(p, variables) if k == "profile" else None)
            if k == "inventory":
                _check_pair_profiles(p, loaded)
            out.append((p, None))
        except ConfigError as e:
            out.append((p, str(e)))
    return out


def _check_pair_profiles(path: Path, inventory: BaseModel) -> None:
    """Each pair's profile under that pair's flag policy (its allow_flags and API key)."""
    from orchestrator.config.inventory import Inventory
    from orchestrator.config.profiles import load_profile

    assert isinstance(inventory, Inventory)
    for name, pair in inventory.pairs.items():
        try:
            load_profile(pair.profile, pair=pair)
        except ConfigError as e:
            raise ConfigError(
                f"{path}: pair {name!r}: profile {pair.profile!r} is refused for this pair:\n{e}") from None


def _profile_context(path: Path, variables: dict[str, str]) -> dict[str, object] | None:
    """A profile checked alone may use a risky flag only where every repo inventory pair serving it allows it
    (with an API key); a profile no pair allows is judged with nothing allowed."""
    from orchestrator.config.inventory import Inventory
    allowed: dict[str, str] | None = None
    for inv_path in sorted(FOLDERS["inventory"].glob("*.yaml")):
        try:
            inv = load_model(Inventory, inv_path)
        except ConfigError:
            continue
        for pair in inv.pairs.values():
            if pair.profile not in (path.stem, str(path)):
                continue
            mine = dict(pair.allow_flags) if pair.api_key_file else {}
            allowed = mine if allowed is None else {k: v for k, v in allowed.items() if k in mine}
    return {"allow_flags": allowed or {}, "api_key": bool(allowed)}
