"""Playbooks: the ordered steps a command runs, as YAML a user can read (playbooks/*.yaml).

Each step names the host role it runs on (native, rpc, both, local), an action the engine
knows, and what a failure means (`rollback`, `abort`, `continue`). Validation makes the
safety rule structural: once a step that changes what runs (stop, switch, start, route) has
come, a later failure may not be `abort` (which would leave a half-activated pair) — it must
be `rollback`, `stop` (inside a rollback: leave the hosts stopped, keep the leases) or
`continue` (steps that cannot hurt, like releasing leases).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.loader import load_model

# Every action the engine implements, and whether it changes what runs on a host.
ACTIONS: dict[str, bool] = {
    "preflight": False,  # local: packages exist and verify, one revision, profile flags in --help
    "connect": False,  # open one connection per host; strict host keys
    "facts": False,  # read links, releases, pid files, route record (SFTP, read-only)
    "lease": False,  # take this host's lease (atomic mkdir on the host)
    "prepare": False,  # create the layout, install pairctl-svc (SFTP)
    "upload": False,  # send + verify the release (only verified when present)
    "kernel-check": False,  # kernel validation cases of the packages being deployed (deploy --kernel-check)
    "secret": False,  # API key file to secrets/, 0600 (SFTP, never argv)
    "stop": True,  # stop this host's service
    "restart-rpc": True,  # rpc host, one exec: stop, switch links, start, wait for the port, identity
    "switch": True,  # current/previous symlinks by rename (SFTP)
    "start-server": True,  # llama-server: start, identity, /health 200
    "verify": False,  # identity: exe sha256, argv, /props build_info, /slots, rpc bind, alive
    "route": True,  # route record by compare-and-swap, read back byte-identical
    "route-accepted": True,  # the same record, state activating -> active, once acceptance passed
    "route-repair": False,  # pairctl repair: the rebuilt route record by compare-and-swap (nothing runs changes)
    "accept": False,  # acceptance checks (orchestrator.checks.suite) or identity only
    "release-lease": False,  # release this host's lease, verify inactive
}
CHANGES = {a for a, c in ACTIONS.items() if c}


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

    @model_validator(mode="after")
    def _check(self) -> PlaybookStep:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r} (known: {', '.join(sorted(ACTIONS))})")
        if self.action in ("preflight", "accept") and self.host != "local":
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
            if changed and s.on_failure == "abort":
                raise ValueError(
                    f"step {s.name!r} has on_failure: abort after {changed!r} changed what runs; "
                    "use rollback, stop, or continue for steps that cannot hurt"
                )
            if s.action in CHANGES and changed is None:
                changed = s.name
        return self


def load_playbook(name_or_path: str) -> Playbook:
    return load_model(Playbook, search.resolve_ref("playbook", name_or_path))
