"""Where a manifest name resolves: the operator's config repo layered over the bundled defaults.

First match wins, by file name per kind: `--config DIR` / `PAIRCTL_CONFIG` (the CLI sets the variable
so child processes see it); `./pairctl/` in the working directory or its nearest parent that has one
(found like git finds `.git`, stopping below a directory owned by someone other than the user or
root); the user config directory; the bundled defaults. A name is looked up as
`<folder>/<name>.yaml`. Nothing is believed by where it was found: config.trust judges every
directory and file (exit 3).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from orchestrator.config import trust
from orchestrator.config.loader import is_manifest_name, manifest_path
from orchestrator.errors import ConfigError
from orchestrator.paths import MANIFESTS, PLAYBOOKS

CONFIG_ENV = "PAIRCTL_CONFIG"
CWD_DIR = "pairctl"

# kind -> folder name inside a config directory (and inside the bundled manifests/)
KIND_DIRS: dict[str, str] = {
    "inventory": "inventories",
    "profile": "profiles",
    "target": "targets",
    "fixtures": "fixtures",
    "plan": "plans",
    "playbook": "playbooks",
}


@dataclass(frozen=True)
class Layer:
    """One directory of the search path and why it is there."""

    origin: str  # "PAIRCTL_CONFIG", "./pairctl", "user", "bundled"
    root: Path

    def folder(self, kind: str) -> Path:
        if self.origin == "bundled":
            return bundled_folder(kind)
        return self.root / KIND_DIRS[kind]


def bundled_folder(kind: str) -> Path:
    return PLAYBOOKS if kind == "playbook" else MANIFESTS / KIND_DIRS[kind]


def find_upwards(start: Path, name: str = CWD_DIR) -> Path | None:
    """`start/name` or the nearest parent's `name` that is a directory. The walk stops at a directory
    owned by another user; what is found is judged by search_path (config.trust)."""
    for d in (start, *start.parents):
        if not trust.owned_by_user(d):
            return None
        cand = d / name
        if cand.is_dir():
            return Path(os.path.abspath(cand))
    return None


def search_path(*, explicit: str | None, cwd: Path, user_dir: Path) -> list[Layer]:
    """The layers in order; a directory reached twice is listed once (first reason wins)."""
    layers: list[Layer] = []
    if explicit:
        root = Path(os.path.abspath(Path(explicit).expanduser()))
        if not root.is_dir():
            raise ConfigError(
                f"config directory {root} does not exist (from --config / {CONFIG_ENV})",
                hint="pass an existing directory, or create one with `pairctl init DIR`",
            )
        layers.append(Layer(CONFIG_ENV, root))
    up = find_upwards(cwd)
    if up is not None:
        layers.append(Layer("./" + CWD_DIR, up))
    if user_dir.is_dir():
        layers.append(Layer("user", Path(os.path.abspath(user_dir))))
    out: list[Layer] = []
    for layer in layers:
        trust.check_config_dir(layer.root, layer.origin)  # the path as given: its links are judged too
        layer = Layer(layer.origin, layer.root.resolve())
        if all(layer.root != o.root for o in out):
            out.append(layer)
    out.append(Layer("bundled", MANIFESTS.parent))
    return out


def user_config_dir() -> Path:
    return Path(platformdirs.user_config_dir("pairctl"))


def current_layers() -> list[Layer]:
    """The search path for this process (environment, working directory, user directory)."""
    return search_path(explicit=os.environ.get(CONFIG_ENV) or None, cwd=Path.cwd(), user_dir=user_config_dir())


def resolve(kind: str, name: str) -> Path:
    """The file NAME of KIND resolves to (first layer that has it); a ConfigError naming every
    place looked in when none does."""
    looked: list[Path] = []
    for layer in current_layers():
        p = manifest_path(name, layer.folder(kind))
        if p.is_file():
            if layer.origin != "bundled" and kind in SHOWN_OVERRIDES:
                _say_override(kind, name, p, layer.origin)
            return p
        looked.append(p.parent)
    known = sorted(names(kind))
    raise ConfigError(
        f"no {kind} named {name!r} (looked in {', '.join(str(p) for p in looked)})",
        hint=(
            f"known {kind} names: {', '.join(known)}"
            if known
            else f"add {KIND_DIRS[kind]}/{name}.yaml to your config repo"
        )
        + "; `pairctl config show` lists where each name resolves",
    )


# Kinds whose override changes what is built or which steps run: resolving one from a config
# directory is said on stderr once per process (`config show` lists every override).
SHOWN_OVERRIDES = frozenset({"target", "playbook"})
_said: set[tuple[str, str, Path]] = set()


def _say_override(kind: str, name: str, path: Path, origin: str) -> None:
    if (kind, name, path) in _said:
        return
    _said.add((kind, name, path))
    bundled = manifest_path(name, bundled_folder(kind))
    what = "overrides the bundled one" if bundled.is_file() else "not a bundled name"
    sys.stderr.write(f"pairctl: note: {kind} {name!r} comes from {path} (via {origin}; {what})\n")


def resolve_ref(kind: str, name_or_path: str | Path) -> Path:
    """How every loader finds the manifest a command names: a bare name (loader.is_manifest_name)
    is looked up on the search path, anything else is a file path."""
    return resolve(kind, str(name_or_path)) if is_manifest_name(name_or_path) else Path(name_or_path)


@dataclass(frozen=True)
class Resolution:
    kind: str
    name: str
    path: Path
    origin: str
    shadows: tuple[Path, ...]  # same name in later layers, overridden by `path`


def names(kind: str, layers: list[Layer] | None = None) -> dict[str, Resolution]:
    """Every name of KIND on the search path and where it resolves."""
    found: dict[str, list[tuple[Layer, Path]]] = {}
    for layer in layers if layers is not None else current_layers():
        folder = layer.folder(kind)
        if not folder.is_dir():
            continue
        for p in sorted(folder.glob("*.yaml")):
            found.setdefault(p.stem, []).append((layer, p))
    return {
        n: Resolution(kind, n, hits[0][1], hits[0][0].origin, tuple(p for _, p in hits[1:]))
        for n, hits in sorted(found.items())
    }
