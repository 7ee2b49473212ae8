"""Near-full slots: two lanes at once, and one lane alone, filled to per-slot capacity minus slack.

Two lanes: both slots generate at once, each with its own nonce, prompt + generation reaching
`profile.near_full_tokens()`. Passes only if both complete untruncated with the planned token
counts, on two distinct slots `/slots` showed generating together, each lane isolated from the
other: in `recall` mode the answer holds its own nonce and not the other's; in `solo` mode each
lane's greedy tokens follow the same request run alone, parting only at near-ties (parting.py).
The population reached is reported against capacity.

One lane: a near-full lane alone on slot 0 must complete cleanly. In `solo` mode two_lane's
reference run of lane 0 is that very request, so within one suite one_lane judges it instead of
sending it again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from orchestrator.checks import batch_floor
from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged, lane_split, result
from orchestrator.checks.parting import Tolerance, Walk, summary
from orchestrator.checks.prompts import BuiltPrompt, PromptBuilder, make_nonce
from orchestrator.server.client import ServerClient, ServerRequestError
from orchestrator.server.models import CompletionResult

TWO_LANE = "two_lane_near_full"
ONE_LANE = "one_lane_near_full"


class LaneOutcome(BaseModel):
    """One lane as written into the receipt."""

    lane: int
    id_slot: int | None = None
    prompt_tokens: int
    n_predict: int
    nonce: str | None = None
    tokens_evaluated: int | None = None
    tokens_predicted: int | None = None
    truncated: bool | None = None
    stop_type: str | None = None
    content: str | None = None
    output_tokens: list[int] = []
    started_s: float = 0.0
    finished_s: float = 0.0
    predicted_per_second: float | None = None
    error: str | None = None

    @property
    def population(self) -> int:
        return (self.tokens_evaluated or 0) + (self.tokens_predicted or 0)


def lane_problems(lane: LaneOutcome) -> list[str]:
    """Clean completion: no error, no truncation, exactly the planned prompt and generation."""
    tag = f"lane {lane.lane}"
    if lane.error:
        return [f"{tag}: request failed: {lane.error}"]
    p = []
    if lane.truncated:
        p.append(f"{tag}: truncated")
    if lane.tokens_evaluated != lane.prompt_tokens:
        p.append(f"{tag}: server evaluated {lane.tokens_evaluated} prompt tokens, sent {lane.prompt_tokens}")
    if lane.tokens_predicted != lane.n_predict:
        p.append(
            f"{tag}: generated {lane.tokens_predicted} tokens, asked for {lane.n_predict} (stop_type {lane.stop_type})"
        )
    if lane.stop_type not in ("limit", None) and lane.tokens_predicted != lane.n_predict:
        p.append(f"{tag}: stopped by {lane.stop_type}")
    return p


def isolation_problems_recall(lanes: list[LaneOutcome]) -> list[str]:
    """Each answer names its own nonce and none of the others'."""
    texts = [lane.content or "" for lane in lanes]
    return _nonce_problems(lanes, texts, "answer does not contain its own nonce {}", "answer contains")


def _nonce_problems(lanes: list[LaneOutcome], texts: list[str], missing: str, carries: str) -> list[str]:
    """Each lane's text holds its own nonce (else `missing`, formatted with it) and no other lane's."""
    p = []
    for lane, text in zip(lanes, texts, strict=True):
        if lane.nonce and lane.nonce not in text:
            p.append(f"lane {lane.lane}: " + missing.format(lane.nonce))
        for other in lanes:
            if other is not lane and other.nonce and other.nonce in text:
                p.append(f"lane {lane.lane}: {carries} lane {other.lane}'s nonce {other.nonce}")
    return p


def isolation_problems_solo(lanes: list[LaneOutcome], solo: list[LaneOutcome], walks: list[Walk | None]) -> list[str]:
    """Each lane's greedy tokens follow the same request run alone, but for near-ties within the
    pair's batch-variance tolerance (`walks`: one per lane, checks/parting.py; None: not walked)."""
    p = []
    for lane, ref, w in zip(lanes, solo, walks, strict=True):
        if ref.error:
            p.append(f"lane {lane.lane}: solo reference failed: {ref.error}")
        elif w is not None and w.problem:
            p.append(f"lane {lane.lane}: output differs from the same request run alone: {w.problem}")
    return p


def solo_walk(ctx: CheckContext, lane: LaneOutcome, ref: LaneOutcome, prompt: BuiltPrompt, tol: Tolerance) -> Walk:
    """Walk a lane against its solo run; at a near-tie the solo side continues from the lane's
    prefix on the lane's slot."""
    return batch_floor.solo_walk(
        ctx,
        list(prompt.tokens),
        lane.output_tokens,
        ref.output_tokens,
        slot=lane.lane,
        tolerance=tol.nats,
        max_partings=tol.parting_bound(len(ref.output_tokens)),
    )


def _walks(
    ctx: CheckContext, lanes: list[LaneOutcome], solo: list[LaneOutcome], prompts: list[BuiltPrompt], tol: Tolerance
) -> list[Walk | None]:
    """Each lane walked against its solo run (None where either side failed)."""
    return [
        solo_walk(ctx, lane, ref, prompts[i], tol) if not (lane.error or ref.error) else None
        for i, (lane, ref) in enumerate(zip(lanes, solo, strict=True))
    ]


def prompt_hygiene_problems(lanes: list[LaneOutcome], prompt_texts: list[str]) -> list[str]:
    """Each lane's prompt carries its own nonce and no other lane's (else isolation proves nothing)."""
    return _nonce_problems(lanes, prompt_texts, "prompt does not carry its own nonce", "prompt carries")


def overlap_problems(lanes: list[LaneOutcome], both_generating_seen: bool) -> list[str]:
    """Both lanes on distinct slots, and seen generating at once by the server itself (`/slots`):
    overlapping client requests alone prove nothing (a server may serve them one after the other)."""
    p = []
    slots = [lane.id_slot for lane in lanes]
    if len(set(slots)) != len(slots):
        p.append(f"lanes ran on slots {slots}, not on distinct slots")
    if len(lanes) == 2:
        a, b = lanes
        if not (a.started_s < b.finished_s and b.started_s < a.finished_s):
            p.append("the two lanes did not run at the same time")
        elif not both_generating_seen:
            p.append("the two lanes did not run at the same time: /slots never showed both slots generating")
    return p


def _outcome(
    lane: int, prompt: BuiltPrompt, n_predict: int, t0: float, run: Callable[[], CompletionResult]
) -> LaneOutcome:
    started = time.monotonic() - t0
    planned = LaneOutcome(lane=lane, prompt_tokens=len(prompt), n_predict=n_predict, nonce=prompt.nonce)
    try:
        r = run()
    except ServerRequestError as exc:
        return planned.model_copy(update={"started_s": started, "finished_s": time.monotonic() - t0, "error": str(exc)})
    return planned.model_copy(
        update=dict(
            id_slot=r.id_slot,
            tokens_evaluated=r.tokens_evaluated,
            tokens_predicted=r.tokens_predicted,
            truncated=r.truncated,
            stop_type=r.stop_type,
            content=r.content,
            output_tokens=list(r.tokens),
            predicted_per_second=r.timings.predicted_per_second,
            started_s=round(started, 4),
            finished_s=round(time.monotonic() - t0, 4),
        )
    )


def _request(
    client: ServerClient, prompt: BuiltPrompt, n_predict: int, slot: int, timeout: float
) -> Callable[[], CompletionResult]:
    # cold lanes: no cache reuse, so the whole prompt is evaluated in this request
    return lambda: client.completion(
        list(prompt.tokens), n_predict, id_slot=slot, cache_prompt=False, ignore_eos=True, seed=0, timeout=timeout
    )


@dataclass
class SlotsPeak:
    """What a `/slots` poller saw while lanes ran."""

    samples: int = 0
    peak_population: int = 0
    both_processing_seen: bool = False
    peak_processing: int = 0
    errors: int = 0


def _poll_slots(client: ServerClient, stop: threading.Event, interval: float, out: SlotsPeak) -> None:
    while not stop.is_set():
        try:
            slots = client.slots(timeout=10.0)
        except Exception:
            out.errors += 1
        else:
            out.samples += 1
            busy = [s for s in slots if s.is_processing]
            out.peak_processing = max(out.peak_processing, len(busy))
            if len(busy) >= 2 and all((s.n_decoded or 0) > 0 for s in busy):
                out.both_processing_seen = True
            out.peak_population = max(out.peak_population, sum(s.population for s in busy))
        stop.wait(interval)


def run_two_lane(ctx: CheckContext, *, leak_other_nonce: bool = False) -> CheckResult:
    """`leak_other_nonce` puts lane 1's nonce into lane 0's prompt: the broken case its test runs."""
    opts = ctx.options
    timer = Timer()
    per_slot, target = ctx.per_slot(), ctx.near_full()
    if ctx.profile.parallel < 2:
        return result(TWO_LANE, "skipped", "the profile has one slot")
    prompt_n, gen_n = lane_split(target, opts.generation_fraction)
    rng = random.Random()  # nonces are fresh every run
    nonces = [make_nonce(rng), make_nonce(rng)]
    pb = PromptBuilder(ctx.client, opts.seed)
    prompts = [pb.with_nonce(prompt_n, nonces[i], variant=i) for i in range(2)]
    if leak_other_nonce:
        leaked = pb.with_nonce(prompt_n, nonces[0] + " and " + nonces[1], variant=0)
        prompts[0] = BuiltPrompt(tokens=leaked.tokens, nonce=nonces[0])
    prompt_texts = [ctx.client.detokenize(list(p.tokens)) for p in prompts]

    lanes, peak, problems = _both_lanes_judged(ctx, prompts, gen_n, prompt_texts)
    solo: list[LaneOutcome] = []
    walks: list[Walk | None] = []
    tol: Tolerance | None = None
    first_run: dict[str, Any] | None = None
    if opts.isolation == "solo":
        solo, walks, tol = _solo_lanes(ctx, lanes, prompts, gen_n, problems)
        if _numerics_only(problems, walks, tol):
            first_run = {"problems": problems, "walks": [w.as_dict() if w is not None else None for w in walks]}
            lanes, peak, walks, problems = _rerun(ctx, prompts, gen_n, solo, tol, prompt_texts)
    else:
        problems += isolation_problems_recall(lanes)

    population = sum(lane.population for lane in lanes)
    capacity = per_slot * 2
    figures = {
        "per_slot_ctx": per_slot,
        "lane_target": target,
        "lane_prompt": prompt_n,
        "lane_generate": gen_n,
        "population": population,
        "capacity": capacity,
        "population_vs_capacity": f"{population}/{capacity}",
        "slots_peak_population": peak.peak_population,
        "both_generating_seen": peak.both_processing_seen,
        "isolation": opts.isolation,
    }
    if tol is not None:
        figures.update(summary([w for w in walks if w is not None], tol))
    if first_run is not None:
        figures["rerun_after"] = first_run["problems"][0]
    raw: dict[str, Any] = {
        "lanes": [lane.model_dump() for lane in lanes],
        "solo": [s.model_dump() for s in solo],
        "slots_poll": peak.__dict__,
        "walks": [w.as_dict() if w is not None else None for w in walks],
        "tolerance": tol.as_dict() if tol is not None else None,
        "problems": problems,
        "first_run": first_run,
    }
    ok = f"two lanes reached {population}/{capacity} tokens, isolated ({opts.isolation})"
    if first_run:
        ok += f"; a first run parted beyond the tolerance, a second did not ({figures['rerun_after']})"
    return judged(TWO_LANE, problems, ok, timer, figures=figures, raw=raw)


def _numerics_only(problems: list[str], walks: list[Walk | None], tol: Tolerance | None) -> bool:
    """A first run that failed only by a lane parting from its solo run, on a pair whose lanes move
    with the batch (floor above 0): which batches two separate requests share depends on timing, so
    margins vary run to run, while a lane taking the other's data parts again in a second run. A
    floor of 0 (the CPU lab) must agree exactly, first time."""
    walked = [w for w in walks if w is not None]
    failed = [w for w in walked if w.problem]
    return bool(failed) and tol is not None and tol.nats > 0 and not tol.problem and len(problems) == len(failed)


def _rerun(
    ctx: CheckContext,
    prompts: list[BuiltPrompt],
    gen_n: int,
    solo: list[LaneOutcome],
    tol: Tolerance,
    prompt_texts: list[str],
) -> tuple[list[LaneOutcome], SlotsPeak, list[Walk | None], list[str]]:
    """Both lanes once more, judged whole against the same solo runs: the verdict is this run's."""
    lanes, peak, problems = _both_lanes_judged(ctx, prompts, gen_n, prompt_texts)
    walks = _walks(ctx, lanes, solo, prompts, tol)
    problems += [f"again in a second run: {p}" for p in isolation_problems_solo(lanes, solo, walks)]
    return lanes, peak, walks, problems


def _both_lanes_judged(
    ctx: CheckContext, prompts: list[BuiltPrompt], gen_n: int, prompt_texts: list[str]
) -> tuple[list[LaneOutcome], SlotsPeak, list[str]]:
    """Both lanes at once, with what each lane and their overlap show on their own."""
    lanes, peak = _both_lanes(ctx, prompts, gen_n)
    problems = prompt_hygiene_problems(lanes, prompt_texts)
    for lane in lanes:
        problems += lane_problems(lane)
    return lanes, peak, problems + overlap_problems(lanes, peak.both_processing_seen)


def _both_lanes(ctx: CheckContext, prompts: list[BuiltPrompt], gen_n: int) -> tuple[list[LaneOutcome], SlotsPeak]:
    """Both lanes at once, with /slots polled meanwhile: the peak shows whether the two really
    generated together, which is what makes the isolation judged afterwards mean anything."""
    t0 = time.monotonic()
    stop, peak = threading.Event(), SlotsPeak()
    poller = threading.Thread(
        target=_poll_slots, args=(ctx.client, stop, ctx.options.slots_poll_interval_s, peak), daemon=True
    )
    poller.start()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futs = [
                pool.submit(
                    _outcome,
                    i,
                    prompts[i],
                    gen_n,
                    t0,
                    _request(ctx.client, prompts[i], gen_n, i, ctx.options.request_timeout_s),
                )
                for i in range(2)
            ]
            return [f.result() for f in futs], peak
    finally:
        stop.set()
        poller.join(timeout=15)


def _solo_lanes(
    ctx: CheckContext, lanes: list[LaneOutcome], prompts: list[BuiltPrompt], gen_n: int, problems: list[str]
) -> tuple[list[LaneOutcome], list[Walk | None], Tolerance]:
    """Each lane's request again alone: greedy output beside another lane must equal it, within the
    batch floor measured on this pair (a difference beyond it is one lane's data leaking)."""
    solo = [
        _outcome(
            i,
            prompts[i],
            gen_n,
            time.monotonic(),
            _request(ctx.client, prompts[i], gen_n, i, ctx.options.request_timeout_s),
        )
        for i in range(2)
    ]
    ctx.solo_near_full = solo[0]  # one_lane_near_full's request, already sent: it judges this run
    tol = batch_floor.measure(ctx)
    if tol.problem:
        problems.append(tol.problem)
    walks = _walks(ctx, lanes, solo, prompts, tol)
    problems += isolation_problems_solo(lanes, solo, walks)
    return solo, walks, tol


def solo_run(ctx: CheckContext, prompt_n: int, gen_n: int) -> LaneOutcome | None:
    """two_lane_near_full's solo run of lane 0 in this suite when it is one_lane_near_full's own
    request: one lane of `prompt_n` + `gen_n` tokens alone on slot 0, cold, greedy. Sending it
    again would prove nothing new."""
    lane = ctx.solo_near_full
    if isinstance(lane, LaneOutcome) and (lane.lane, lane.prompt_tokens, lane.n_predict) == (0, prompt_n, gen_n):
        return lane
    return None


def run_one_lane(ctx: CheckContext) -> CheckResult:
    opts = ctx.options
    timer = Timer()
    per_slot, target = ctx.per_slot(), ctx.near_full()
    prompt_n, gen_n = lane_split(target, opts.generation_fraction)
    lane = solo_run(ctx, prompt_n, gen_n)
    source = "two_lane_near_full's solo run of lane 0" if lane is not None else "its own request"
    if lane is None:
        pb = PromptBuilder(ctx.client, opts.seed)
        prompt = pb.with_nonce(prompt_n, make_nonce(random.Random()), variant=7)
        req = _request(ctx.client, prompt, gen_n, 0, opts.request_timeout_s)
        lane = _outcome(0, prompt, gen_n, time.monotonic(), req)
    problems = lane_problems(lane)
    figures = {
        "per_slot_ctx": per_slot,
        "prompt": prompt_n,
        "generate": gen_n,
        "population": lane.population,
        "population_vs_capacity": f"{lane.population}/{per_slot}",
        "slack": per_slot - lane.population,
        "tg_tokens_per_s": round(lane.predicted_per_second, 2) if lane.predicted_per_second else None,
        "run": source,
    }
    ok = f"one lane reached {lane.population}/{per_slot} tokens cleanly ({source})"
    raw = {"lane": lane.model_dump(), "run": source, "problems": problems}
    return judged(ONE_LANE, problems, ok, timer, figures=figures, raw=raw)
