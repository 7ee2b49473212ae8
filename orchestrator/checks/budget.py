"""How long an acceptance request may take: derived from what it asks the server to do.

A fixed 1800 s per request turned a SIGSTOPped llama-server into an hour-long hang. Every
request the suite sends is bounded instead by the work the route profile implies: the largest
request is a near-full lane (`per_slot` tokens, of which `generation_fraction` are generated),
and with `parallel` lanes at once the server shares itself between them. At floor speeds (the
slowest prompt processing and generation still called working) that work takes

    parallel * (prompt_tokens / floor_pp + generated_tokens / floor_tg) + margin

seconds; a server slower than that is failing, and a stopped one fails within that bound.
Control requests (`/health`, `/props`, `/slots`) do no model work: a short fixed bound.

Pure: tested without a server (tests/unit/test_budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.profiles import RouteProfile

# Floors well under the slowest pair pairctl serves (the field report's V100 + RTX 5060 Ti pair
# runs ~1000 prompt and ~50 generated tokens/s per lane; the CPU lab ~1100 generated tokens/s).
FLOOR_PROMPT_TOKENS_PER_S = 300.0
FLOOR_GENERATED_TOKENS_PER_S = 20.0
MARGIN_S = 30.0
CONTROL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RequestBudget:
    """Timeouts for one suite run: `completion_s` for any request that runs the model,
    `control_s` for the rest. `why` says how they were derived (for the receipt)."""

    completion_s: float
    control_s: float
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"completion_s": self.completion_s, "control_s": self.control_s, "why": self.why}


def request_seconds(
    prompt_tokens: int,
    generated_tokens: int,
    *,
    lanes: int = 1,
    floor_pp: float = FLOOR_PROMPT_TOKENS_PER_S,
    floor_tg: float = FLOOR_GENERATED_TOKENS_PER_S,
    margin_s: float = MARGIN_S,
) -> float:
    """Seconds `lanes` concurrent requests of this size may take at the floor speeds."""
    if prompt_tokens < 0 or generated_tokens < 0 or lanes < 1 or floor_pp <= 0 or floor_tg <= 0:
        raise ValueError("token counts must be >= 0, lanes >= 1 and floor speeds > 0")
    return round(lanes * (prompt_tokens / floor_pp + generated_tokens / floor_tg) + margin_s, 1)


def for_profile(
    profile: RouteProfile,
    *,
    generation_fraction: float = 0.125,
    n_ctx_train: int | None = None,
    floor_pp: float = FLOOR_PROMPT_TOKENS_PER_S,
    floor_tg: float = FLOOR_GENERATED_TOKENS_PER_S,
    margin_s: float = MARGIN_S,
) -> RequestBudget:
    """The suite's budget for `profile`: its largest request (a near-full lane, all slots busy)."""
    per_slot = profile.per_slot_ctx(n_ctx_train)
    generated = max(16, int(round(per_slot * generation_fraction)))
    prompt = max(0, per_slot - generated)
    lanes = profile.parallel
    s = request_seconds(prompt, generated, lanes=lanes, floor_pp=floor_pp, floor_tg=floor_tg, margin_s=margin_s)
    why = (
        f"{lanes} lane(s) x ({prompt} prompt tokens / {floor_pp:g} tok/s + {generated} generated / "
        f"{floor_tg:g} tok/s) + {margin_s:g} s margin"
    )
    return RequestBudget(completion_s=s, control_s=CONTROL_TIMEOUT_S, why=why)


def is_transport_failure(message: str) -> bool:
    """A check that ended because the server did not answer (timeout, refused, reset): after a
    required one, the rest of the suite would only wait on the same dead server."""
    m = message.lower()
    return any(
        w in m
        for w in (
            "timed out",
            "timeout",
            "serverunreachable",
            "connection refused",
            "disconnected without",
            "connection reset",
            "readerror",
            "connecterror",
        )
    )


def suite_seconds(limits: RequestBudget, checks: int) -> float:
    """A bound on a whole suite of `checks` checks: each waits at most its largest request's
    bound (the lease's heartbeat promise during acceptance)."""
    return round(checks * limits.completion_s + MARGIN_S, 1)
