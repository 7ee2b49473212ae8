"""The actions playbooks name, one class each (engine/actions/base.py), grouped by what they touch:
host.py (checks, reads, leases, files put before a change), services.py (what runs), route.py
(the route record). ACTIONS, built from the classes, is
the one registry: the playbook loader validates each step's action against it and the runner
executes from it, so no other table repeats an action's name."""

from __future__ import annotations

from orchestrator.config import search
from orchestrator.config.loader import load_model
from orchestrator.engine.actions import host, route, services
from orchestrator.engine.actions.base import Action
from orchestrator.engine.playbook import Playbook, required_steps
from orchestrator.errors import ConfigError

MODULES = (host, services, route)  # where every Action subclass is defined
ACTIONS: dict[str, Action] = {cls.name: cls() for cls in Action.__subclasses__()}


def load_playbook(name_or_path: str) -> Playbook:
    """The playbook a command runs, its actions checked against ACTIONS; a file found under a
    command's name must call itself that, or it would escape that command's required steps."""
    required = required_steps()  # refuses first when the bundled playbooks cannot be read
    path = search.resolve_ref("playbook", name_or_path)
    pb = load_model(Playbook, path, context={"actions": ACTIONS})
    if name_or_path in required and pb.name != name_or_path:
        raise ConfigError(
            f"{path}: field 'name': is {pb.name!r} but pairctl loads this file as the {name_or_path!r} playbook; "
            f"name it {name_or_path!r}"
        )
    return pb
