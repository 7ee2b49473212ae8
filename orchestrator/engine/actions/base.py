"""What every playbook action is: a class named by the playbooks (`class Stop(Action, name="stop",
changes=True)`) whose `execute` runs what its plan step carries for one host and decides none of it;
its name and whether it changes what runs are said once, on its class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from orchestrator.engine.context import RunEnv
    from orchestrator.engine.plan import Exec, Planning, Step


class Action:
    name: ClassVar[str]
    changes: ClassVar[bool]  # it changes what runs on a host: a later failure must not be `abort`
    local: ClassVar[bool]  # it runs here, never on a host: a playbook step naming it says `host: local`
    writes_route: ClassVar[bool]  # it writes route.json: its plan step carries the record (plan.RouteWrite)
    uses_pair: ClassVar[bool]  # it runs on the pair the plan starts: the dry run shows that pair
    uses_key: ClassVar[bool]  # it puts or uses the API key: the dry run shows whether one is set
    # the one playbook that may name it (None: any): an action that writes what only its command
    # decides (route-repair's signed record and relinks) must not run from an operator's own deploy
    only_in: ClassVar[str | None]

    def __init_subclass__(
        cls, *, name: str, changes: bool = False, local: bool = False, writes_route: bool = False,
        uses_pair: bool = False, uses_key: bool = False, only_in: str | None = None,
    ) -> None:  # fmt: skip
        cls.name, cls.changes, cls.local, cls.only_in = name, changes, local, only_in
        cls.writes_route, cls.uses_pair, cls.uses_key = writes_route, uses_pair, uses_key

    def describe(self, p: Planning) -> tuple[str, dict[str, Exec]]:
        """A sentence for people plus the command that will run on each host where one says it all
        (empty: the playbook step's own description)."""
        return "", {}

    def execute(self, ctx: RunEnv, role: Any, step: Step) -> dict[str, Any]:
        """Run the step on ROLE's host (None: a local step); the receipt records what it returns."""
        raise NotImplementedError

    def __call__(self, ctx: RunEnv, role: Any, step: Step) -> dict[str, Any]:
        return self.execute(ctx, role, step)
