"""Playbooks: the ordered steps a command runs, as YAML a user can read (playbooks/*.yaml).

Each step names a host role, an action and what a failure means. Once a step that changes what runs
has come, a later failure may not be `abort` (a half-activated pair): it must be `rollback`, `stop`
or `continue`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from orchestrator.config.base import StrictModel
from orchestrator.config.loader import read_yaml
from orchestrator.errors import ConfigError
from orchestrator.paths import PLAYBOOKS


@functools.cache
def required_steps(folder: Path = PLAYBOOKS) -> dict[str, tuple[tuple[str, str, str], ...]]:
    """(action, host, on_failure) of each step of every playbook pairctl ships, by name, in order: a
    config repo's playbook may add steps, never drop, reorder or soften these. None shipped refuses."""
    found = {}
    paths = sorted(folder.glob("*.yaml"))
    if not paths:
        raise ConfigError(
            f"{folder}: no bundled playbooks (*.yaml) to read the steps each command needs from; nothing was run",
            hint="reinstall pairctl: its package ships playbooks/*.yaml",
        )
    for path in paths:
        steps = read_yaml(path)["steps"]
        found[path.stem] = tuple((s["action"], s["host"], s.get("on_failure", "abort")) for s in steps)
    return found


def missing_required(name: str, steps: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The required steps of playbook NAME that STEPS lacks, in the required order (a step
    counts when its action, host and on_failure match and it comes after the previous one)."""
    need = list(required_steps().get(name, ()))
    for s in steps:
        if need and s == need[0]:
            need.pop(0)
    return need


class ActionKind(Protocol):
    """What a step's action (an engine/actions class) says of itself, as the playbook and the plan
    read it; typed here, below the actions, so neither imports them."""

    name: ClassVar[str]
    changes: ClassVar[bool]
    local: ClassVar[bool]
    writes_route: ClassVar[bool]
    uses_pair: ClassVar[bool]
    uses_key: ClassVar[bool]
    only_in: ClassVar[str | None]

    def describe(self, p: Any) -> tuple[str, Mapping[str, Any]]: ...  # p: plan.Planning; per host: plan.Exec


class PlaybookStep(StrictModel):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    host: Literal["native", "rpc", "both", "local"]
    action: str
    on_failure: Literal["rollback", "abort", "stop", "continue"] = Field(
        default="abort",
        description="rollback: restore the previous pair; abort: release leases and stop the run (only before "
        "anything changed); stop: stop both services, keep the leases (a rollback that fails); continue: record, go on",
    )
    when: Literal["always", "manual"] = Field(
        default="always",
        description="manual: only when the playbook runs on its own, not inside another run's rollback",
    )
    description: str = ""

    _kind: ActionKind = PrivateAttr()

    @property
    def kind(self) -> ActionKind:
        """Its action's class (engine/actions): what the step changes, writes, uses and says."""
        return self._kind

    @property
    def changes(self) -> bool:
        return self._kind.changes

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> PlaybookStep:
        actions = (info.context or {}).get("actions")
        if actions is None:  # fail closed: no step is valid without the registry that runs it
            raise ValueError("no action registry to check against: load playbooks with engine.actions.load_playbook")
        if self.action not in actions:
            raise ValueError(f"unknown action {self.action!r} (known: {', '.join(sorted(actions))})")
        self._kind = actions[self.action]
        if actions[self.action].local and self.host != "local":
            raise ValueError(f"action {self.action} runs on host: local")
        return self


class Playbook(StrictModel):
    name: str
    description: str = ""
    steps: list[PlaybookStep] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Playbook:
        names = [s.name for s in self.steps]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"step names repeat: {', '.join(sorted(dup))}")
        changed = None
        for s in self.steps:
            if s.kind.only_in not in (None, self.name):
                raise ValueError(
                    f"step {s.name!r}: action {s.action!r} runs only in the {s.kind.only_in!r} playbook "
                    f"(`pairctl {s.kind.only_in}` decides what it writes); remove the step from playbook {self.name!r}"
                )
            if changed and s.on_failure == "abort":
                raise ValueError(
                    f"step {s.name!r} has on_failure: abort after {changed!r} changed what runs; "
                    "use rollback, stop, or continue for steps that cannot hurt"
                )
            if s.changes and changed is None:
                changed = s.name
        missing = missing_required(self.name, [(s.action, s.host, s.on_failure) for s in self.steps])
        if missing:
            act, host, fail = missing[0]
            raise ValueError(
                f"playbook {self.name!r} lacks the step action: {act} (host: {host}, on_failure: {fail}) "
                f"in its place; pairctl {self.name} needs every step of the bundled playbooks/{self.name}.yaml "
                "in order (missing: " + ", ".join(m[0] for m in missing) + ")"
            )
        return self
