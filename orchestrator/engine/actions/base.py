"""What every playbook action is: a class named by the playbooks (`class Stop(Action, name="stop",
changes=True)`), whose `execute` runs what its plan step carries for one host and decides none of
it. The registry (engine/actions/__init__.py) is built from these classes, so an action's name and
whether it changes what runs are said once, on its class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from orchestrator.engine.context import RunEnv
    from orchestrator.engine.plan import Step


class Action:
    name: ClassVar[str]
    changes: ClassVar[bool]  # it changes what runs on a host: a later failure must not be `abort`
    local: ClassVar[bool]  # it runs here, never on a host: a playbook step naming it says `host: local`
    # the one playbook that may name it (None: any): an action that writes what only its command
    # decides (route-repair's signed record and relinks) must not run from an operator's own deploy
    only_in: ClassVar[str | None]

    def __init_subclass__(
        cls, *, name: str, changes: bool = False, local: bool = False, only_in: str | None = None
    ) -> None:
        cls.name, cls.changes, cls.local, cls.only_in = name, changes, local, only_in

    def execute(self, ctx: RunEnv, role: Any, step: Step) -> dict[str, Any]:
        """Run the step on ROLE's host (None: a local step); the receipt records what it returns."""
        raise NotImplementedError

    def __call__(self, ctx: RunEnv, role: Any, step: Step) -> dict[str, Any]:
        return self.execute(ctx, role, step)
