"""Long-prefix cache reuse: a long prompt, then a request sharing most of it, on the same slot.

Reports reused / new / generated tokens. Functional coverage, not a speed claim: it passes when the
shared part was reused (at least its length minus one), the rest was evaluated, and generation
completed. The first request only fills the slot, so it generates one token.
"""

from __future__ import annotations

from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged
from orchestrator.checks.prompts import PromptBuilder

NAME = "long_prefix_cache"


def reuse_problems(
    prompt_len: int, shared: int, reused: int, new: int, generated: int, n_predict: int, truncated: bool
) -> list[str]:
    p = []
    if reused < shared - 1:
        p.append(f"reused {reused} tokens of a {shared}-token shared prefix")
    if reused + new != prompt_len:
        p.append(f"reused {reused} + new {new} != prompt {prompt_len}")
    if generated != n_predict:
        p.append(f"generated {generated}, asked for {n_predict}")
    if truncated:
        p.append("truncated")
    return p


def run(ctx: CheckContext, *, cache_second: bool = True) -> CheckResult:
    """`cache_second=False` sends the second request with cache_prompt off: the broken case."""
    timer = Timer()
    opts = ctx.options
    n_predict = min(opts.long_prefix_generate, max(16, ctx.near_full() // 16))
    prompt_len = int((ctx.near_full() - n_predict) * opts.long_prefix_fraction)
    shared = int(prompt_len * opts.long_prefix_shared)
    pb = PromptBuilder(ctx.client, opts.seed + 300)
    prefix = list(pb.exact(shared, variant=300, head="Reference document:\n"))
    first = prefix + list(pb.filler(prompt_len - shared, variant=301))
    second = prefix + list(pb.filler(prompt_len - shared, variant=302))
    if first == second:
        raise AssertionError("the two long-prefix prompts must differ after the shared part")
    slot = 0
    kw = dict(id_slot=slot, ignore_eos=True, seed=0, timeout=opts.request_timeout_s)
    r1 = ctx.client.completion(first, 1, cache_prompt=True, **kw)
    r2 = ctx.client.completion(second, n_predict, cache_prompt=cache_second, **kw)
    reused, new, generated = r2.timings.cache_n, r2.timings.prompt_n, r2.tokens_predicted
    problems = reuse_problems(prompt_len, shared, reused, new, generated, n_predict, r2.truncated)
    figures = {"prompt": prompt_len, "shared": shared, "reused": reused, "new": new, "generated": generated}
    raw = {
        "first": {"timings": r1.timings.model_dump(), "id_slot": r1.id_slot},
        "second": {
            "timings": r2.timings.model_dump(),
            "id_slot": r2.id_slot,
            "truncated": r2.truncated,
            "stop_type": r2.stop_type,
        },
        "problems": problems,
    }
    ok = f"{prompt_len}-token prompt: reused {reused}, new {new}, generated {generated}"
    return judged(NAME, problems, ok, timer, figures=figures, raw=raw)
