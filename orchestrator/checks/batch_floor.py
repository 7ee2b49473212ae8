"""The batch-variance floor of this pair: how far a logprob moves when only the batch around a
request changes, measured on the running pair before any comparison uses it.

One prompt goes to two slots at once (twin lanes, batched together), then to one slot alone; each
twin is walked against the solo run, and the floor is the largest movement of a token both sides
list, or the margin where a twin parted. The twins' content is identical, so lane bleed cannot move
this figure: only numerics can. Comparison checks then let two runs part only at a near-tie within
`factor` times this floor (checks/parting.py). On the CPU lab the floor is 0. A floor above
`batch_variance.cap_nats` fails acceptance; a profile may declare `batch_variance.floor_nats`
instead (the receipt says which). Measured once per suite run (cached on the context).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from orchestrator.checks import logprobs as lp
from orchestrator.checks.base import CheckContext
from orchestrator.checks.parting import UNMEASURED, Tolerance, Walk, first_difference, margin_of, walk
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.server.client import ServerClient, ServerRequestError
from orchestrator.server.parsers import ParseError, parse_token_logprobs

TOP_K = 10  # logprobs read per position (n_probs) by the floor and by every parting probe
TWIN_PROMPT = 64  # tokens of each twin prompt (two fit one ubatch: their last tokens are one batch's outputs)
TWIN_GENERATE = 24  # tokens each twin generates: decode steps in one batch of two
LONG_GENERATE = 64  # tokens each long twin generates (a near-full lane's generation, at most this)
TWIN_ROUNDS = 6  # prompts measured: a drafting server reports logprobs only for tokens it did not draft
LOGPROB_FLOOR = -80.0  # as reference_gates.logprob_floor: far below, float32 rounding rules


def _body(prompt: list[int] | list[list[int]], n: int, **params: Any) -> dict[str, Any]:
    """A greedy, non-streamed `/completion` body with top-K logprobs per position."""
    return {
        "prompt": prompt,
        "n_predict": n,
        "n_probs": TOP_K,
        "temperature": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "stream": False,
        **params,
    }


def scored(
    client: ServerClient, prompt: list[int], n: int, *, timeout: float, **params: Any
) -> tuple[list[int], list[dict[int, float]]]:
    """A greedy `/completion` with top-K logprobs per position (a position the server drafted may
    come back without any: the pinned server reports none for tokens it took from a draft)."""
    body = _body(prompt, n, return_tokens=True, **params)
    return parse_token_logprobs(client.post_json("/completion", body, timeout=timeout), "/completion")


def probe(client: ServerClient, prompt: list[int], *, slot: int, cache: bool, timeout: float) -> Mapping[int, float]:
    """The next-token distribution after `prompt` (top K): one token, which the server samples
    from the prompt itself and never takes from a draft, so it always comes with logprobs."""
    _, positions = scored(client, prompt, 1, timeout=timeout, id_slot=slot, cache_prompt=cache)
    return positions[0] if positions else {}


def twin_figures(
    twin: tuple[list[int], list[dict[int, float]]], solo: tuple[list[int], list[dict[int, float]]]
) -> dict[str, Any]:
    """How far one twin moved from the solo run: the largest shared |dlogprob| over positions both
    list while their tokens agree, and the margin (in the solo run's distribution) where they part."""
    (tt, tp), (st, sp) = twin, solo
    k = first_difference(tt, st)
    upto = len(st) if k is None else k
    moved = 0.0
    compared = 0
    for i in range(min(upto + 1, len(tp), len(sp))):
        if tp[i] and sp[i]:
            d = lp.compare_position(sp[i], tp[i], floor=LOGPROB_FLOOR, complete=False)
            moved = max(moved, d.shared_max_abs_dlogprob)
            compared += 1
    parted_margin = None
    if k is not None and k < min(len(tt), len(st)) and k < len(sp) and sp[k]:
        m, at_least = margin_of(sp[k], st[k], tt[k])
        parted_margin = m if m is not None else at_least
    return {"moved": moved, "compared_positions": compared, "parted_at": k, "parted_margin": parted_margin}


def measure(ctx: CheckContext) -> Tolerance:
    """The tolerance every comparison in this suite run uses (cached on `ctx`)."""
    cached = getattr(ctx, "batch_tolerance", None)
    if isinstance(cached, Tolerance):
        return cached
    try:
        tol = _measure(ctx)
    except (ServerRequestError, ParseError) as exc:  # e.g. a slot smaller than the profile says: fail, saying so
        tol = Tolerance(
            0.0,
            "not measured: the server refused or garbled a measuring request",
            problem=f"the batch-variance floor could not be measured: {exc}",
        )
    ctx.batch_tolerance = tol
    ctx.log("batch_floor", **tol.as_dict())
    return tol


def scored_twins(
    client: ServerClient, prompt: list[int], n: int, *, timeout: float
) -> list[tuple[list[int], list[dict[int, float]]]]:
    """The same prompt twice in one request: the server posts both tasks at once, so they start in
    the same update and share every batch (their prompts' last tokens one ubatch, then each decode
    step), whatever the client's timing. No `id_slot`: each task takes a free slot."""
    body = _body([prompt, prompt], n, cache_prompt=False)
    data = client.post_json("/completion", body, timeout=timeout)
    items = data if isinstance(data, list) else [data]
    return [parse_token_logprobs(d, "/completion (twins)") for d in items]


def solo_walk(
    ctx: CheckContext,
    head: list[int],
    subject: list[int],
    solo: list[int],
    *,
    slot: int,
    tolerance: float,
    max_partings: tuple[int, str] = UNMEASURED,
) -> Walk:
    """Walk `subject` against a solo run of `head`: at each parting the solo side is probed and,
    within `tolerance`, continues from the subject's prefix on `slot` (the prompt cache keeps it
    cheap). near_full judges its lanes with it; the long twins measure with it (no tolerance)."""
    timeout = ctx.options.request_timeout_s

    def probe_at(prefix: list[int]) -> Mapping[int, float]:
        return probe(ctx.client, head + prefix, slot=slot, cache=True, timeout=timeout)

    def continue_solo(prefix: list[int], left: int) -> list[int]:
        if left <= 0:
            return []
        r = ctx.client.completion(
            head + prefix, left, id_slot=slot, cache_prompt=True, ignore_eos=True, seed=0, timeout=timeout
        )
        return list(r.tokens)

    return walk(subject, solo, probe=probe_at, reanchor=continue_solo, side="reference", tolerance=tolerance,
                max_partings=max_partings)  # fmt: skip


def _measure(ctx: CheckContext) -> Tolerance:
    bv = ctx.profile.batch_variance
    if bv.floor_nats is not None:
        declared = bv.factor * bv.floor_nats
        return Tolerance(
            min(declared, bv.cap_nats),
            f"declared in the profile (batch_variance.floor_nats {bv.floor_nats:g} x factor {bv.factor:g})",
            {"floor_nats": bv.floor_nats, "factor": bv.factor, "cap_nats": bv.cap_nats},
            None
            if declared <= bv.cap_nats
            else f"batch_variance.floor_nats {bv.floor_nats:g} x factor {bv.factor:g} is above cap_nats "
            f"{bv.cap_nats:g}: a tolerance that wide hides real differences (lower it, or raise the cap with a reason)",
        )
    if ctx.profile.parallel < 2:
        return Tolerance(
            0.0,
            "one slot: no second lane to measure against, so runs must agree exactly "
            "(declare batch_variance.floor_nats for devices that need one)",
        )
    timeout = ctx.options.request_timeout_s
    # both prompts' last tokens in one ubatch: each at most half of it
    size = max(16, min(TWIN_PROMPT, ctx.profile.ubatch_size // 2 - 1, ctx.per_slot() // 8))
    gen = min(TWIN_GENERATE, max(4, ctx.near_full() - size - 8))
    pb = PromptBuilder(ctx.client, ctx.options.seed + 400)
    t0 = time.monotonic()
    per_twin: list[dict[str, Any]] = []
    for r in range(TWIN_ROUNDS):
        prompt = list(pb.exact(size, variant=400 + r, head="Notes for the record:\n"))
        twins = scored_twins(ctx.client, prompt, gen, timeout=timeout)
        solo = scored(ctx.client, prompt, gen, timeout=timeout, cache_prompt=False)
        per_twin += [{"round": r, **twin_figures(t, solo)} for t in twins]
    # the regime the comparisons run in (a long prompt, a lane's generation: differences accumulate
    # in the KV cache); each parting of a twin from the solo run samples the margins numerics flip
    gen2 = min(LONG_GENERATE, max(16, ctx.near_full() // 8))
    size2 = max(size, min(ctx.per_slot() // 2, ctx.near_full() - gen2 - 8))
    prompt2 = list(pb.exact(size2, variant=410, head="Notes for the record:\n"))
    long_twins = scored_twins(ctx.client, prompt2, gen2, timeout=timeout)
    long_solo = scored(ctx.client, prompt2, gen2, timeout=timeout, cache_prompt=False, id_slot=0)
    long_walks = [solo_walk(ctx, prompt2, t[0], long_solo[0], slot=0, tolerance=float("inf")) for t in long_twins]
    per_twin += [{"round": "long", **twin_figures(t, long_solo)} for t in long_twins]
    parted = [p.margin if p.margin is not None else p.at_least for w in long_walks for p in w.partings]
    readings = sum(f["compared_positions"] for f in per_twin) + len(parted)
    floor = max(
        [f["moved"] for f in per_twin]
        + [f["parted_margin"] for f in per_twin if f["parted_margin"] is not None]
        + parted
    )
    figures = {
        "floor_nats": round(floor, 7),
        "factor": bv.factor,
        "cap_nats": bv.cap_nats,
        "twin_prompt": size,
        "twin_generate": gen,
        "rounds": TWIN_ROUNDS,
        "readings": readings,
        "twins": per_twin,
        "long_twin_prompt": size2,
        "long_twin_generate": gen2,
        "long_twin_partings": [round(m, 6) for m in parted],
        "long_twin_compared": sum(w.compared for w in long_walks),
        "long_twin_walks": [w.as_dict() for w in long_walks],
        "seconds": round(time.monotonic() - t0, 3),
    }
    problem = None
    if floor > bv.cap_nats:
        problem = (
            f"the same prompt in two slots at once moved a logprob {floor:.3g} nats from the same prompt alone, "
            f"above batch_variance.cap_nats {bv.cap_nats:g}: that is not numerics (lanes affect each other)"
        )
    return Tolerance(
        min(bv.factor * floor, bv.cap_nats),
        f"measured on this pair: twin lanes against solo moved {floor:.3g} nats over {readings} readings, "
        f"x factor {bv.factor:g}",
        figures,
        problem,
    )
