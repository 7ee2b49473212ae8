"""Load YAML into a pydantic model; every error names the file, the field and the reason."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def format_validation_error(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid ({err.error_count()} problem{'s' if err.error_count() != 1 else ''})"]
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not part of this file's schema)"
        lines.append(f"  {source}: field '{loc}': {msg}")
    return "\n".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (plain YAML keeps the last one
    silently, so a reviewer reading the first `server_bind:` sees the wrong value)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {key!r}", key_node.start_mark) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                f"while reading the mapping (first {key!r} at line {first.start_mark.line + 1})", node.start_mark,
                f"duplicate key {key!r}", key_node.start_mark)
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return load_yaml_text(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    except Exception as exc:  # yaml can raise odd errors on hostile input
        raise ConfigError(f"{path}: not valid YAML: {type(exc).__name__}") from None


def validate(model: type[M], data: Any, *, source: str, context: dict[str, Any] | None = None) -> M:
    if data is None:
        raise ConfigError(f"{source}: file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err)) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None


def manifest_path(name_or_path: str | Path, folder: Path) -> Path:
    """Where a manifest named on the command line is: a bare name (no suffix) is
    `folder/<name>.yaml`, anything else is a path. The one rule for profiles, targets,
    inventories, playbooks, fixture sets and plans."""
    p = Path(name_or_path)
    return folder / f"{name_or_path}.yaml" if not p.suffix else p


def load_model(model: type[M], path: Path | str, *, context: dict[str, Any] | None = None) -> M:
    path = Path(path)
    return validate(model, read_yaml(path), source=str(path), context=context)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: str, variables: dict[str, str] | None = None) -> str:
    """Expand `${VAR}` (from `variables`, then the environment) and a leading `~`.

    Inventories use `${PAIRCTL_HOME}` so the lab's paths follow the state directory.
    An unknown variable is an error, never an empty string.
    """
    env = {**os.environ, **(variables or {})}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in env:
            raise ConfigError(f"unknown variable ${{{name}}} in {value!r}")
        return env[name]

    return os.path.expanduser(_VAR.sub(sub, value))
