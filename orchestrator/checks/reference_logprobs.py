"""Reference logprobs: the candidate's next-token distributions against the reference pair's
recorded answers, teacher-forced on the reference's own tokens.

Self-consistency checks cannot see a forward pass that changed the same way on both sides. For
each fixture the candidate answers the same prompt with top-K logprobs; where its greedy token
differs, it continues from the reference's prefix, so every position is judged on the reference's
sequence, gated by the profile's `reference_gates`. The pinned reference pair (or, with no pin, the
route's first pair) *records* answers for its key when none exist; any other pair *compares*, and
fails when the reference has no answers for its key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.checks import logprobs as lp
from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged, result
from orchestrator.checks.oracle_fixtures import (
    DEFAULT_SET,
    OracleFixture,
    OracleFixtureSet,
    load_oracle_set,
    seeded_text,
)
from orchestrator.checks.reference import (
    CHECK,
    Answers,
    answers_key,
    base_key,
    changed_fields,
    device_kind,
    numerics_fields,
    profile_answer_fields,
)
from orchestrator.config.reference_gates import GateFigures, ReferenceGates, derived
from orchestrator.roles import ROLES
from orchestrator.server.parsers import parse_token_logprobs

NAME = CHECK
Prompt = str | list[int]


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    positions: list[dict[int, float]]


NO_VOCAB = "the server does not report n_vocab (/v1/models); set reference_gates.top_k in the profile"


def asked_raw(ctx: CheckContext, fs: OracleFixtureSet, k: int, vocab: int | None) -> dict[str, Any]:
    """What every logprob comparison records first: the fixtures, the models, how wide it asked."""
    return {
        "fixture_set": fs.name,
        "fixture_set_sha256": fs.sha256(),
        "models": dict(ctx.weights_sha256),
        "top_k": k,
        "n_vocab": vocab,
    }


def top_k_for(ctx: CheckContext, gates: ReferenceGates) -> tuple[int, int | None, bool]:
    """How many top logprobs each position asks for: the profile's `top_k`, else the whole
    vocabulary; with n_vocab and whether that list is complete. k is 0 when neither is known."""
    vocab = n_vocab(ctx)
    k = gates.top_k or vocab or 0
    return k, vocab, vocab is not None and k >= vocab


def n_vocab(ctx: CheckContext) -> int | None:
    try:
        data = ctx.client.get_json("/v1/models", timeout=30)
        return int(data["data"][0]["meta"]["n_vocab"])
    except Exception:  # an older server without meta: the gates' top_k must then be set
        return None


GREEDY = {"temperature": 0.0, "seed": 0, "id_slot": 0, "cache_prompt": True, "stream": False}


class Asker:
    """The requests of one comparison: first pass per endpoint, continuation via /completion."""

    def __init__(self, ctx: CheckContext, k: int) -> None:
        self.ctx, self.k = ctx, k
        self.requests = 0

    def _post(self, path: str, body: dict[str, Any]) -> Answer:
        self.requests += 1
        data = self.ctx.client.post_json(path, body, timeout=self.ctx.options.request_timeout_s)
        tokens, positions = parse_token_logprobs(data, path)
        return Answer(tokens, positions)

    def first(self, endpoint: str, prompt: Prompt, n: int) -> Answer:
        common = {**GREEDY, "cache_prompt": False}
        if endpoint == "chat":
            return self._post(
                "/v1/chat/completions",
                {
                    **common,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": n,
                    "logprobs": True,
                    "top_logprobs": self.k,
                },
            )
        path = "/completion" if endpoint == "completion" else "/v1/completions"
        key = "n_predict" if endpoint == "completion" else "max_tokens"
        return self._post(path, {**common, "prompt": prompt, key: n, "n_probs": self.k})

    def cont(self, prefix: Prompt, forced: list[int], n: int) -> Answer:
        prompt: list[Any] = ([prefix] if isinstance(prefix, str) else list(prefix)) + list(forced)
        return self._post("/completion", {"prompt": prompt, "n_predict": n, "n_probs": self.k, **GREEDY})

    def template(self, message: str) -> str:
        self.requests += 1
        data = self.ctx.client.post_json(
            "/apply-template",
            {"messages": [{"role": "user", "content": message}]},
            timeout=self.ctx.options.request_timeout_s,
        )
        return str(data["prompt"])


def prompts_of(ctx: CheckContext, asker: Asker, fs: OracleFixtureSet, fx: OracleFixture) -> tuple[Prompt, Prompt]:
    """(prompt sent through the fixture's endpoint, prefix a /completion continuation starts from)."""
    if fx.near_full:
        n = ctx.per_slot() - fx.n_predict - fs.near_full_margin
        ids: list[int] = []
        chars = 2 * n
        while len(ids) < n:
            ids = ctx.client.tokenize(seeded_text(fx.seed, chars), add_special=False)
            chars *= 2
        return ids[:n], ids[:n]
    assert fx.prompt is not None
    if fx.endpoint == "chat":
        return fx.prompt, asker.template(fx.prompt)
    return fx.prompt, fx.prompt


def record(ctx: CheckContext, asker: Asker, fs: OracleFixtureSet, floor: float) -> list[dict[str, Any]]:
    out = []
    for fx in fs.fixtures:
        prompt, prefix = prompts_of(ctx, asker, fs, fx)
        a = asker.first(fx.endpoint, prompt, fx.n_predict)
        mine = {"id": fx.id, "endpoint": fx.endpoint, "prompt": prompt, "prefix": prefix, "tokens": a.tokens}
        got, _, _ = teacher_forced(asker, mine, first=a)  # fills the positions drafting left without logprobs
        if len(got.positions) < len(a.tokens):
            raise ValueError(
                f"{fx.id}: the reference answered logprobs for {len(got.positions)} of {len(a.tokens)} positions"
            )
        out.append({**mine, "positions": [lp.trimmed(p, floor) for p in got.positions]})
    return out


def teacher_forced(asker: Asker, fx: Mapping[str, Any], first: Answer | None = None) -> tuple[Answer, int, int]:
    """The candidate's distribution at every position of the reference's tokens; also the number
    of positions where its greedy token differed and the first such position (-1: none). It
    continues from the reference's prefix where its greedy token differs and where a position has
    no logprobs (tokens accepted from a draft)."""
    ref_tokens = list(fx["tokens"])
    n = len(ref_tokens)
    got = first if first is not None else asker.first(fx["endpoint"], fx["prompt"], n)
    positions: list[dict[int, float]] = []
    flips, first_flip = 0, -1
    drafting = False  # a position came back without logprobs: the server drafts
    for _ in range(n + 1):  # each round adds at least one position, or ends
        base = len(positions)
        m = min(len(got.tokens), len(got.positions), n - base)
        k = 0
        while k < m and got.positions[k] and got.tokens[k] == ref_tokens[base + k]:
            k += 1
        positions += got.positions[:k]
        if k < m and got.positions[k]:  # greedy differs here; the distribution was still on the reference's prefix
            positions.append(got.positions[k])
            flips += 1
            first_flip = base + k if first_flip < 0 else first_flip
        drafting = drafting or any(not p for p in got.positions[: n - base])
        if len(positions) >= n or (len(positions) == base and (k >= m or not got.positions[k])):
            break  # done, or no progress: missing positions are reported, never invented
        got = asker.cont(fx["prefix"], ref_tokens[: len(positions)], continuation_tokens(n - len(positions), drafting))
    return Answer(ref_tokens[: len(positions)], positions), flips, first_flip


DRAFT_FREE_TOKENS = 2  # a request's first token comes from its prompt, the second with one token left


def continuation_tokens(left: int, drafting: bool) -> int:
    """How many tokens a teacher-forced continuation asks for: a drafting server reports logprobs
    only for tokens not taken from a draft, and never drafts the first token after a prompt nor with
    one token left, so it is asked two; a server that does not draft, all that is left."""
    return min(left, DRAFT_FREE_TOKENS) if drafting else left


def compare(
    asker: Asker, answers: Sequence[Mapping[str, Any]], gates: ReferenceGates, complete: bool
) -> tuple[lp.Summary, list[dict[str, Any]], list[str]]:
    """Teacher-forced figures of the running pair against `answers`, per fixture and overall;
    problems are only about completeness (the gates are judged by the caller)."""
    per_fixture, all_diffs, problems = [], [], []
    for fx in answers:
        got, flips, first_flip = teacher_forced(asker, fx)
        ref_pos = [{int(t): float(v) for t, v in p} for p in fx["positions"]]
        pairs = list(zip(ref_pos, got.positions, strict=False))
        if not all(r and c for r, c in pairs):
            problems.append(f"{fx['id']}: positions without logprobs on one side; the answers cannot be compared")
        diffs = [lp.compare_position(r, c, floor=gates.logprob_floor, complete=complete) for r, c in pairs if r and c]
        if len(got.positions) < len(ref_pos):
            problems.append(f"{fx['id']}: the server answered {len(got.positions)} of {len(ref_pos)} positions")
        s = lp.summarize(diffs)
        worst = max(range(len(diffs)), key=lambda i: diffs[i].max_abs_dlogprob) if diffs else None
        per_fixture.append(
            {
                "id": fx["id"],
                "endpoint": fx["endpoint"],
                **s.as_dict(),
                "greedy_flips": flips,
                "first_flip": first_flip,
                "worst_position": worst,
                "worst_token": diffs[worst].worst_token if worst is not None else None,
                "position_dlogprob": [round(d.max_abs_dlogprob, 7) for d in diffs],
                "position_shared_dlogprob": [round(d.shared_max_abs_dlogprob, 7) for d in diffs],
            }
        )
        all_diffs += diffs
    return lp.summarize(all_diffs), per_fixture, problems


def spread(per_fixture: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Median and 90th percentile over fixtures' per-position worst |dlogprob| (what a bug's size
    is quoted in: a few tail tokens set the max, the median says how much a typical position moved),
    and the largest movement of a token both sides list (a top-K cut crossing left out)."""
    xs = sorted(float(v) for f in per_fixture for v in f.get("position_dlogprob") or [])
    if not xs:
        return {}
    out = {"median_abs_dlogprob": xs[len(xs) // 2], "p90_abs_dlogprob": xs[min(len(xs) - 1, int(0.9 * len(xs)))]}
    shared = [float(v) for f in per_fixture for v in f.get("position_shared_dlogprob") or []]
    if shared:
        out["shared_max_abs_dlogprob"] = max(shared)
    return out


def recorded_gates(found: Answers) -> GateFigures | None:
    g = found.raw.get("derived_gates")
    try:
        return GateFigures.model_validate(g) if isinstance(g, Mapping) else None
    except ValueError:
        return None


def _record(ctx: CheckContext, asker: Asker, fs: OracleFixtureSet, gates: ReferenceGates, complete: bool,
            base_raw: dict[str, Any], how: str, key: str, started: Timer) -> CheckResult:  # fmt: skip
    """Record the answers, replay them at once on the same pair (the replay floor of this numerics
    key), and derive the gates from that floor. A replay that already misses the minimum gates
    means the pair does not reproduce itself: nothing is recorded as a yardstick then."""
    answers = record(ctx, asker, fs, gates.logprob_floor)
    floor, per_fixture, problems = compare(asker, answers, gates, complete)
    fl = GateFigures(max_mean_kl=floor.mean_kl, max_kl=floor.max_kl, max_abs_dlogprob=floor.max_abs_dlogprob)
    g = derived(fl, gates.floor_factor, gates.minimum)
    problems += lp.gate_problems(
        floor, max_mean_kl=gates.minimum.max_mean_kl, max_kl=gates.minimum.max_kl, min_top1=gates.min_top1,
        max_abs_dlogprob=gates.minimum.max_abs_dlogprob,
    )  # fmt: skip
    origin = {
        "floor": floor.as_dict(),
        "floor_factor": gates.floor_factor,
        "minimum": gates.minimum.model_dump(mode="json"),
        "derived_gates": g.model_dump(mode="json"),
        "floor_fixtures": per_fixture,
    }
    if problems:
        msg = (
            f"the reference pair does not reproduce its own answers (replay right after recording): "
            f"{'; '.join(problems)}; nothing was recorded (raise reference_gates.minimum only with a reason)"
        )
        return result(NAME, "failed", msg, started, raw={**base_raw, "role": "replay", **origin, "problems": problems})
    msg = (
        f"{how}; recorded its answers ({len(answers)} fixtures) as reference answers, key {key[:12]}; replay "
        f"floor max |dlogprob| {floor.max_abs_dlogprob:.3g}, max KL {floor.max_kl:.3g} -> gates "
        f"{g.max_abs_dlogprob:.3g} / {g.max_kl:.3g}"
    )
    return result(
        NAME,
        "skipped",
        msg,
        started,
        figures={
            "role": "reference",
            "key": key[:12],
            "fixtures": len(answers),
            "requests": asker.requests,
            "floor_max_abs_dlogprob": floor.max_abs_dlogprob,
            "floor_max_kl": floor.max_kl,
            "gate_max_abs_dlogprob": g.max_abs_dlogprob,
            "gate_max_kl": g.max_kl,
        },
        raw={**base_raw, "role": "reference", "answers": answers, **origin},
    )


def run(ctx: CheckContext) -> CheckResult:
    timer = Timer()
    fs = load_oracle_set(ctx.oracle_fixtures or ctx.profile.reference_fixtures or DEFAULT_SET)
    gates = ctx.profile.reference_gates
    k, vocab, complete = top_k_for(ctx, gates)
    if k <= 0:
        return result(NAME, "failed", NO_VOCAB, timer)
    ids = tuple(getattr(ctx.packages.get(r), "id", None) for r in ROLES)
    running = (str(ids[0]), str(ids[1])) if all(ids) else None
    state = ctx.reference
    kinds = {r: device_kind(ctx.packages.get(r)) for r in ROLES}
    numerics = numerics_fields(ctx.profile, kinds)
    base_raw: dict[str, Any] = {
        **asked_raw(ctx, fs, k, vocab),
        "gates": gates.model_dump(mode="json"),
        "numerics": numerics,
        "profile": ctx.profile.name,
    }
    if running is None or state is None:
        why = "the active packages are not in the local store" if running is None else "no evidence store was given"
        return result(NAME, "failed", f"cannot compare with reference answers: {why}", timer, raw=base_raw)
    pin = state.pin.packages() if state.pin else running
    base = base_key(pin, ctx.weights_sha256, profile_answer_fields(ctx.profile, ctx.n_ctx_train), fs.sha256())
    key = answers_key(base, numerics)
    base_raw |= {
        "packages": list(running),
        "reference": state.pin.as_dict() if state.pin else None,
        "key": key,
        "base_key": base,
    }
    asker = Asker(ctx, k)
    found = state.for_key(key)
    tolerance = gates.tolerance
    nearest = state.nearest(base, numerics) if found is None else None
    judged_by: dict[str, Any] = {}
    if found is None and nearest is not None and tolerance is not None:
        found = nearest
        judged_by = {
            "tolerance": {
                "reason": tolerance.reason,
                "against_key": nearest.key,
                "changed": changed_fields(nearest.raw.get("numerics") or {}, numerics),
            }
        }
    if found is None:
        changed = changed_fields(nearest.raw.get("numerics") or {}, numerics) if nearest else []
        return _no_answers(ctx, asker, fs, gates, complete, pin, running, key, changed, base_raw, timer)
    if judged_by:
        assert tolerance is not None
        in_force = tolerance.gates
        origin = "profile tolerance: " + tolerance.reason
    else:
        rg = recorded_gates(found)
        if rg is None:
            msg = f"reference answers {found.receipt[:12]} carry no derived gates: re-record them"
            return result(
                NAME, "failed", msg, timer, raw={**base_raw, "role": "candidate", "reference_receipt": found.receipt}
            )
        in_force = rg
        origin = f"replay floor x {found.raw.get('floor_factor')} (receipt {found.receipt[:12]})"
    return _judge(asker, found, gates, complete, in_force, origin, judged_by, pin, key, base_raw, timer)


def _no_answers(ctx: CheckContext, asker: Asker, fs: OracleFixtureSet, gates: ReferenceGates, complete: bool,
                pin: tuple[str, str], running: tuple[str, str], key: str, changed: list[str],
                base_raw: dict[str, Any], timer: Timer) -> CheckResult:  # fmt: skip
    """No answers to compare with: a candidate (not the pinned pair) fails and says how to record
    them; the reference pair itself records them, but only in a run of the whole suite, since a
    yardstick recorded by a run that skipped checks could be a broken pair's."""
    if pin != running:
        if changed:
            msg = (
                f"numerics changed since the reference answers ({'; '.join(changed)}) and profile "
                f"{ctx.profile.name} declares no reference_gates.tolerance: deploy the reference packages "
                f"{pin[0]} / {pin[1]} with this profile once to re-record, or declare a tolerance with its reason"
            )
        else:
            msg = (
                f"the reference pair {pin[0]} / {pin[1]} has no answers for key {key[:12]} (models, profile "
                f"{ctx.profile.model} at {ctx.per_slot()} per slot, fixtures {fs.name}): deploy the reference "
                "packages with this profile once to record them, or promote this pair with "
                f"`pairctl reference set --pair {ctx.pair}`"
            )
        return result(NAME, "failed", msg, timer, raw={**base_raw, "role": "candidate", "changed": changed})
    pinned = ctx.reference is not None and ctx.reference.pin is not None
    how = "this pair is the pinned reference" if pinned else "the route has no reference yet: this pair becomes it"
    if changed:
        how += f" (numerics changed: {'; '.join(changed)})"
    if not ctx.whole_suite:
        msg = (
            f"{how}, but this run does not run the whole suite (--checks/--skip): a reference is recorded "
            "only by a run of every check that then passes, so nothing was recorded and the route has no "
            "reference from this run; deploy or accept without --checks/--skip to record it"
        )
        return result(NAME, "skipped", msg, timer, raw={**base_raw, "role": "not recorded", "why": "limited suite"})
    return _record(ctx, asker, fs, gates, complete, base_raw, how, key, timer)


def _judge(asker: Asker, found: Answers, gates: ReferenceGates, complete: bool, in_force: GateFigures, origin: str,
           judged_by: dict[str, Any], pin: tuple[str, str], key: str, base_raw: dict[str, Any],
           timer: Timer) -> CheckResult:  # fmt: skip
    """Ask the recorded questions again and hold the answers to the gates in force (derived from the
    recorded replay floor, or the profile's declared tolerance when numerics changed)."""
    summary, per_fixture, problems = compare(asker, list(found.raw.get("answers") or []), gates, complete)
    problems += lp.gate_problems(
        summary,
        max_mean_kl=in_force.max_mean_kl,
        max_kl=in_force.max_kl,
        min_top1=gates.min_top1,
        max_abs_dlogprob=in_force.max_abs_dlogprob,
    )
    figures = {
        **summary.as_dict(),
        "reference_receipt": found.receipt[:16],
        "key": key[:12],
        "greedy_flips": sum(f["greedy_flips"] for f in per_fixture),
        "requests": asker.requests,
        "gate_max_abs_dlogprob": in_force.max_abs_dlogprob,
        "gate_max_kl": in_force.max_kl,
    }
    raw = {
        **base_raw,
        "role": "candidate",
        "reference_receipt": found.receipt,
        "gates_in_force": {**in_force.model_dump(mode="json"), "min_top1": gates.min_top1, "from": origin},
        "reference_floor": found.raw.get("floor"),
        **judged_by,
        "summary": summary.as_dict(),
        "spread": spread(per_fixture),
        "fixtures": per_fixture,
        "problems": problems,
    }
    passed = (
        f"within the gates of reference {pin[0]} (receipt {found.receipt[:12]}, {origin}): mean KL "
        f"{summary.mean_kl:.3g}, max KL {summary.max_kl:.3g}, top-1 {summary.top1:.4f}, max |dlogprob| "
        f"{summary.max_abs_dlogprob:.3g}"
    )
    failed = "; ".join(problems) + f" (gates from {origin})"
    return judged(NAME, problems, passed, timer, figures=figures, raw=raw, failed=failed)
