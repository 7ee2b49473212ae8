"""Load YAML into a pydantic model; every error names the file, the field and the reason."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
# Inventories, profiles, targets and plans are a few KB; a fixture list of thousands of entries is
# under 1 MB. A file beyond this is not a manifest (a log, a model, /dev/zero through a link).
MAX_CONFIG_BYTES = 16 << 20


def problem_lines(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """One line per problem: file, field, what is wrong and (where known) the fix. pydantic's own
    "Value error, " prefix is dropped: the message is the validator's sentence."""
    out = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not part of this file's schema)"
            near = _nearest_field(model, e["loc"]) if model is not None else None
            msg += f"; did you mean '{near}'?" if near else "; remove it"
        elif e["type"] == "missing":
            loc_parts = [str(p) for p in e["loc"]]
            msg = f"required field missing; add '{loc_parts[-1]}'" if loc_parts else "required field missing"
        elif e["type"] in ("value_error", "assertion_error"):
            msg = msg.split(", ", 1)[1] if ", " in msg else msg
        out.append(f"{source}: field '{loc}': {msg}")
    return out


def _nearest_field(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The known key closest in spelling to an unknown one, at the same level (models only)."""
    current: Any = model
    for part in loc[:-1]:
        current = _inner(current, part)
        if current is None:
            return None
    fields = getattr(current, "model_fields", None)
    if not fields:
        return None
    close = difflib.get_close_matches(str(loc[-1]), [f.alias or n for n, f in fields.items()], n=1, cutoff=0.6)
    return close[0] if close else None


def _inner(tp: Any, part: Any) -> Any:
    """The type one step of a validation error's location leads to (a field of a model, the
    value type of a dict or list), looking through Optional; None when it cannot tell."""
    for cand in (tp, *[a for a in getattr(tp, "__args__", ()) if a is not type(None)]):
        fields = getattr(cand, "model_fields", None)
        if fields is not None:
            if isinstance(part, str) and part in fields:
                return fields[part].annotation
            continue
        origin = getattr(cand, "__origin__", None)
        args: tuple[Any, ...] = getattr(cand, "__args__", ())
        if origin is dict and len(args) == 2:
            return args[1]
        if origin is list and args:
            return args[0]
    return None


def format_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> str:
    lines = [f"{source}: invalid ({err.error_count()} problem{'s' if err.error_count() != 1 else ''})"]
    lines += ["  " + line for line in problem_lines(source, err, model)]
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
                None, None, f"unhashable key {key!r}", key_node.start_mark
            ) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                f"while reading the mapping (first {key!r} at line {first.start_mark.line + 1})",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path) -> Any:
    """The YAML of one manifest file; a file (or a directory on the way to it) that another user
    could have written is refused before it is read (config.trust)."""
    from orchestrator.config import trust  # trust -> errors only; imported here to keep loader's imports flat

    if Path(path).exists():
        trust.check_config_file(Path(path))
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES} bytes, larger than any manifest pairctl reads")
        text = raw.decode("utf-8")
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
        raise ConfigError(format_validation_error(source, err, model)) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None


def validation_problems(
    model: type[BaseModel], data: Any, *, source: str, context: dict[str, Any] | None = None
) -> tuple[list[str], bool]:
    """Every problem of DATA against MODEL as lines (empty: valid), and whether the fields
    themselves validated (pydantic runs a model's cross-field checks only once they do)."""
    if data is None:
        return [f"{source}: file is empty"], False
    if not isinstance(data, dict):
        return [f"{source}: expected a mapping at the top level, found {type(data).__name__}"], False
    try:
        model.model_validate(data, context=context)
    except ValidationError as err:
        return problem_lines(source, err, model), all(not e["loc"] for e in err.errors(include_url=False))
    except RecursionError:
        return [f"{source}: nested too deeply"], False
    return [], True


def is_manifest_name(name_or_path: str | Path) -> bool:
    """The one name-or-path rule for every manifest a command names: a bare name has no suffix,
    anything else is a path. config.search looks names up on the config search path."""
    return not Path(name_or_path).suffix


def manifest_path(name_or_path: str | Path, folder: Path) -> Path:
    """Where a manifest reference points within one folder: a bare name is `folder/<name>.yaml`,
    a path is itself (config.search applies this to each layer of the search path)."""
    return folder / f"{name_or_path}.yaml" if is_manifest_name(name_or_path) else Path(name_or_path)


def load_model(model: type[M], path: Path | str, *, context: dict[str, Any] | None = None) -> M:
    path = Path(path)
    return validate(model, read_yaml(path), source=str(path), context=context)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: str, variables: dict[str, str] | None = None) -> str:
    """Expand `${VAR}` (from `variables`, then the environment) and a leading `~`; an unknown
    variable is an error, never an empty string."""
    env = {**os.environ, **(variables or {})}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in env:
            raise ConfigError(f"unknown variable ${{{name}}} in {value!r}")
        return env[name]

    return os.path.expanduser(_VAR.sub(sub, value))
