"""Answer fixtures against the baseline: no new failing case.

Each fixture's answer is judged by its own expectation (regex, or equal to the baseline's answer),
then compared with the baseline's result for the same fixture sha256: passed-before-fails-now is a
regression; failing on both is pre-existing (reported, never a pass). A baseline is only one that
ran the same model files (`checks.live.find_baseline`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel

from orchestrator.checks.base import CheckContext, CheckResult, Timer, result, verdict_of
from orchestrator.checks.fixtures import Fixture, FixtureSet, load_fixture_set
from orchestrator.config.profiles import RouteProfile
from orchestrator.hashing import sha256_json

NAME = "answer_fixtures"
DEFAULT_SET = "lab"

Status = Literal["pass", "regressed", "pre_existing", "fixed", "fail_new", "no_baseline"]


class FixtureOutcome(BaseModel):
    id: str
    sha256: str
    family: str
    passed: bool | None  # None: cannot tell (same_as_baseline without a baseline)
    content: str
    tokens: list[int] = []
    baseline_passed: bool | None = None
    status: Status


_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def json_object_has(content: str, keys: list[str]) -> bool:
    """Whether the answer holds a JSON object with `keys`: a fenced block, or the text from its
    first `{` to its last `}` (models wrap JSON in prose and code fences)."""
    candidates = [m.group(1) for m in _FENCED.finditer(content)]
    if "{" in content and "}" in content:
        candidates.append(content[content.index("{") : content.rindex("}") + 1])
    for text in candidates:
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict) and all(k in obj for k in keys):
            return True
    return False


def judge(fx: Fixture, content: str, tokens: list[int], base: Mapping[str, Any] | None) -> FixtureOutcome:
    """Pure: this run's answer vs its expectation and the baseline's result for the same sha256."""
    base_passed = base.get("passed") if base else None
    if fx.expect.regex is not None:
        passed: bool | None = re.search(fx.expect.regex, content, re.DOTALL) is not None
    elif fx.expect.json_keys is not None:
        passed = json_object_has(content, fx.expect.json_keys)
    elif base is None:
        passed = None
    else:
        passed = list(tokens) == list(base.get("tokens") or []) and content == base.get("content")
        if fx.expect.same_as_baseline:
            base_passed = True  # the baseline defines the answer
    if passed is None:
        status: Status = "no_baseline"
    elif base is None or base_passed is None:
        status = "pass" if passed else "fail_new"
    elif passed:
        status = "pass" if base_passed else "fixed"
    else:
        status = "regressed" if base_passed else "pre_existing"
    return FixtureOutcome(
        id=fx.id,
        sha256=fx.sha256,
        family=fx.family,
        passed=passed,
        content=content,
        tokens=list(tokens),
        baseline_passed=base_passed,
        status=status,
    )


def verdict_problems(outcomes: list[FixtureOutcome], have_baseline: bool) -> list[str]:
    p = [f"{o.id}: passed on the baseline, fails now" for o in outcomes if o.status == "regressed"]
    p += [f"{o.id}: fails, and the baseline has no result for this fixture" for o in outcomes if o.status == "fail_new"]
    p += [
        f"{o.id}: the baseline has no answer to compare with"
        for o in outcomes
        if o.status == "no_baseline" and have_baseline
    ]
    return p


def baseline_results(ctx: CheckContext) -> dict[str, Mapping[str, Any]] | None:
    raw = ctx.baseline.raw(NAME) if ctx.baseline is not None else None
    if not raw:
        return None
    return {r["sha256"]: r for r in raw.get("results", []) if isinstance(r, Mapping) and "sha256" in r}


def fixture_set_for(profile: RouteProfile, given: FixtureSet | None = None) -> FixtureSet:
    """The set a run is judged on: the one given (`accept --fixtures`), else the profile's, else the lab's."""
    return given if given is not None else load_fixture_set(profile.answer_fixtures or DEFAULT_SET)


def answer_key(profile: RouteProfile, models: Mapping[str, str], fs: FixtureSet) -> str:
    """What answers are comparable by: the fixture set and the model file served. A baseline
    with another key (the tiny model's answers when the real one serves, another fixture set) is
    no baseline, even on a pair whose inventory lists the same model files."""
    return sha256_json({"fixtures": fs.sha256(), "model": profile.model, "weights_sha256": models.get(profile.model)})


def run(ctx: CheckContext) -> CheckResult:
    timer = Timer()
    fs = fixture_set_for(ctx.profile, ctx.fixtures)
    base = baseline_results(ctx)
    outcomes = []
    for fx in fs.fixtures:
        prompt = fx.prompt
        if fx.chat:  # the model's own chat template, as a chat client's request gets it
            prompt = str(
                ctx.client.post_json(
                    "/apply-template", {"messages": [{"role": "user", "content": fx.prompt}]}, timeout=60
                )["prompt"]
            )
        r = ctx.client.completion(
            prompt, fx.n_predict, id_slot=0, cache_prompt=False, seed=0, timeout=ctx.options.request_timeout_s
        )
        outcomes.append(judge(fx, r.content, list(r.tokens), base.get(fx.sha256) if base is not None else None))
    problems = verdict_problems(outcomes, base is not None)
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in get_args(Status)}
    figures = {
        "fixture_set": fs.name,
        "fixture_set_sha256": fs.sha256()[:16],
        **{k: v for k, v in counts.items() if v},
        "baseline": ctx.baseline.receipt[:16] if ctx.baseline and ctx.baseline.receipt else None,
    }
    raw = {
        "fixture_set": fs.name,
        "fixture_set_sha256": fs.sha256(),
        "models": dict(ctx.weights_sha256),
        "answer_key": answer_key(ctx.profile, ctx.weights_sha256, fs),
        "baseline_receipt": ctx.baseline.receipt if ctx.baseline else None,
        "results": [o.model_dump() for o in outcomes],
        "problems": problems,
    }
    if base is None:
        # nothing to compare "no new failing case" against: record these answers as a baseline
        failing = [o.id for o in outcomes if o.passed is False]
        msg = "no baseline results: recorded the answers as a baseline" + (
            f" (failing their regex: {', '.join(failing)})" if failing else ""
        )
        return result(NAME, "skipped", msg, timer, figures=figures, raw=raw)
    pre = [o.id for o in outcomes if o.status == "pre_existing"]
    msg = "; ".join(problems) or (
        f"no new failing fixture ({counts['pass'] + counts['fixed']} pass"
        + (f"; pre-existing failures, not counted as passes: {', '.join(pre)}" if pre else "")
        + ")"
    )
    return result(NAME, verdict_of(problems), msg, timer, figures=figures, raw=raw)
