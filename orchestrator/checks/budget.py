"""How long an acceptance request may take: derived from the speed measured on this pair.

Constants tuned to the lab's 0.5 MB toy model failed a healthy pair serving a real model (a 2-core
machine processes ~7 prompt tokens/s over RPC under load, and the old floor was 300). So a request
is judged two ways, neither a fixed number:

- **Progress.** While a model request runs, `/slots` must show progress (a slot's prompt tokens
  processed or tokens decoded change) within `stall_s`. llama-server answers `/slots` between
  batches, so the longest honest gap is one batch, and a busy machine may make it
  `slowdown_allowance` times longer than measured: `stall_s = clamp(STALL_BATCHES *
  slowdown_allowance * batch_size / measured prompt speed, STALL_MIN_S, STALL_MAX_S)`. (Without the
  allowance a healthy real-model pair failed `make demo` while six test runs loaded the machine: one
  256-token batch took longer than 3 x its measured time.) A hung or SIGSTOPped server fails within
  that ("stopped making progress for N s"), whatever the request's size, and always within 2 minutes.
- **Total.** A short cold probe at the start of acceptance measures this pair's prompt and
  generation speed (`timings`), and the largest request (a near-full lane, all slots busy) may
  take `slowdown_allowance` times its work at those speeds, plus a margin. A request that keeps
  progressing past that is "slower than measured", not "unreachable".
- **Floors.** A pair slower than the profile's declared floors (`speed:` in the profile; defaults
  below) fails at the probe: "slower than the profile's floor (measured X tok/s, floor Y)".

`for_profile` is the *planning* figure before anything is measured (lease TTLs, whose heartbeat
renews them while the suite runs); it never fails a request. Pure except `measure` (one request).
Tested without a server in tests/unit/test_budget.py, on the lab in tests/e2e/test_real_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.profiles import RouteProfile, SpeedFloors
from orchestrator.server.client import ProgressWatch, ServerClient

# Planning speeds (the field report's pair runs ~1000 prompt and ~50 generated tokens/s per lane):
# only for bounds needed before the pair is measured (lease TTLs, renewed by heartbeats).
FLOOR_PROMPT_TOKENS_PER_S = 300.0
FLOOR_GENERATED_TOKENS_PER_S = 20.0
MARGIN_S = 30.0
CONTROL_TIMEOUT_S = 30.0
# Progress: the shortest and longest stall bounds (a stopped server fails within 2 minutes), and how
# many batches' worth of silence is still honest at the slowest speed the allowance admits.
STALL_MIN_S = 30.0
STALL_MAX_S = 100.0
STALL_BATCHES = 3.0
POLL_S = 1.0
# The speed probe: a cold prompt of PROBE_PROMPT tokens (at most a quarter of a slot), PROBE_GENERATE
# generated; both small enough to take seconds at the default floors' speed on the slowest lab.
PROBE_PROMPT = 128
PROBE_GENERATE = 32


@dataclass(frozen=True)
class RequestBudget:
    """Timeouts for one suite run: `completion_s` for any request that runs the model,
    `control_s` for the rest, `stall_s` without progress. `why` says how they were derived."""

    completion_s: float
    control_s: float
    why: str
    stall_s: float = STALL_MIN_S
    speeds: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "completion_s": self.completion_s,
            "control_s": self.control_s,
            "stall_s": self.stall_s,
            "why": self.why,
            "speeds": dict(self.speeds),
        }

    def watch(self) -> ProgressWatch:
        return ProgressWatch(stall_s=self.stall_s, poll_s=POLL_S, why=self.speeds.get("stall_why", ""))


@dataclass(frozen=True)
class Speeds:
    """Tokens per second on this pair, and where the figures come from."""

    prompt_per_s: float
    generated_per_s: float
    source: str


class TooSlow(ValueError):
    """The pair is slower than its profile's floor (a failed check, not an unreachable server)."""


def request_seconds(
    prompt_tokens: int,
    generated_tokens: int,
    *,
    lanes: int = 1,
    floor_pp: float = FLOOR_PROMPT_TOKENS_PER_S,
    floor_tg: float = FLOOR_GENERATED_TOKENS_PER_S,
    margin_s: float = MARGIN_S,
) -> float:
    """Seconds `lanes` concurrent requests of this size take at these speeds, plus the margin."""
    if prompt_tokens < 0 or generated_tokens < 0 or lanes < 1 or floor_pp <= 0 or floor_tg <= 0:
        raise ValueError("token counts must be >= 0, lanes >= 1 and floor speeds > 0")
    return round(lanes * (prompt_tokens / floor_pp + generated_tokens / floor_tg) + margin_s, 1)


def _largest_request(profile: RouteProfile, generation_fraction: float, n_ctx_train: int | None) -> tuple[int, int]:
    per_slot = profile.per_slot_ctx(n_ctx_train)
    generated = max(16, int(round(per_slot * generation_fraction)))
    return max(0, per_slot - generated), generated


def for_profile(
    profile: RouteProfile,
    *,
    generation_fraction: float = 0.125,
    n_ctx_train: int | None = None,
    floor_pp: float = FLOOR_PROMPT_TOKENS_PER_S,
    floor_tg: float = FLOOR_GENERATED_TOKENS_PER_S,
    margin_s: float = MARGIN_S,
) -> RequestBudget:
    """The planning budget for `profile` at planning speeds (before anything is measured)."""
    prompt, generated = _largest_request(profile, generation_fraction, n_ctx_train)
    lanes = profile.parallel
    s = request_seconds(prompt, generated, lanes=lanes, floor_pp=floor_pp, floor_tg=floor_tg, margin_s=margin_s)
    why = (
        f"{lanes} lane(s) x ({prompt} prompt tokens / {floor_pp:g} tok/s + {generated} generated / "
        f"{floor_tg:g} tok/s) + {margin_s:g} s margin"
    )
    return RequestBudget(completion_s=s, control_s=CONTROL_TIMEOUT_S, why=why)


def stall_seconds(profile: RouteProfile, prompt_per_s: float) -> tuple[float, str]:
    """The longest honest silence in `/slots`: STALL_BATCHES batches of prompt at this speed slowed
    by the profile's allowance, within [STALL_MIN_S, STALL_MAX_S]."""
    floors = profile.speed
    if floors.stall_s is not None:
        return floors.stall_s, f"declared in the profile's speed.stall_s ({floors.stall_s:g} s)"
    batch, slow = profile.batch_size, floors.slowdown_allowance
    s = round(min(STALL_MAX_S, max(STALL_MIN_S, STALL_BATCHES * slow * batch / prompt_per_s)), 1)
    return s, (
        f"{STALL_BATCHES:g} x allowance {slow:g} x batch {batch} / {prompt_per_s:.1f} prompt tok/s, "
        f"within {STALL_MIN_S:g}-{STALL_MAX_S:g} s"
    )


def probe_budget(profile: RouteProfile) -> RequestBudget:
    """Bounds for the speed probe itself, from the profile's floors (nothing is measured yet)."""
    floors = profile.speed
    prompt, gen = probe_size(profile)
    total = request_seconds(
        prompt, gen, floor_pp=floors.min_prompt_tokens_per_s, floor_tg=floors.min_generated_tokens_per_s
    )
    # the probe's prompt is one batch: silent for prompt / floor speed at most
    stall = floors.stall_s or round(max(STALL_MIN_S, 1.5 * prompt / floors.min_prompt_tokens_per_s), 1)
    pp, tg = floors.min_prompt_tokens_per_s, floors.min_generated_tokens_per_s
    why = f"speed probe at the profile's floors ({pp:g} prompt / {tg:g} generated tok/s)"
    return RequestBudget(completion_s=total, control_s=CONTROL_TIMEOUT_S, why=why, stall_s=stall,
                         speeds={"stall_why": why})  # fmt: skip


def probe_size(profile: RouteProfile) -> tuple[int, int]:
    per_slot = profile.per_slot_ctx()
    return min(PROBE_PROMPT, max(8, per_slot // 4)), PROBE_GENERATE


def judge_speeds(profile: RouteProfile, speeds: Speeds) -> None:
    """Raise TooSlow when a measured speed is under the profile's floor."""
    floors: SpeedFloors = profile.speed
    for what, got, floor, key in (
        ("prompt processing", speeds.prompt_per_s, floors.min_prompt_tokens_per_s, "min_prompt_tokens_per_s"),
        ("generation", speeds.generated_per_s, floors.min_generated_tokens_per_s, "min_generated_tokens_per_s"),
    ):
        if got < floor:
            shown = str(int(floor)) if floor == int(floor) else f"{floor:g}"
            raise TooSlow(
                f"slower than the profile's floor: {what} measured {got:.2f} tok/s, floor {shown} tok/s "
                f"(profile {profile.name} speed.{key}; {speeds.source})"
            )


def from_speeds(
    profile: RouteProfile,
    speeds: Speeds,
    *,
    generation_fraction: float = 0.125,
    n_ctx_train: int | None = None,
) -> RequestBudget:
    """The suite's budget once the pair's speeds are known: its largest request (a near-full lane,
    all slots busy) at those speeds times the profile's slowdown allowance, plus the margin."""
    judge_speeds(profile, speeds)
    prompt, generated = _largest_request(profile, generation_fraction, n_ctx_train)
    lanes, k = profile.parallel, profile.speed.slowdown_allowance
    work = lanes * (prompt / speeds.prompt_per_s + generated / speeds.generated_per_s)
    total = round(k * work + MARGIN_S, 1)
    stall, stall_why = stall_seconds(profile, speeds.prompt_per_s)
    why = (
        f"{k:g} x {lanes} lane(s) x ({prompt} prompt tokens / {speeds.prompt_per_s:.1f} tok/s + {generated} "
        f"generated / {speeds.generated_per_s:.1f} tok/s) + {MARGIN_S:g} s margin; speeds {speeds.source}"
    )
    return RequestBudget(
        completion_s=total,
        control_s=CONTROL_TIMEOUT_S,
        why=why,
        stall_s=stall,
        speeds={
            "prompt_per_s": round(speeds.prompt_per_s, 2),
            "generated_per_s": round(speeds.generated_per_s, 2),
            "source": speeds.source,
            "floors": profile.speed.model_dump(),
            "stall_why": stall_why,
        },
    )


def measure(client: ServerClient, profile: RouteProfile, prompt_tokens: list[int]) -> Speeds:
    """One cold request on slot 0 under the probe's own bounds; its `timings` are the speeds."""
    pb = probe_budget(profile)
    saved = client.watch
    client.watch = pb.watch()
    try:
        r = client.completion(
            prompt_tokens, PROBE_GENERATE, id_slot=0, cache_prompt=False, ignore_eos=True, seed=0,
            timeout=pb.completion_s,
        )  # fmt: skip
    finally:
        client.watch = saved
    t = r.timings
    pp, tg = t.prompt_per_second, t.predicted_per_second
    if not pp or not tg or pp <= 0 or tg <= 0:
        raise TooSlow(f"the speed probe's answer has no usable timings (prompt {pp}, predicted {tg} tok/s)")
    return Speeds(
        prompt_per_s=float(pp),
        generated_per_s=float(tg),
        source=f"measured by a cold probe of {len(prompt_tokens)} prompt + {PROBE_GENERATE} generated tokens",
    )


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
            "stopped making progress",
            "still making progress but not done",
            "readerror",
            "connecterror",
        )
    )


def suite_seconds(limits: RequestBudget, checks: int) -> float:
    """A bound on a whole suite of `checks` checks: each waits at most its largest request's
    bound (the lease's heartbeat promise during acceptance)."""
    return round(checks * limits.completion_s + MARGIN_S, 1)
