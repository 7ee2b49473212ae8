"""Rollouts: one revision (or a rollback) across many pairs, canary first, in waves, stopping on failure.

Like Ansible's `serial`/`max_fail_percentage` and Argo's canary: every pair is a plain per-pair
deploy (or rollback) with its own leases and receipt. This module decides the order, which pairs
need nothing (a re-run continues where the last stopped) and when to stop starting pairs, and
writes the fleet run's receipt naming each pair's receipt and the plan it followed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator import interrupt, progress
from orchestrator.config.inventory import HookEvent, Inventory
from orchestrator.engine.context import RunOptions
from orchestrator.engine.deploy import RunResult
from orchestrator.engine.deploy import deploy as deploy_pair
from orchestrator.engine.deploy import rollback as rollback_pair
from orchestrator.engine.status import status as pair_status
from orchestrator.errors import ConfigError, ExitCode, PairctlError
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hashing import sha256_json
from orchestrator.ops.fleet import fan_out
from orchestrator.ops.hooks import check_veto, event_document, run_hooks
from orchestrator.ops.revision import PairPackages
from orchestrator.paths import Home

# A pair's result in a fleet run.
PASSED = "passed"  # deployed (or rolled back) and verified / accepted
SKIPPED = "skipped"  # already on the revision and accepted: nothing to do
ROLLED_BACK = "rolled-back"  # exit 7: failed after activation, previous pair restored and verified
ROLLBACK_FAILED = "rollback-failed"  # exit 8
LEASED = "leased"  # exit 5: held by someone else, skipped (nothing changed)
REFUSED = "refused"  # any other failure before a change (host unreachable, damaged route record ...)
NOT_STARTED = "not-started"  # --max-fail reached or the canary failed
PAUSED = "paused"  # --waves N ran its N waves (Argo's pause): the same command again continues

FAILURES = frozenset({ROLLED_BACK, ROLLBACK_FAILED, REFUSED})
_EVENT_OF: dict[str, HookEvent] = {
    PASSED: "deploy.passed",
    ROLLED_BACK: "deploy.rolled_back",
    ROLLBACK_FAILED: "deploy.rollback_failed",
}
_OUTCOME_OF_EXIT = {
    int(ExitCode.ROLLED_BACK): ROLLED_BACK,
    int(ExitCode.ROLLBACK_FAILED): ROLLBACK_FAILED,
    int(ExitCode.LEASED): LEASED,
}


@dataclass(frozen=True)
class RolloutOptions:
    canary: str | None = None
    serial: int = 1
    max_fail: int = 1
    pause_s: float = 0.0
    waves: int = 0  # run at most this many waves, then pause (0: every wave)
    skip_accept: bool = False
    checks: tuple[str, ...] = ()
    kernel_check: bool = False


@dataclass
class PairRun:
    pair: str
    wave: int | None
    outcome: str  # planned: "deploy" | "rollback" | SKIPPED; then one of the results above
    packages: list[str] | None = None
    profile: str | None = None
    reason: str | None = None
    receipt: str | None = None
    exit_code: int = 0
    error: str | None = None
    wall_s: float = 0.0
    hooks: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "wall_s": round(self.wall_s, 3)}


@dataclass
class RolloutResult:
    command: str  # deploy | rollback
    rev: str | None
    commit: str | None
    options: RolloutOptions
    waves: list[list[str]]
    pairs: list[PairRun]
    dry_run: bool = False
    receipt: str | None = None
    wall_s: float = 0.0
    hooks: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)  # status_s (the skip reads), waves_s

    def exit_code(self) -> int:
        return fleet_exit_code([p.outcome for p in self.pairs], [p.exit_code for p in self.pairs])

    def paused(self) -> bool:
        """`--waves N` stopped it with waves left (Argo's pause): said as such in the output, the
        receipt's reason and the hook event, since `passed` and `fleet.finished` would read as done."""
        return any(p.outcome == PAUSED for p in self.pairs)

    def waves_run(self) -> int:
        return len(self.timings.get("waves_s", []))

    def plan_dict(self) -> dict[str, Any]:
        o = self.options
        return {
            "rev": self.rev,
            "commit": self.commit,
            **{k: getattr(o, k) for k in ("canary", "serial", "max_fail", "pause_s")},
            "waves_max": o.waves,
            "waves": self.waves,
            "skipped": {p.pair: p.reason for p in self.pairs if p.wave is None},
            "packages": {p.pair: p.packages for p in self.pairs if p.packages},
        }

    def as_dict(self) -> dict[str, Any]:
        code = self.exit_code()
        return {
            "command": self.command,
            "fleet": True,
            "dry_run": self.dry_run,
            "rev": self.rev,
            "commit": self.commit,
            "plan": self.plan_dict(),
            "pairs": [p.as_dict() for p in self.pairs],
            "outcome": "dry-run" if self.dry_run else ("failed" if code else "paused" if self.paused() else "passed"),
            "exit_code": 0 if self.dry_run else code,
            "receipt": self.receipt,
            "hooks": self.hooks,
            "timings": self.timings,
            "wall_s": round(self.wall_s, 3),
        }


# -- pure planning ---------------------------------------------------------------------------------


def plan_waves(pairs: list[str], canary: str | None, serial: int) -> list[list[str]]:
    """The canary alone first, then the other pairs in the order given, `serial` per wave."""
    if serial < 1:
        raise ConfigError("--serial must be at least 1")
    if canary is not None and canary not in pairs:
        raise ConfigError(f"--canary {canary}: not one of the pairs of this rollout ({', '.join(pairs)})")
    rest = [p for p in pairs if p != canary]
    waves = [[canary]] if canary is not None else []
    waves += [rest[i : i + serial] for i in range(0, len(rest), serial)]
    return waves


def fleet_exit_code(outcomes: list[str], codes: list[int]) -> int:
    """8 if any rollback failed; else 7 if any pair rolled back; else the code of other failures
    (their own when they agree, else 1); else 5 if any pair was skipped because leased; else 0."""
    if ROLLBACK_FAILED in outcomes:
        return int(ExitCode.ROLLBACK_FAILED)
    if ROLLED_BACK in outcomes:
        return int(ExitCode.ROLLED_BACK)
    other = {c for o, c in zip(outcomes, codes, strict=True) if o == REFUSED}
    if other:
        return other.pop() if len(other) == 1 else int(ExitCode.FAILURE)
    if LEASED in outcomes:
        return int(ExitCode.LEASED)
    return int(ExitCode.OK)


def on_revision(st: dict[str, Any], pp: PairPackages, *, accepts_fully: bool = True) -> str | None:
    """Why a pair needs no deploy (None: it does): REV's packages active with the same profile,
    healthy, no problem, and as far along as this rollout would take it: accepted for one running
    the whole suite, else accepted or identity-verified."""
    route = st.get("route") or {}
    if route.get("active_packages") != [pp.native, pp.rpc]:
        return None
    enough = {"active"} if accepts_fully else {"active", "identity-verified"}
    state = route.get("state")
    if state not in enough or not str(route.get("active") or "").endswith(f"({pp.profile_name})"):
        return None
    if st.get("problems") or st.get("health") != "ok":
        return None
    how = "accepted" if state == "active" else "identity-verified"
    return f"already on {pp.native} + {pp.rpc} ({pp.profile_name}), {how} (route revision {route.get('revision')})"


# -- running -------------------------------------------------------------------------------------


def rollout(
    home: Home,
    inventory: Inventory,
    pairs: list[str],
    *,
    command: str,
    packages: dict[str, PairPackages] | None,
    rev: str | None,
    commit: str | None,
    options: RolloutOptions,
    argv: list[str],
    dry_run: bool = False,
    say: Callable[[str], None] | None = None,
) -> RolloutResult:
    """Deploy `packages` (command "deploy") or roll back (command "rollback") on `pairs`."""
    t0 = time.monotonic()
    say = say or (lambda _: None)
    waves_all = plan_waves(pairs, options.canary, options.serial)
    runs = {p: PairRun(p, None, command) for p in pairs}
    if packages is not None:
        for p, pp in packages.items():
            runs[p].packages, runs[p].profile = list(pp.ids), pp.profile
    full = RunOptions(skip_accept=options.skip_accept, checks=options.checks).accepts_fully
    _mark_skips(home, inventory, pairs, packages, runs, full)
    t_status = time.monotonic() - t0
    waves = [[p for p in w if runs[p].outcome != SKIPPED] for w in waves_all]
    waves = [w for w in waves if w]
    for i, w in enumerate(waves):
        for p in w:
            runs[p].wave = i
    result = RolloutResult(command, rev, commit, options, waves, [runs[p] for p in pairs], dry_run=dry_run)
    result.timings = {"status_s": round(t_status, 3), "waves_s": []}
    if dry_run:
        result.wall_s = time.monotonic() - t0
        return result

    inputs = {"plan": sha256_json(result.plan_dict()), "inventory": sha256_json(inventory.model_dump(mode="json"))}
    journal = EvidenceStore(home.evidence).begin(f"fleet {command}", argv=argv, pair=None, inputs=inputs)
    journal.set("plan", result.plan_dict())
    try:
        _run_waves(home, inventory, result, runs, argv, say)
    except BaseException as exc:
        journal.set("pairs", [r.as_dict() for r in result.pairs])
        journal.finish("aborted" if not isinstance(exc, Exception) else "failed", str(exc) or type(exc).__name__)
        raise
    journal.set("pairs", [r.as_dict() for r in result.pairs])
    journal.set("timings", result.timings)
    code = result.exit_code()
    summary = _summary(result)
    if result.paused():
        summary = f"paused after wave {result.waves_run()} of {len(result.waves)}; {summary}"
    journal.set("exit_code", code)
    result.receipt = journal.finish("passed" if code == 0 else "failed", summary)
    result.wall_s = time.monotonic() - t0
    doc = event_document(
        "fleet.paused" if result.paused() else "fleet.finished",
        f"pairctl fleet {command}{' ' + rev if rev else ''}: {summary}",
        command=command,
        rev=rev,
        commit=commit,
        exit_code=code,
        receipt=result.receipt,
        pairs={r.pair: {"outcome": r.outcome, "receipt": r.receipt} for r in result.pairs},
    )
    result.hooks = run_hooks(home, inventory, doc)
    return result


def _mark_skips(
    home: Home,
    inventory: Inventory,
    pairs: list[str],
    packages: dict[str, PairPackages] | None,
    runs: dict[str, PairRun],
    accepts_fully: bool = True,
) -> None:
    """Mark the pairs with nothing to do, from their status (read in parallel): for a deploy those
    on REV; for a rollback those last written by a passed rollback (again would undo it)."""
    got = fan_out(pairs, lambda p: pair_status(home, inventory, p), parallel=min(4, len(pairs)))
    rolled = _rollback_runs(home) if packages is None else {}
    for out in got.outcomes:
        run = runs[out.pair]
        if out.value is None:
            run.reason = f"status unreadable ({(out.error or '').splitlines()[0][:160]}): trying anyway"
            continue
        if packages is not None:
            why = on_revision(out.value, packages[out.pair], accepts_fully=accepts_fully)
        else:
            by = (out.value.get("route") or {}).get("updated_by")
            why = f"already rolled back by rollback run {by} (receipt {rolled[by][:12]})" if by in rolled else None
        if why is not None:
            run.outcome, run.reason = SKIPPED, why


def _rollback_runs(home: Home) -> dict[str, str]:
    """run id -> receipt hash of every passed `rollback` run in this home's chains."""
    out: dict[str, str] = {}
    for summ in EvidenceStore(home.evidence).summaries():
        if summ.get("command") == "rollback" and summ.get("outcome") == "passed" and summ.get("in_chain"):
            out[str(summ.get("run_id"))] = str(summ.get("hash"))
    return out


def _run_waves(
    home: Home,
    inventory: Inventory,
    result: RolloutResult,
    runs: dict[str, PairRun],
    argv: list[str],
    say: Callable[[str], None],
) -> None:
    o = result.options
    failures = 0
    stop: str | None = None
    for i, wave in enumerate(result.waves):
        if stop is None and failures >= o.max_fail:
            stop = f"--max-fail {o.max_fail} reached ({failures} failed)"
        if stop is None and interrupt.received() is not None:
            stop = f"interrupted by {interrupt.received()}: no further wave starts"
        if stop is not None:
            for p in wave:
                runs[p].outcome, runs[p].reason = NOT_STARTED, stop
            continue
        if o.waves and i >= o.waves:  # an open-ended pause; the same command again is the promote
            for p in wave:
                runs[p].outcome = PAUSED
                runs[p].reason = (
                    f"paused after {o.waves} wave(s) (--waves {o.waves}): run the same command again to "
                    "continue (pairs already on it are skipped)"
                )
            continue
        if i > 0 and o.pause_s > 0:
            say(f"pausing {o.pause_s:g} s before wave {i + 1}")
            time.sleep(o.pause_s)
        say(f"wave {i + 1}/{len(result.waves)}: {', '.join(wave)}")
        t_wave = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(wave), thread_name_prefix="rollout") as pool:
            done = list(pool.map(lambda p: _labelled_one(home, inventory, result, runs[p], argv), wave))
        result.timings["waves_s"].append(round(time.monotonic() - t_wave, 3))
        for r in done:
            say(f"  {r.pair}: {r.outcome}{' (' + r.error.splitlines()[0][:160] + ')' if r.error else ''}")
        failures += sum(1 for r in done if r.outcome in FAILURES)
        if o.canary is not None and o.canary in wave and runs[o.canary].outcome not in (PASSED, SKIPPED):
            stop = f"the canary {o.canary} did not pass ({runs[o.canary].outcome})"


def _labelled_one(home: Home, inventory: Inventory, result: RolloutResult, run: PairRun, argv: list[str]) -> PairRun:
    with progress.scope(run.pair):  # parallel pairs' progress lines name their pair
        return _one(home, inventory, result, run, argv)


def _one(home: Home, inventory: Inventory, result: RolloutResult, run: PairRun, argv: list[str]) -> PairRun:
    o = result.options
    t0 = time.monotonic()
    res: RunResult | None = None
    try:
        if result.command == "deploy":
            assert run.packages is not None
            if inventory.hooks:  # Kamal's pre-deploy: a failing hook refuses this pair, nothing changed
                check_veto(home, inventory, event_document(
                    "pre-deploy", f"pairctl deploy {run.pair}: starting", command="deploy", pair=run.pair,
                    rev=result.rev, packages=run.packages, profile=run.profile,
                ))  # fmt: skip
            res = deploy_pair(
                home,
                inventory,
                run.pair,
                (run.packages[0], run.packages[1]),
                profile_name=run.profile,
                skip_accept=o.skip_accept,
                checks=o.checks,
                kernel_check=o.kernel_check,
                argv=argv,
            )
        else:
            res = rollback_pair(home, inventory, run.pair, argv=argv)
        run.outcome, run.receipt = PASSED, res.receipt
    except PairctlError as exc:
        run.exit_code = int(exc.exit_code)
        run.error = str(exc)
        run.receipt = getattr(exc, "receipt", None)
        run.outcome = _OUTCOME_OF_EXIT.get(run.exit_code, REFUSED)
    except Exception as exc:  # one pair's bug must not hide the others' results (its traceback is logged)
        run.exit_code, run.outcome = int(ExitCode.FAILURE), REFUSED
        run.error = f"internal error: {type(exc).__name__}: {exc}"
    run.wall_s = time.monotonic() - t0
    if result.command == "deploy":
        event = _EVENT_OF.get(run.outcome)
    else:  # a rollback: passed, or failed whatever stopped it (refused, leased, its own rollback failed)
        event = (
            None if run.outcome == NOT_STARTED else "rollback.passed" if run.outcome == PASSED else "rollback.failed"
        )
    if event is not None:
        why = f" ({run.error.splitlines()[0][:200]})" if run.error else ""
        what = {"command": result.command, "pair": run.pair, "rev": result.rev, "packages": run.packages}
        doc = event_document(
            event,
            f"pairctl {result.command} {run.pair}: {run.outcome}{why}",
            **what,
            outcome=run.outcome,
            exit_code=run.exit_code,
            receipt=run.receipt,
        )
        run.hooks = run_hooks(home, inventory, doc)
    return run


def _summary(result: RolloutResult) -> str:
    counts: dict[str, list[str]] = {}
    for r in result.pairs:
        counts.setdefault(r.outcome, []).append(r.pair)
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in counts.items())


def check_options(o: RolloutOptions) -> None:
    if o.max_fail < 1:
        raise ConfigError("--max-fail must be at least 1")
    if o.pause_s < 0:
        raise ConfigError("--pause must not be negative")
    if o.waves < 0:
        raise ConfigError("--waves must not be negative (0: every wave)")
