"""Speculative / MTP drafting: greedy output identical to the same requests with drafting off.

Per-request `speculative.*` is compiled out of the pinned server, but it never drafts for a request
with one token left (`get_n_draft_max` caps a draft at `n_remaining - 1`). So the draft-free
reference is made on the same server two tokens a request, each step checked to report no drafting.
The drafted requests must give those tokens, parting only at near-ties (checks/parting.py); draft
counts come from `timings`. The profile's `draft.expect` names the verification paths that must run
(accepted, rejected or both).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.checks import batch_floor
from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged, result
from orchestrator.checks.parting import Tolerance, Walk, summary, walk
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.hashing import sha256_json
from orchestrator.server.client import ServerClient

NAME = "speculative"
N_PROMPTS = 3


def build_prompts(ctx: CheckContext) -> list[list[int]]:
    pb = PromptBuilder(ctx.client, ctx.options.seed + 100)
    size = max(32, min(512, ctx.per_slot() // 8))
    return [list(pb.exact(size - 16 * i, variant=100 + i, head="Continue the list:\n")) for i in range(N_PROMPTS)]


def compare(walks: list[Walk]) -> list[str]:
    """Each prompt's drafted output follows the draft-free reference but for near-ties within the
    pair's batch-variance tolerance (a verification batch runs other kernels than one token)."""
    return [
        f"prompt {i}: drafted output differs from the draft-free reference: {w.problem}"
        for i, w in enumerate(walks)
        if w.problem
    ]


def parted_note(walks: list[Walk], tol: Tolerance) -> str:
    n = sum(len(w.partings) for w in walks)
    if not n:
        return ""
    widest = max((w.max_margin for w in walks if w.max_margin is not None), default=0.0)
    return f" (parted {n} time(s) at near-ties, widest margin {widest:.3g} <= tolerance {tol.nats:.3g} nats)"


def expected_paths(ctx: CheckContext) -> list[str]:
    draft = ctx.profile.draft
    return list(draft.expect) if draft is not None else []


def path_problems(expect: list[str], draft_n: int, accepted: int) -> list[str]:
    """Both verification paths run only if some drafts are accepted and some rejected; the
    profile's `draft.expect` says which the draft it serves must show."""
    p = []
    if "accepted" in expect and accepted <= 0:
        p.append(f"no drafted token was accepted ({draft_n} drafted); the profile expects accepted drafts")
    if "rejected" in expect and draft_n - accepted <= 0:
        p.append(f"every drafted token was accepted ({accepted}/{draft_n}); the profile expects rejected drafts")
    return p


class StepMismatch(Exception):
    """A draft-free step came back with another number of tokens than asked: the server broke n_predict."""


STEP_TOKENS = 2  # a step's tokens the server cannot draft: the first from the prompt, then one left


def stepwise_reference(
    client: ServerClient, prompt: list[int], n: int, *, slot: int, timeout: float
) -> tuple[list[int], int]:
    """Greedy tokens STEP_TOKENS a request (the server cannot draft the first token after a
    prompt, nor with one token left). Returns (tokens, drafted tokens reported by those steps:
    must be 0)."""
    out: list[int] = []
    drafted = 0
    while len(out) < n:
        want = min(STEP_TOKENS, n - len(out))
        r = client.completion(
            prompt + out, want, id_slot=slot, cache_prompt=True, ignore_eos=True, seed=0, timeout=timeout
        )
        if len(r.tokens) != want:
            raise StepMismatch(f"the server returned {len(r.tokens)} tokens for a {want}-token request (n_predict)")
        drafted += r.timings.draft_n or 0
        out += list(r.tokens)
    return out, drafted


def drafted_walk(
    ctx: CheckContext, prompt: list[int], drafted: list[int], reference: list[int], params: dict[str, Any],
    tol: Tolerance,
) -> Walk:  # fmt: skip
    """Walk the drafted output against the draft-free reference. The margin at a parting comes from
    a one-token probe (never drafted, scored as the reference was); within the tolerance the drafted
    side continues from the reference's prefix with the drafted requests' own fields."""
    timeout = ctx.options.request_timeout_s

    def probe_at(prefix: list[int]) -> Mapping[int, float]:
        return batch_floor.probe(ctx.client, prompt + prefix, slot=0, cache=True, timeout=timeout)

    def continue_drafted(prefix: list[int], left: int) -> list[int]:
        if left <= 0:
            return []
        return list(ctx.client.completion(prompt + prefix, left, timeout=timeout, **params).tokens)

    return walk(drafted, reference, probe=probe_at, reanchor=continue_drafted, side="subject", tolerance=tol.nats,
                max_partings=tol.parting_bound(len(reference)))  # fmt: skip


def run(ctx: CheckContext, *, drafted_params: dict[str, Any] | None = None) -> CheckResult:
    """`drafted_params` adds request fields to the drafted requests only (the broken case sends a
    temperature, so drafting's rejection sampling changes the output)."""
    timer = Timer()
    prompts = build_prompts(ctx)
    n_predict = ctx.options.speculative_n_predict
    timeout = ctx.options.request_timeout_s
    params = {"id_slot": 0, "cache_prompt": False, "ignore_eos": True, "seed": 0, **(drafted_params or {})}
    results = [ctx.client.completion(p, n_predict, timeout=timeout, **params) for p in prompts]
    outputs = [list(r.tokens) for r in results]
    reference, ref_drafted = [], 0
    for p in prompts:
        try:
            toks, d = stepwise_reference(ctx.client, p, n_predict, slot=0, timeout=timeout)
        except StepMismatch as exc:
            return result(NAME, "failed", str(exc), timer)
        reference.append(toks)
        ref_drafted += d
    draft_n = sum(r.timings.draft_n or 0 for r in results)
    accepted = sum(r.timings.draft_n_accepted or 0 for r in results)
    tol = batch_floor.measure(ctx)
    walks = [
        drafted_walk(ctx, p, out, ref, params, tol) for p, out, ref in zip(prompts, outputs, reference, strict=True)
    ]
    problems = [tol.problem] if tol.problem else []
    problems += compare(walks)
    if ref_drafted:
        problems.append(f"the reference steps drafted {ref_drafted} tokens: the reference is not draft-free")
    if ctx.drafting() and draft_n == 0:
        problems.append("drafting is configured but no token was drafted (timings have no draft_n)")
    if ctx.drafting() and draft_n:
        problems += path_problems(expected_paths(ctx), draft_n, accepted)
    if not ctx.drafting() and draft_n:
        problems.append(f"drafting is off in the profile but the server drafted {draft_n} tokens")
    figures: dict[str, Any] = {
        "drafting": ctx.drafting(),
        "draft_n": draft_n,
        "draft_n_accepted": accepted,
        "draft_rejected": draft_n - accepted,
        "acceptance": round(accepted / draft_n, 4) if draft_n else None,
        "expect": expected_paths(ctx),
        "same_as_reference": outputs == reference,
        **summary(walks, tol),
    }
    raw = {
        "prompts_sha256": sha256_json(prompts),
        "n_predict": n_predict,
        "profile": ctx.profile.name,
        "drafted_params": drafted_params or {},
        "timings": [r.timings.model_dump() for r in results],
        "outputs": outputs,
        "reference_outputs": reference,
        "walks": [w.as_dict() for w in walks],
        "tolerance": tol.as_dict(),
        "problems": problems,
    }
    ok = (
        f"drafted output follows the draft-free reference{parted_note(walks, tol)}; "
        f"{accepted}/{draft_n} drafted tokens accepted"
        if ctx.drafting()
        else f"drafting off: output follows the stepwise reference{parted_note(walks, tol)}"
    )
    return judged(NAME, problems, ok, timer, figures=figures, raw=raw)
