"""The one engine: runs planned steps in order, one journal step per playbook step, and on a
failure does what the step says (rollback / abort / stop / continue). Steps on `both` hosts run on
the two at once and collect each host's result or error, like fabric's GroupResult.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import faults, interrupt, progress
from orchestrator.engine.plan import Step
from orchestrator.errors import Interrupted, PairctlError

if TYPE_CHECKING:
    from orchestrator.engine.context import RunEnv
    from orchestrator.evidence.journal import Journal

# (run environment, role: native | rpc | None, the planned step): an executor runs what its step
# carries for its host and decides none of it, so what runs is what the plan printed
Handler = Callable[["RunEnv", Any, Step], dict[str, Any] | None]


class StepFailed(Exception):
    """A planned step failed; carries the step and the per-host errors (CAUSE: one error that says
    every host's, else the first)."""

    def __init__(self, step: Step, errors: dict[str, BaseException], cause: BaseException | None = None):
        self.step = step
        self.errors = errors
        self.cause = cause if cause is not None else next(iter(errors.values()))
        where = ", ".join(errors)
        super().__init__(f"step {step.name} failed on {where}: {self.cause}")

    @property
    def message(self) -> str:
        parts = []
        for host, exc in self.errors.items():
            text = str(exc)
            parts.append(text if text.startswith(f"{host}:") else f"{host}: {text}")
        return f"step '{self.step.name}' failed — " + "; ".join(parts)


@dataclass
class StepOutcome:
    step: Step
    ok: bool
    seconds: float
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def run_steps(
    steps: list[Step],
    ctx: RunEnv,
    handlers: Mapping[str, Handler],
    *,
    journal: Journal,
    on_step: Callable[[StepOutcome], None] | None = None,
) -> list[StepOutcome]:
    """Run `steps`; raise StepFailed at the first step that fails unless it says `continue`."""
    outcomes = []
    for step in steps:
        faults.at_step(step.name)  # test-only, inert unless PAIRCTL_ENABLE_FAULT_HOOKS=1 (orchestrator/faults.py)
        t0 = time.monotonic()
        host_label = ",".join(step.hosts)
        _stop_if_interrupted(step, ctx, journal, host_label)
        progress.event("step.start", f"step {step.name} on {host_label or '-'} ...", step=step.name, hosts=host_label)
        data: dict[str, Any] = {}
        errors: dict[str, BaseException] = {}
        was_changed = ctx.recorder.changed
        if step.changes:
            ctx.recorder.set_changed(True)  # from here a failure (even of this step) means the pair may be half-changed
        try:
            with journal.step(step.name, host=host_label) as js:
                js.data["action"] = step.action
                js.data["planned"] = step.to_dict()  # the step as given, in --dry-run's form (plan.Step.to_dict)
                data, errors = _execute(step, ctx, handlers)
                js.data.update(_plain(data))
                if errors:
                    js.data["errors"] = {h: str(e) for h, e in errors.items()}
                    raise _GroupError(step, errors)
        except _GroupError:
            pass
        except Exception as exc:  # raised outside a handler (should not happen): treat as the step's failure
            errors = {host_label: exc}
        out = StepOutcome(
            step,
            not errors,
            time.monotonic() - t0,
            data,
            "; ".join(str(e) if str(e).startswith(f"{h}:") else f"{h}: {e}" for h, e in errors.items()) or None,
        )
        outcomes.append(out)
        first = (out.error or "").splitlines()[0] if out.error else ""
        progress.event(
            "step.end",
            f"step {step.name:<14} {'ok' if out.ok else 'FAILED':<6} {host_label or '-':<24} {out.seconds:6.2f} s"
            + (f"  {first}" if first else ""),
            step=step.name,
            ok=out.ok,
            seconds=round(out.seconds, 3),
        )
        if on_step:
            on_step(out)
        if errors:
            if all(getattr(e, "nothing_changed", False) for e in errors.values()):
                ctx.recorder.set_changed(was_changed)  # e.g. a release check that refused before stopping anything
            if step.on_failure == "continue":
                continue
            raise StepFailed(step, errors)
    return outcomes


def _stop_if_interrupted(step: Step, ctx: RunEnv, journal: Journal, host_label: str) -> None:
    """A signal stops the run before its next step, as that step's failure; never a lease release
    nor a rollback's steps once it changed something: those are the cleanup."""
    if step.action == "release-lease" or ("restore" in step.may and ctx.recorder.changed):
        return
    try:
        interrupt.check(f"before step {step.name}")
    except Interrupted as exc:
        journal.record_step(step.name, "skipped", host=host_label or None, skip_reason=f"not run: {exc}")
        raise StepFailed(step, {host_label or "local": exc}) from None


class _GroupError(Exception):
    def __init__(self, step: Step, errors: dict[str, BaseException]):
        self.errors = errors
        super().__init__("; ".join(f"{h}: {type(e).__name__}: {e}" for h, e in errors.items()))


def _execute(
    step: Step, ctx: RunEnv, handlers: Mapping[str, Handler]
) -> tuple[dict[str, Any], dict[str, BaseException]]:
    fn = handlers[step.action]
    roles: tuple[str | None, ...]
    if step.role == "both":
        roles = ("native", "rpc")
    elif step.role in ("native", "rpc"):
        roles = (step.role,)
    else:
        roles = (None,)
    data: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}
    if len(roles) == 1:
        r = roles[0]
        host = step.hosts[0]
        try:
            data[host] = fn(ctx, r, step) or {}
        except Exception as exc:
            errors[host] = exc
        if r is None:
            data = data.get(host, {})
        return data, errors
    with ThreadPoolExecutor(max_workers=len(roles), thread_name_prefix=f"step-{step.name}") as pool:
        futs = {host: pool.submit(fn, ctx, r, step) for host, r in zip(step.hosts, roles, strict=True)}
        for host, fut in futs.items():
            try:
                data[host] = fut.result() or {}
            except Exception as exc:
                errors[host] = exc
    return data, errors


def _plain(d: Any) -> Any:
    if isinstance(d, dict):
        return {str(k): _plain(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_plain(v) for v in d]
    if isinstance(d, (str, int, float, bool)) or d is None:
        return d
    return str(d)


def error_of(exc: BaseException) -> PairctlError | None:
    """The PairctlError behind a step failure, if any (to keep its exit code)."""
    if isinstance(exc, StepFailed):
        exc = exc.cause
    return exc if isinstance(exc, PairctlError) else None
