"""Sampling honoured: non-greedy settings reach the sampler, and the seed decides the text.

Every other check is greedy, so a server that ignores temperature, top_k, top_p or the seed
would pass them all. One prompt is sent three times without the prompt cache: seed A, seed A
again, seed B. Each `generation_settings` must report the settings sent, seed A must repeat itself
and seeds A and B must differ. At temperature 100 the lab models' logit gaps shrink below one nat,
so two seeds agree on N_PREDICT tokens with a vanishing chance; more tokens would only cost (on a
drafting pair every draft is rejected at that temperature).
"""

from __future__ import annotations

from typing import Any

from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged
from orchestrator.checks.prompts import PromptBuilder

NAME = "sampling"
SETTINGS: dict[str, float | int] = {"temperature": 100.0, "top_k": 40, "top_p": 0.95, "min_p": 0.0}
# Temperature before top_p: the server's default order truncates (top_p, min_p) on the peaked raw
# distribution first, which leaves one token whatever the temperature.
SAMPLERS = ["top_k", "temperature", "top_p"]
SEEDS = (1234, 98765)
N_PREDICT = 16
PROMPT_TOKENS = 24


def settings_problems(sent: dict[str, Any], reported: dict[str, Any], label: str) -> list[str]:
    """Fields of `sent` that the response's generation_settings does not report back as sent."""
    out = []
    for key, want in sent.items():
        got = reported.get(key)
        ok = isinstance(got, (int, float)) and abs(float(got) - float(want)) <= 1e-6 * max(1.0, abs(float(want)))
        if not ok:
            out.append(f"{label}: generation_settings.{key} is {got!r}, sent {want!r}")
    if "samplers" in reported and reported["samplers"] != SAMPLERS:
        out.append(f"{label}: generation_settings.samplers is {reported['samplers']!r}, sent {SAMPLERS!r}")
    return out


def sampling_problems(a1: list[int], a2: list[int], b: list[int]) -> list[str]:
    out = []
    if a1 != a2:
        out.append(f"the same seed gave different tokens twice ({len(a1)} and {len(a2)} tokens)")
    if a1 == b:
        out.append(
            f"seeds {SEEDS[0]} and {SEEDS[1]} gave the same {len(b)} tokens at temperature "
            f"{SETTINGS['temperature']}: the sampler ignores the settings or the seed"
        )
    if not a1:
        out.append("no tokens were generated")
    return out


def run(ctx: CheckContext) -> CheckResult:
    timer = Timer()
    opts = ctx.options
    prompt = list(PromptBuilder(ctx.client, opts.seed + 700).exact(PROMPT_TOKENS, variant=700, head="Once "))
    kw: dict[str, Any] = dict(
        SETTINGS, samplers=SAMPLERS, ignore_eos=True, cache_prompt=False, timeout=opts.request_timeout_s, id_slot=0
    )  # fmt: skip
    answers: list[dict[str, Any]] = []
    tokens: list[list[int]] = []
    problems: list[str] = []
    for label, seed in (("seed A", SEEDS[0]), ("seed A again", SEEDS[0]), ("seed B", SEEDS[1])):
        body = ctx.client.completion_raw(prompt, N_PREDICT, seed=seed, **kw)
        reported = body.get("generation_settings") or {}
        problems += settings_problems({**SETTINGS, "seed": seed}, reported, label)
        tokens.append([int(t) for t in body.get("tokens") or []])
        answers.append({"seed": seed, "tokens": tokens[-1], "reported": reported})
    a1, a2, b = tokens
    problems += sampling_problems(a1, a2, b)
    differ = sum(x != y for x, y in zip(a1, b, strict=False))
    return judged(
        NAME,
        problems,
        f"settings reported back; seed {SEEDS[0]} repeated its {len(a1)} tokens, seed {SEEDS[1]} differed at "
        f"{differ} positions",
        timer,
        figures={"tokens": len(a1), "positions_differing": differ, **SETTINGS},
        raw={"settings": SETTINGS, "answers": answers, "problems": problems},
    )
