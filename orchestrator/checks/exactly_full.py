"""Exactly full: one slot filled to exactly its n_ctx, and one token over.

The near-full checks leave slack free, so a slot that truncates a few dozen tokens early passes
them. Here a prompt of n_ctx - G tokens with n_predict G must be evaluated whole and generate all
G tokens (the server flags it `truncated`: the context's end was reached, nothing is cut); a
prompt of n_ctx tokens must be refused with `exceed_context_size_error`; and G + 1 tokens after
the same prompt (reused from the slot's cache) must stop at exactly G.
"""

from __future__ import annotations

from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged, result
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.server.client import ServerRequestError

NAME = "exactly_full"
GENERATE = 16
OVER_ERROR = "exceed_context_size_error"


def full_problems(
    *,
    prompt: int,
    gen: int,
    evaluated: int,
    predicted: int,
    stop_type: str,
    over_status: int | None,
    over_type: str | None,
    over_predicted: int | None,
    draft_room: int = 0,
) -> list[str]:
    """`draft_room`: with drafting, the pinned server stops up to the draft size before the slot's
    end (measured in the lab: 14 of 16 with draft max 3); without drafting it is 0: every token."""
    p = []
    low = gen - draft_room
    if evaluated != prompt:
        p.append(f"the {prompt}-token prompt was evaluated as {evaluated} tokens")
    if not low <= predicted <= gen:
        p.append(
            f"prompt {prompt} + {gen} generated = n_ctx, but the slot generated {predicted} "
            f"(stop_type {stop_type}): it holds fewer than its reported n_ctx"
        )
    if over_status is None:
        p.append(f"a prompt of n_ctx ({prompt + gen}) tokens was accepted; the server must refuse it")
    elif over_status != 400 or over_type != OVER_ERROR:
        p.append(f"a prompt of n_ctx tokens was refused with HTTP {over_status} {over_type}, not 400 {OVER_ERROR}")
    if over_predicted is not None and not low <= over_predicted <= gen:
        p.append(
            f"asked {gen + 1} tokens after the {prompt}-token prompt, it generated {over_predicted}, "
            f"not the {gen} the slot has room for"
        )
    return p


def run(ctx: CheckContext) -> CheckResult:
    timer = Timer()
    n_ctx = ctx.per_slot()
    prompt_n = n_ctx - GENERATE
    pb = PromptBuilder(ctx.client, ctx.options.seed + 700)
    prompt = list(pb.exact(prompt_n, variant=700, head="Fill the slot:\n"))
    kw = {"id_slot": 0, "cache_prompt": False, "ignore_eos": True, "seed": 0, "timeout": ctx.options.request_timeout_s}
    try:
        full = ctx.client.completion(prompt, GENERATE, **kw)
    except ServerRequestError as exc:  # the slot is smaller than the profile says: the finding, not an error
        msg = f"prompt {len(prompt)} + {GENERATE} = n_ctx {n_ctx} was refused: {exc}"
        refused = {"n_ctx": n_ctx, "prompt": len(prompt)}
        return result(NAME, "failed", msg, timer, figures=refused, raw={"refused": exc.body[:2000]})
    beyond = ctx.client.completion(prompt, GENERATE + 1, **{**kw, "cache_prompt": True})
    over_status = over_type = None
    over_msg = ""
    try:
        ctx.client.completion(prompt + prompt[-GENERATE:], 1, **kw)
    except ServerRequestError as exc:
        over_status, over_type = exc.status, exc.error.type if exc.error else None
        over_msg = exc.error.message if exc.error else exc.body[:200]
    problems = full_problems(
        prompt=len(prompt),
        gen=GENERATE,
        evaluated=full.tokens_evaluated,
        predicted=full.tokens_predicted,
        stop_type=full.stop_type,
        over_status=over_status,
        over_type=over_type,
        over_predicted=beyond.tokens_predicted,
        draft_room=ctx.profile.draft.n_max if ctx.drafting() and ctx.profile.draft else 0,
    )
    figures = {
        "n_ctx": n_ctx,
        "prompt": len(prompt),
        "generated": full.tokens_predicted,
        "over_refused": over_type,
        "beyond_generated": beyond.tokens_predicted,
    }
    raw = {
        "full": {
            "tokens_evaluated": full.tokens_evaluated,
            "tokens_predicted": full.tokens_predicted,
            "truncated": full.truncated,
            "stop_type": full.stop_type,
        },
        "over": {"status": over_status, "type": over_type, "message": over_msg},
        "beyond": {
            "tokens_predicted": beyond.tokens_predicted,
            "stop_type": beyond.stop_type,
            "cache_n": beyond.timings.cache_n,
        },
        "problems": problems,
    }
    ok = f"slot filled to exactly {n_ctx} ({len(prompt)} + {GENERATE}); {n_ctx} prompt tokens refused ({over_type})"
    return judged(NAME, problems, ok, timer, figures=figures, raw=raw)
