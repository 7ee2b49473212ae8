"""`pairctl bisect`: the first bad revision between a good and a bad one, judged on the pair.

Each step builds the commit git names next (a build failure: `skip`) and judges it under the
bisect's leases: `checks`, a deploy with acceptance limited to them (a failed check `bad`, a
package that never came up `skip`); `plan`, a qualification against the good revision (a failed
non-regression gate `bad`, all passed `good`, else `skip`). Each step's receipt is sealed before
git is told. The pair is restored (shielded, verified) at the end, after a failure or a signal;
the state stays in the home, so the same command or `--resume` continues an interrupted bisect.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchestrator import interrupt
from orchestrator.bisect import state as st
from orchestrator.bisect.driver import BisectDriver, UnderHold
from orchestrator.bisect.gitbisect import Mark, PrivateBisect, Range, resolve_range
from orchestrator.bisect.state import BisectState, Judgement, StepRecord
from orchestrator.build import git
from orchestrator.build.builder import BuildRequest
from orchestrator.build.builder import build as run_build
from orchestrator.config.inventory import Inventory
from orchestrator.config.profiles import load_profile
from orchestrator.errors import (
    BuildError,
    ConfigError,
    Inconclusive,
    PackageError,
    PairctlError,
    RollbackFailed,
    RolledBack,
    UsageError,
)
from orchestrator.evidence.store import EvidenceStore
from orchestrator.log import get_logger
from orchestrator.paths import Home

# Steps of a deploy whose failure means "this package does not come up" (skip), not "it came up
# and is wrong" (bad): everything before identity verification.
_NOT_STARTED = frozenset(
    {"upload", "kernel-check", "secret", "stop-native", "restart-rpc", "switch-native", "start-server"}
)


def classify_rolled_back(failed_steps: list[str], first_line: str) -> tuple[str, str]:
    """A rolled-back deploy's verdict from its failed steps: `skip` when only steps before
    identity verification failed (the package never came up), else `bad`."""
    if failed_steps and all(n in _NOT_STARTED for n in failed_steps):
        return "skip", f"the package did not come up ({', '.join(failed_steps)}): {first_line}"
    return "bad", f"acceptance failed ({', '.join(failed_steps) or 'deploy'}): {first_line}"


@dataclass(frozen=True)
class BisectRequest:
    pair: str
    source: Path
    good: str | None
    bad: str | None
    judgement: Judgement | None
    profile: str | None = None
    dry_run: bool = False
    resume: bool = False
    jobs: int | None = None
    argv: list[str] = field(default_factory=list)
    # one line per event as it happens (the commit judged, its verdict, the restore): the CLI
    # writes them to stderr, so a run without a TTY (CI, a log file) shows its progress too
    progress: Callable[[str], None] | None = None


@dataclass
class BisectResult:
    pair: str
    outcome: str  # found | ambiguous | dry-run
    range: dict[str, Any]
    first_bad: dict[str, str] | None = None
    candidates: list[dict[str, str]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    judged_steps: int = 0
    receipt: str | None = None
    restored: dict[str, Any] | None = None
    resumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"command": "bisect", **asdict(self)}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _subject(repo: Path, commit: str) -> dict[str, str]:
    return {"commit": commit, "subject": git.git(repo, "log", "-1", "--format=%s", commit).stdout.strip()}


@dataclass
class _Pair:
    """What the pair needs from every step: its targets, the profile its packages are named for."""

    name: str
    profile_ref: str
    profile_name: str
    targets: tuple[str, str]  # native, rpc

    def package_ids(self, commit: str) -> tuple[str, str]:
        from orchestrator.build.manifest import package_id

        native, rpc = self.targets
        return package_id(self.profile_name, commit, native), package_id(self.profile_name, commit, rpc)


def _pair(inventory: Inventory, name: str, profile: str | None) -> _Pair:
    spec = inventory.pair(name)
    ref = profile or spec.profile
    prof = load_profile(ref, pair=spec)
    for role, t in (("native", spec.target_native), ("rpc", spec.target_rpc)):
        if not t:
            raise ConfigError(
                f"inventory: pair {name}: field 'target_{role}' is not set, so bisect cannot build its package",
                hint=f"set pairs.{name}.target_{role} to the build target of that host (e.g. cpu-lab, v100)",
            )
    assert spec.target_native and spec.target_rpc
    return _Pair(name, ref, prof.name, (spec.target_native, spec.target_rpc))


def _request_state(home: Home, req: BisectRequest, pair: _Pair) -> tuple[BisectState | None, Range | None]:
    """The state to continue (resume) or None for a new bisect, and the range of a new one."""
    old = st.load(home, req.pair)
    if req.resume:
        if old is None or old.finished is not None:
            raise UsageError(
                f"pair {req.pair} has no unfinished bisect to resume",
                hint=f"start one: pairctl bisect --pair {req.pair} --good REV --bad REV --checks ...",
            )
        return old, None
    if req.good is None or req.bad is None or req.judgement is None:
        raise UsageError("bisect needs --good REV and --bad REV and a judgement (--checks or --plan), or --resume")
    git.require_repo(req.source)
    rng = resolve_range(req.source, req.good, req.bad)
    if old is not None and old.finished is None:
        if old.same_request(rng.good.commit, rng.bad.commit, req.judgement, pair.profile_ref) and not req.dry_run:
            return old, rng
        if not req.dry_run:
            raise st.refuse_other(old)
    return None, rng


def bisect(home: Home, inventory: Inventory, req: BisectRequest) -> BisectResult:
    """Run (or resume, or with dry_run only describe) a bisect of `req.pair`."""
    home.ensure()
    pair = _pair(inventory, req.pair, req.profile)
    old, rng = _request_state(home, req, pair)
    if old is not None:
        source = Path(old.source)
        rng = resolve_range(source, old.good, old.bad)
        judgement, pair = old.judgement, _pair(inventory, req.pair, old.profile)
    else:
        assert rng is not None and req.judgement is not None
        source, judgement = req.source, req.judgement
    if req.dry_run:
        what = {"judgement": judgement.as_dict(), "targets": list(pair.targets), "profile": pair.profile_ref}
        return BisectResult(req.pair, "dry-run", {**rng.as_dict(), **what})
    if rng.size < 1:
        raise UsageError("the range is empty")
    private = PrivateBisect(st.folder(home, req.pair), source)
    if old is None:
        state = BisectState(
            pair=req.pair,
            source=str(source),
            good=rng.good.commit,
            bad=rng.bad.commit,
            judgement=judgement,
            profile=pair.profile_ref,
            started_at=_now(),
        )
        private.start(rng)
        st.save(home, state)
    else:
        state = old
        if not private.exists():
            raise ConfigError(
                f"{private.repo}: the bisect's git state is gone; it cannot be resumed",
                hint=f"`pairctl bisect --pair {req.pair} --reset` and start again",
            )
    return _Run(home, inventory, req, pair, state, private, rng, resumed=old is not None).run()


@dataclass
class _Run:
    home: Home
    inventory: Inventory
    req: BisectRequest
    pair: _Pair
    state: BisectState
    private: PrivateBisect
    rng: Range
    resumed: bool
    good_ids: tuple[str, str] | None = None
    noise: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.source = Path(self.state.source)
        self.store = EvidenceStore(self.home.evidence)
        self.log = get_logger(pair=self.pair.name, command="bisect")
        self.argv = self.req.argv or ["pairctl", "bisect", "--pair", self.pair.name]

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> BisectResult:
        j = self.state.judgement
        inputs = {"good": self.state.good, "bad": self.state.bad, "judgement": j.describe()}
        inputs["profile"] = self.pair.profile_ref
        journal = self.store.begin(command="bisect", argv=self.argv, pair=None, inputs=inputs)
        self.state.runs.append(journal.run_id)
        st.save(self.home, self.state)  # a later resume knows this run's leases as its own, even after a SIGKILL
        result = BisectResult(self.pair.name, "running", self.rng.as_dict(), resumed=self.resumed)
        driver = BisectDriver(self.home, self.inventory, self.pair.name, argv=self.argv)
        try:
            with journal:
                journal.set("bisect_pair", self.pair.name)
                request: dict[str, Any] = {**inputs, "judgement": j.as_dict(), "source": str(self.source)}
                request.update(targets=list(self.pair.targets), resumed=self.resumed)
                journal.set("bisect_request", request)
                journal.set("bisect_range", self.rng.as_dict())
                driver.own_runs = tuple(self.state.runs[:-1])
                with driver.hold(journal.run_id) as held:
                    journal.set("bisect_leases", held.public())
                    with journal.step("snapshot") as step:
                        if self.state.snapshot is None:  # the first run: what runs now, kept before any step
                            step.data["active"] = driver.take_snapshot()
                            self.state.snapshot = driver.saved_snapshot()
                            st.save(self.home, self.state)
                        else:  # a resume: the first run's, whatever a killed run left active
                            step.data["active"] = driver.use_snapshot(self.state.snapshot)
                            step.data["taken_by"] = "the bisect's first run (state.json)"
                    try:
                        mark = self._walk(driver, held, journal)
                    except BaseException as exc:
                        if isinstance(exc, RollbackFailed):
                            held.keep("a step's rollback failed: the pair's state is unknown")
                        self._restore(driver, held, journal, result)  # after a failure or a signal
                        raise
                    self._restore(driver, held, journal, result)
                journal.set("bisect_leases_end", held.end())
                self._answer(mark, result)
                journal.set("bisect_verdicts", [self._evidence(s) for s in self.state.steps])
                answer = {"first_bad": result.first_bad, "candidates": result.candidates}
                journal.set(
                    "bisect_answer",
                    {**answer, "judged_steps": result.judged_steps, "git_bisect_log": self.private.log()},
                )
                self.state.finished = {"outcome": result.outcome, **answer, "at": _now()}
                st.save(self.home, self.state)
                what = (
                    f"first bad commit {result.first_bad['commit'][:10]} ({result.first_bad['subject']})"
                    if result.first_bad
                    else f"only skipped commits left; the first bad is one of {len(result.candidates)}"
                )
                result.receipt = journal.finish(
                    "passed" if result.first_bad else "inconclusive", f"{what}; {result.judged_steps} judged steps"
                )
        except BaseException as exc:
            # every exit names the bisect receipt it sealed (--json's error.receipt): an
            # interrupted or failed run seals one too, on leaving `with journal`
            if journal.receipt_hash and getattr(exc, "receipt", None) is None:
                exc.receipt = journal.receipt_hash  # type: ignore[attr-defined]
                self._say(f"receipt {journal.receipt_hash} ({type(exc).__name__})")
            raise
        finally:
            driver.close()
            st.save(self.home, self.state) if self.state.finished is None else None
        result.steps = [self._evidence(s) for s in self.state.steps]
        return result

    def _say(self, line: str) -> None:
        if self.req.progress is not None:
            self.req.progress(line)

    def _restore(self, driver: BisectDriver, held: Any, journal: Any, result: BisectResult) -> None:
        """What ran before the bisect, verified (route record, packages, profile, argv); shielded
        from signals. Not attempted onto a pair whose rollback failed (the leases stay held)."""
        with interrupt.shielded(), journal.step("restore") as step:
            if held.kept is not None:
                step.data["not_attempted"] = held.kept
                self._say(f"restore not attempted: {held.kept}")
                return
            found = driver.found_snapshot or {}
            self._say(f"restoring what ran before the bisect: {found.get('native')} / {found.get('rpc')}")
            try:
                result.restored = driver.restore_found()
            except PairctlError as exc:
                held.keep(f"the restore after the bisect failed: {str(exc).splitlines()[0]}")
                raise RollbackFailed(
                    f"bisect of {self.pair.name}: restoring what ran before failed: {exc}",
                    hint=f"check the pair (`pairctl status --pair {self.pair.name}`), then release the leases",
                ) from exc
            step.data["verified"] = result.restored
            self._say("restored and verified (route record, packages, profile, argv)")

    def _answer(self, mark: Mark, result: BisectResult) -> None:
        result.judged_steps = self.state.judged
        if mark.first_bad:
            result.outcome, result.first_bad = "found", _subject(self.source, mark.first_bad)
        else:
            result.outcome = "ambiguous"
            result.candidates = [_subject(self.source, c) for c in mark.candidates]

    def _evidence(self, s: StepRecord) -> dict[str, Any]:
        return {"commit": s.commit, "verdict": s.verdict, "reason": s.reason, "receipt": s.receipt, **s.evidence}

    def _walk(self, driver: BisectDriver, held: Any, journal: Any) -> Mark:
        if self.state.judgement.kind == "plan":
            with journal.step("baseline") as step:
                step.data.update(self._prepare_plan(driver, held))
        mark = self.private.state("")
        while not mark.done:
            assert mark.next is not None
            interrupt.check("before the next bisect step")
            done = self.state.verdict_of(mark.next)
            n = len(self.state.steps) + (1 if done is None else 0)
            if done is None:  # not judged yet (a verdict recorded but not told to git is re-told)
                subject = _subject(self.source, mark.next)["subject"]
                self._say(f"step {n}: judging {mark.next[:10]} {subject[:80]}")
                done = self._step(driver, held, mark.next)
                self.state.steps.append(done)
                st.save(self.home, self.state)
                self._say(f"step {n}: {done.commit[:10]} is {done.verdict}: {done.reason[:160]}")
            else:
                self._say(f"{done.commit[:10]} was judged {done.verdict} by an earlier run (told to git again)")
            with journal.step(f"step-{len(self.state.steps):02d}-{done.commit[:10]}") as step:
                step.data.update(self._evidence(done))
            mark = self.private.mark(done.commit, done.verdict)  # type: ignore[arg-type]
            self.log.info("bisect verdict", commit=done.commit[:10], verdict=done.verdict, reason=done.reason)
        return mark

    # -- one step ------------------------------------------------------------------------------
    def _step(self, driver: BisectDriver, held: Any, commit: str) -> StepRecord:
        inputs = {"commit": commit, "judgement": self.state.judgement.describe()}
        journal = self.store.begin("bisect step", [*self.argv, f"(step {commit[:10]})"], pair=None, inputs=inputs)
        with journal:
            about = {"pair": self.pair.name, "commit": commit, "good": self.state.good, "bad": self.state.bad}
            journal.set("bisect_step", {**about, "judgement": self.state.judgement.as_dict()})
            evidence: dict[str, Any] = {}
            verdict, reason = self._build(commit, evidence, journal)
            if verdict is None:
                interrupt.check("after the step's build")
                held.renew()  # a long build must not outlast the leases
                with journal.step("judge") as step:
                    verdict, reason = self._judge(driver, held, commit, evidence)
                    # a signal that cut the deploy or the qualification short is not the commit's fault
                    interrupt.check(f"while judging {commit[:10]} (no verdict recorded)")
                    step.data.update({"verdict": verdict, "reason": reason, **evidence})
            journal.set("bisect_verdict", {"commit": commit, "verdict": verdict, "reason": reason, **evidence})
            outcome = {"good": "passed", "bad": "failed", "skip": "inconclusive"}[verdict]
            receipt = journal.finish(outcome, f"{commit[:10]} is {verdict}: {reason}")
        return StepRecord(commit=commit, verdict=verdict, reason=reason, receipt=receipt, evidence=evidence)

    def _build(self, commit: str, evidence: dict[str, Any], journal: Any) -> tuple[str | None, str]:
        """Build the pair's targets from `commit`; (skip, why) when it does not build."""
        targets = tuple(dict.fromkeys(self.pair.targets))
        req = BuildRequest(
            source=self.source, rev=commit, targets=targets, profile=self.pair.profile_name, jobs=self.req.jobs
        )
        argv = ["build", "--rev", commit, *(f"--target={t}" for t in targets), f"--profile={self.pair.profile_name}"]
        with journal.step("build") as step:
            try:
                results = run_build(self.home, req, interactive=False, argv=[*argv, "(bisect step)"])
            except PackageError:
                raise  # a package that differs from its id's: integrity, never a verdict
            except BuildError as exc:
                if interrupt.received():  # the signal reached the compiler too: not the commit's fault
                    raise
                why = str(exc.message).splitlines()[0][:300]
                step.data["does_not_build"] = why
                evidence["build"] = {"error": why}
                return "skip", f"does not build: {why}"
            evidence["build"] = {
                "receipt": results[0].receipt,
                "packages": [r.package.id for r in results],
                "cached": [r.cached for r in results],
                "seconds": [round(r.duration_s, 1) for r in results],
            }
            step.data.update(evidence["build"])
        return None, ""

    def _judge(self, driver: BisectDriver, held: Any, commit: str, evidence: dict[str, Any]) -> tuple[str, str]:
        ids = self.pair.package_ids(commit)
        if self.state.judgement.kind == "checks":
            return self._judge_checks(driver, ids, evidence)
        return self._judge_plan(driver, held, ids, evidence)

    def _judge_checks(self, driver: BisectDriver, ids: tuple[str, str], evidence: dict[str, Any]) -> tuple[str, str]:
        checks = self.state.judgement.checks
        try:
            res = driver.deploy_checked(ids, self.pair.profile_ref, checks, "bisect step")
        except RolledBack as exc:
            receipt = getattr(exc, "receipt", None)
            evidence["deploy"] = {"receipt": receipt, "rolled_back": True}
            failed, why = self._failed_steps(receipt)
            evidence["deploy"]["failed_steps"] = failed
            return classify_rolled_back(failed, why or str(exc.message).splitlines()[0][:300])
        evidence["deploy"] = {"receipt": res.receipt, "rolled_back": False}
        return "good", f"deployed and accepted ({', '.join(checks) or 'the whole suite'})"

    def _failed_steps(self, receipt: str | None) -> tuple[list[str], str]:
        """The deploy receipt's failed steps (not its rollback's) and the first line of the most
        specific error (a check's own rather than the deploy's summary)."""
        if not receipt:
            return [], ""
        rec = self.store.load(receipt)
        failed = [s for s in rec.steps if s.outcome == "failed" and not s.name.startswith("rollback")]
        best = next((s for s in failed if s.name.startswith("check:")), failed[-1] if failed else None)
        why = ((best.error or "").strip().splitlines() or [""])[0][:300] if best else ""
        return [s.name for s in failed], why

    # -- plan judgement ------------------------------------------------------------------------
    def _prepare_plan(self, driver: BisectDriver, held: Any) -> dict[str, Any]:
        """The good revision's packages (every step's baseline) and the plan's calibration for
        them: found in the evidence, or measured now (an A/A run)."""
        from orchestrator.qualify.calibration import find_calibration, judge, profile_key
        from orchestrator.qualify.plan import load_plan

        out: dict[str, Any] = {}
        verdict, why = self._build(self.state.good, out, _NoJournal())
        if verdict is not None:
            raise BuildError(f"the good revision {self.state.good[:10]} does not build: {why}")
        self.good_ids = self.pair.package_ids(self.state.good)
        loaded = load_plan(self.state.judgement.plan or "")
        spec = self.inventory.pair(self.pair.name)
        profile = load_profile(self.pair.profile_ref, pair=spec)
        base, key = {"native": self.good_ids[0], "rpc": self.good_ids[1]}, profile_key(profile)

        def find() -> tuple[str, dict[str, Any]] | None:
            return find_calibration(
                self.store, pair=self.pair.name, plan=loaded.plan, profile_sha256=key, baseline=base
            )

        found = find()
        if found is None and loaded.plan.calibration is not None:
            outcome = self._qualify(driver, held, self.good_ids, calibrate=True)
            out["calibrated_now"] = outcome.receipt
            found = find()
        hint = "the calibration of the good revision did not resolve the plan's gates; see its receipt"
        self.noise = judge(loaded.plan, found, calibrate_hint=hint)
        self.state.calibration = found[0] if found else None
        out.update({"baseline": list(self.good_ids), "calibration": self.state.calibration})
        return out

    def _qualify(self, driver: BisectDriver, held: Any, candidate: tuple[str, str], *, calibrate: bool = False) -> Any:
        from orchestrator.qualify.plan import load_plan
        from orchestrator.qualify.report import write_report
        from orchestrator.qualify.runner import ArmPackages, run_qualification

        assert self.good_ids is not None
        loaded = load_plan(self.state.judgement.plan or "")
        profile = load_profile(self.pair.profile_ref, pair=self.inventory.pair(self.pair.name))
        nested = UnderHold(driver, held)
        try:
            return run_qualification(
                store=self.store,
                loaded=loaded,
                pair=self.pair.name,
                baseline=ArmPackages(*self.good_ids),
                candidate=ArmPackages(*candidate),
                profile=profile,
                driver=nested,
                argv=[*self.argv, "(bisect qualification)" if not calibrate else "(bisect calibration)"],
                write_report=lambda h: write_report(self.store, h)[0],
                calibrate=calibrate,
                noise=None if calibrate else self.noise,
            )
        finally:
            nested.close()

    def _judge_plan(
        self, driver: BisectDriver, held: Any, ids: tuple[str, str], evidence: dict[str, Any]
    ) -> tuple[str, str]:
        out = self._qualify(driver, held, ids)
        nr = [g for g in out.result.gates if g.kind == "non_regression"]
        keys = ("family", "verdict", "gain", "low", "high", "threshold")
        evidence["qualify"] = {"receipt": out.receipt, "non_regression": [{k: getattr(g, k) for k in keys} for g in nr]}
        if isinstance(out.stop_error, RollbackFailed) or not out.restored:
            raise RollbackFailed(f"the qualification of the step could not restore the pair: {out.restore_error}")
        if out.stop_error is not None:
            return "skip", f"an arm did not come up: {str(out.stop_error).splitlines()[0][:300]}"
        failed = [g for g in nr if g.verdict == "fail"]
        if failed:
            return "bad", "non-regression gate failed: " + "; ".join(
                f"{g.family} gain {g.gain:+.3f} below {g.threshold:+.3f}" if g.gain is not None else g.family
                for g in failed
            )
        if nr and all(g.verdict == "pass" for g in nr):
            return "good", "every non-regression gate passed"
        raise_if = [g.verdict for g in nr]
        return "skip", f"inconclusive: non-regression gates {raise_if or 'none declared'}"


class _NoJournal:
    """`_build` outside a step receipt (the good revision's packages, in the bisect receipt)."""

    def step(self, name: str) -> AbstractContextManager[Any]:
        return nullcontext(SimpleNamespace(data={}))


__all__ = ["BisectRequest", "BisectResult", "bisect", "Inconclusive", "PairctlError"]
