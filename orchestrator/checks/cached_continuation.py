"""Cached continuation: a prompt, then the prompt plus a continuation on the same slot.

The second request must report `timings.cache_n` of at least the first prompt's length minus one,
and give the greedy tokens of the same request with `cache_prompt: false` (the cache changes
nothing but speed), parting only at a near-tie within the pair's tolerance (checks/parting.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.checks import batch_floor
from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged, result
from orchestrator.checks.parting import summary, walk
from orchestrator.checks.prompts import PromptBuilder

NAME = "cached_continuation"


def continuation_problems(first_len: int, cache_n: int, walk_problem: str | None, fresh_cache_n: int) -> list[str]:
    p = []
    if cache_n < first_len - 1:
        p.append(
            f"second request reused {cache_n} cached tokens, expected at least {first_len - 1} "
            f"of the {first_len}-token prefix"
        )
    if fresh_cache_n != 0:
        p.append(f"the cache_prompt:false request still reported cache_n={fresh_cache_n}")
    if walk_problem:
        p.append(f"output with the cached prefix differs from the same request without cache: {walk_problem}")
    return p


def run(ctx: CheckContext, *, cache_second: bool = True) -> CheckResult:
    """`cache_second=False` sends the continuation with cache_prompt off: the broken case."""
    timer = Timer()
    opts = ctx.options
    slot_budget = ctx.near_full()
    first_len = max(32, int(ctx.per_slot() * opts.continuation_fraction))
    cont_len = max(16, first_len // 4)
    n_predict = 32
    if first_len + cont_len + n_predict > slot_budget:
        msg = f"per-slot context {ctx.per_slot()} too small for {first_len}+{cont_len}+{n_predict}"
        return result(NAME, "failed", msg)
    pb = PromptBuilder(ctx.client, opts.seed + 200)
    first = list(pb.exact(first_len, variant=200, head="A story begins.\n"))
    cont = list(pb.filler(cont_len, variant=201))
    slot = 1 if ctx.profile.parallel > 1 else 0
    kw: dict[str, Any] = dict(id_slot=slot, ignore_eos=True, seed=0, timeout=opts.request_timeout_s)
    r1 = ctx.client.completion(first, n_predict, cache_prompt=True, **kw)
    r2 = ctx.client.completion(first + cont, n_predict, cache_prompt=cache_second, **kw)
    r3 = ctx.client.completion(first + cont, n_predict, cache_prompt=False, **kw)
    tol = batch_floor.measure(ctx)
    head = first + cont

    def probe_at(prefix: list[int]) -> Mapping[int, float]:
        return batch_floor.probe(ctx.client, head + prefix, slot=slot, cache=False, timeout=opts.request_timeout_s)

    def continue_uncached(prefix: list[int], left: int) -> list[int]:
        return list(ctx.client.completion(head + prefix, left, cache_prompt=False, **kw).tokens) if left > 0 else []

    w = walk(list(r2.tokens), list(r3.tokens), probe=probe_at, reanchor=continue_uncached, side="reference",
             tolerance=tol.nats, max_partings=tol.parting_bound(len(r3.tokens)))  # fmt: skip
    problems = [tol.problem] if tol.problem else []
    problems += continuation_problems(first_len, r2.timings.cache_n, w.problem, r3.timings.cache_n)
    figures = {
        "first_prompt": first_len,
        "continued_prompt": first_len + cont_len,
        "cache_n": r2.timings.cache_n,
        "prompt_n": r2.timings.prompt_n,
        "same_as_uncached": list(r2.tokens) == list(r3.tokens),
        **summary([w], tol),
    }
    raw = {
        "first": {"timings": r1.timings.model_dump(), "tokens_cached": r1.tokens_cached, "id_slot": r1.id_slot},
        "continued_cached": {"timings": r2.timings.model_dump(), "tokens": list(r2.tokens), "id_slot": r2.id_slot},
        "continued_uncached": {"timings": r3.timings.model_dump(), "tokens": list(r3.tokens), "id_slot": r3.id_slot},
        "walk": w.as_dict(),
        "tolerance": tol.as_dict(),
        "problems": problems,
    }
    ok = f"continuation reused {r2.timings.cache_n} of {first_len} prefix tokens, same output as uncached"
    return judged(NAME, problems, ok, timer, figures=figures, raw=raw)
