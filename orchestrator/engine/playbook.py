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
from orchestrator.config.loader import load_model, read_yaml
from orchestrator.paths import PLAYBOOKS

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


def _bundled_steps() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """(action, host, on_failure) of each step of every playbook pairctl ships (playbooks/*.yaml in
    the package), by name, in order: the steps those commands need. A config repo may override
    a playbook (descriptions, extra steps), but never drop or reorder these, or soften what their
    failure means: a planted deploy.yaml without verify/accept, or with `on_failure: continue` on
    them, would mark an unverified pair active (issue 32). `preflight` first is also what lets
    deploy refuse before any lease. Read from the shipped files, so nothing repeats them."""
    found = {}
    for path in sorted(PLAYBOOKS.glob("*.yaml")):
        steps = read_yaml(path)["steps"]
        found[path.stem] = tuple((s["action"], s["host"], s.get("on_failure", "abort")) for s in steps)
    return found


REQUIRED_STEPS = _bundled_steps()


def missing_required(name: str, steps: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The required steps of playbook NAME that STEPS lacks, in the required order (a step
    counts when its action, host and on_failure match and it comes after the previous one)."""
    need = list(REQUIRED_STEPS.get(name, ()))
    for s in steps:
        if need and s == need[0]:
            need.pop(0)
    return need


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
        missing = missing_required(self.name, [(s.action, s.host, s.on_failure) for s in self.steps])
        if missing:
            act, host, fail = missing[0]
            raise ValueError(
                f"playbook {self.name!r} lacks the step action: {act} (host: {host}, on_failure: {fail}) "
                f"in its place; pairctl {self.name} needs every step of the bundled playbooks/{self.name}.yaml "
                "in order (missing: " + ", ".join(m[0] for m in missing) + ")"
            )
        return self


def load_playbook(name_or_path: str) -> Playbook:
    """The playbook a command runs; a file found under a command's name must call itself that
    (a `playbooks/deploy.yaml` named `x` would escape the required steps of `deploy`)."""
    path = search.resolve_ref("playbook", name_or_path)
    pb = load_model(Playbook, path)
    if name_or_path in REQUIRED_STEPS and pb.name != name_or_path:
        from orchestrator.errors import ConfigError

        raise ConfigError(
            f"{path}: field 'name': is {pb.name!r} but pairctl loads this file as the {name_or_path!r} playbook; "
            f"name it {name_or_path!r}"
        )
    return pb
