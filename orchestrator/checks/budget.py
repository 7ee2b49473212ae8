"""How long an acceptance request may take: derived from the speed measured on this pair, never a
fixed number (a constant tuned to the lab's toy model fails a healthy pair serving a real model).

- **Progress.** `/slots` must show progress within `stall_s`: the longest honest gap is one batch at
  the deepest context the suite fills, every lane in it, slowed by `slowdown_allowance` (see
  `stall_seconds`; no upper cap: a 100 s cap failed a healthy pair whose near-full batch took ~100 s).
- **Liveness.** Since that bound grows with the work, a stopped server is caught by the CPU time of
  llama-server and ggml-rpc-server (`/proc` over SFTP): none on either and no progress for IDLE_S
  fails the request. While that reading is unavailable, `stall_s` is held to `blind_s`.
- **Total.** A cold probe measures prompt and generation speed; the largest request may take
  `slowdown_allowance` times its work at those speeds, plus a margin.
- **Floors.** A pair slower than the profile's `speed:` floors fails at the probe.

`for_profile` is the planning figure before anything is measured (lease TTLs); it never fails a
request. Pure except `measure` (one request).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.config.profiles import RouteProfile, SpeedFloors
from orchestrator.hosts.probes import parse_pid, parse_proc_stat, service_dir
from orchestrator.remote.transport import Transport
from orchestrator.roles import SERVICE_OF_ROLE
from orchestrator.server.client import Liveness, ProgressWatch, ServerClient

# Planning speeds: only for bounds needed before the pair is measured (lease TTLs).
FLOOR_PROMPT_TOKENS_PER_S = 300.0
FLOOR_GENERATED_TOKENS_PER_S = 20.0
MARGIN_S = 30.0
CONTROL_TIMEOUT_S = 30.0
# the shortest stall bound, and how many batches' worth of silence in /slots is still honest
STALL_MIN_S = 30.0
STALL_BATCHES = 3.0
IDLE_S = STALL_MIN_S  # no CPU time on either service and no /slots progress this long: stopped
KV_PAD = 256  # the KV cells llama.cpp attends at least (n_kv is padded to 256)
POLL_S = 1.0
# the speed probe's cold prompt (at most a quarter of a slot) and generated tokens
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
    blind_s: float | None = None  # the stall bound while the services' CPU time cannot be read
    blind_factor: float = 1.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def watch(self, alive: Callable[[], Liveness | None] | None = None) -> ProgressWatch:
        """The client's progress watch; with `alive` (services' CPU time) a stopped server fails in
        IDLE_S whatever `stall_s` is."""
        return ProgressWatch(
            stall_s=self.stall_s, poll_s=POLL_S, why=self.speeds.get("stall_why", ""), alive=alive,
            idle_s=IDLE_S if alive is not None else None,
            idle_why="a working service uses CPU time every second; none on either for this long is a stopped "
            "or deadlocked process (checks/budget.py IDLE_S)",
            blind_s=self.blind_s, blind_factor=self.blind_factor,
        )  # fmt: skip


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


def for_profile(profile: RouteProfile) -> RequestBudget:
    """The planning budget for `profile` at planning speeds (before anything is measured)."""
    prompt, generated = _largest_request(profile, 0.125, None)  # CheckOptions' generation_fraction
    lanes = profile.parallel
    s = request_seconds(prompt, generated, lanes=lanes)
    why = (
        f"{lanes} lane(s) x ({prompt} prompt tokens / {FLOOR_PROMPT_TOKENS_PER_S:g} tok/s + {generated} generated / "
        f"{FLOOR_GENERATED_TOKENS_PER_S:g} tok/s) + {MARGIN_S:g} s margin"
    )
    return RequestBudget(completion_s=s, control_s=CONTROL_TIMEOUT_S, why=why)


def context_growth(profile: RouteProfile, n_ctx_train: int | None = None) -> tuple[float, int, int]:
    """(growth, cells attended at the deepest context, cells in the probe): how much more a prompt
    token costs there than in the probe, as if attention were the whole cost (an upper bound). A
    lane attends its own KV stream; a unified cache (`--kv-unified`) attends every lane's."""
    per_slot = profile.per_slot_ctx(n_ctx_train)
    unified = any(a in ("--kv-unified", "-kvu") for a in profile.extra_args)
    deep = per_slot * (profile.parallel if unified else 1)
    probe = max(probe_size(profile)[0], KV_PAD)
    return max(1.0, deep / probe), deep, probe


def stall_seconds(profile: RouteProfile, prompt_per_s: float, n_ctx_train: int | None = None) -> tuple[float, str]:
    """The longest honest silence in `/slots`: STALL_BATCHES batches of prompt, each as costly as
    the deepest one the suite runs (all lanes busy, at a slot's full context), at this speed slowed
    by the profile's allowance; at least STALL_MIN_S, never capped."""
    floors = profile.speed
    if floors.stall_s is not None:
        return floors.stall_s, f"declared in the profile's speed.stall_s ({floors.stall_s:g} s)"
    slow = floors.slowdown_allowance
    per_slot = profile.per_slot_ctx(n_ctx_train)
    batch = min(profile.batch_size, profile.parallel * per_slot)
    growth, deep, probe = context_growth(profile, n_ctx_train)
    s = round(max(STALL_MIN_S, STALL_BATCHES * slow * batch / prompt_per_s * growth), 1)
    return s, (
        f"{STALL_BATCHES:g} x allowance {slow:g} x batch {batch} tokens / {prompt_per_s:.1f} prompt tok/s x "
        f"context growth {growth:.2f} ({deep} cells attended at a full slot / {probe} in the probe), "
        f"at least {STALL_MIN_S:g} s"
    )


def blind_seconds(profile: RouteProfile, prompt_per_s: float, n_ctx_train: int | None = None) -> tuple[float, float]:
    """The stall bound while the services' CPU time cannot be read, and its growth factor: one batch
    at the probe's speed without context growth (which over-counts into hours at a field context),
    times STALL_BATCHES and the allowance; ProgressWatch raises it to that factor times the longest
    silence between batches seen, so it is measured, not assumed."""
    factor = STALL_BATCHES * profile.speed.slowdown_allowance
    batch = min(profile.batch_size, profile.parallel * profile.per_slot_ctx(n_ctx_train))
    return round(max(STALL_MIN_S, factor * batch / prompt_per_s), 1), factor


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
    stall, stall_why = stall_seconds(profile, speeds.prompt_per_s, n_ctx_train)
    blind, blind_factor = blind_seconds(profile, speeds.prompt_per_s, n_ctx_train)
    why = (
        f"{k:g} x {lanes} lane(s) x ({prompt} prompt tokens / {speeds.prompt_per_s:.1f} tok/s + {generated} "
        f"generated / {speeds.generated_per_s:.1f} tok/s) + {MARGIN_S:g} s margin; speeds {speeds.source}"
    )
    return RequestBudget(
        completion_s=total,
        control_s=CONTROL_TIMEOUT_S,
        why=why,
        stall_s=stall,
        blind_s=min(blind, stall),
        blind_factor=blind_factor,
        speeds={
            "prompt_per_s": round(speeds.prompt_per_s, 2),
            "generated_per_s": round(speeds.generated_per_s, 2),
            "source": speeds.source,
            "floors": profile.speed.model_dump(),
            "stall_why": stall_why,
            "idle_s": IDLE_S,
            "idle_why": "no CPU time on llama-server or ggml-rpc-server and no /slots progress (checks/budget.py)",
        },
    )


def measure(
    client: ServerClient,
    profile: RouteProfile,
    prompt_tokens: list[int],
    alive: Callable[[], Liveness | None] | None = None,
) -> Speeds:
    """One cold request on slot 0 under the probe's own bounds; its `timings` are the speeds."""
    pb = probe_budget(profile)
    saved = client.watch
    client.watch = pb.watch(alive)
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


READ_WAIT_S = 5.0  # how long the watch waits for one reading of the hosts before it goes on without


class _Bounded:
    """Calls `read` in a worker thread and waits at most `wait_s` for it: a host whose sshd hangs
    must not hang the watch (its reading is then None, unknown, and `stall_s` alone judges). At most
    one reading is in flight; a late one is handed to the next call."""

    def __init__(self, read: Callable[[], Liveness | None], wait_s: float = READ_WAIT_S) -> None:
        self._read, self._wait_s = read, wait_s
        self._lock = threading.Lock()
        self._done: threading.Event | None = None
        self._box: dict[str, Liveness | None] = {}

    def __call__(self) -> Liveness | None:
        with self._lock:
            if self._done is None:
                done, box = threading.Event(), self._box
                self._done = done

                def work() -> None:
                    try:
                        box["seen"] = self._read()
                    except Exception:  # an unreadable host: no sign either way
                        box["seen"] = None
                    finally:
                        done.set()

                threading.Thread(target=work, daemon=True, name="pairctl services-cpu").start()
            done = self._done
            box = self._box
        if not done.wait(self._wait_s):
            return None
        with self._lock:  # every caller that waited on this reading gets it (lanes share one reader)
            if self._done is done:
                self._box, self._done = {}, None
        return box.get("seen")


def services_cpu(transports: Mapping[str, Transport], roots: Mapping[str, str]) -> Callable[[], Liveness | None]:
    """A reader of the pair's services' CPU time over SFTP, bounded by READ_WAIT_S: each service's
    pid file and its main thread's `/proc/<pid>/task/<pid>/stat`; None when none could be read.
    Each pid file's folder is resolved once (probes.service_dir): only a start moves it."""
    dirs: dict[str, str] = {}

    def read() -> Liveness | None:
        out = []
        for role, service in SERVICE_OF_ROLE.items():
            t, root = transports.get(role), roots.get(role)
            if t is None or root is None:
                continue
            try:
                d = dirs.get(role) or dirs.setdefault(role, service_dir(t, root, service))
                pid = parse_pid(t.read_bytes(f"{d}/{service}.pid", max_bytes=64))
                # the main thread runs the decode loop; the process total also moves with the HTTP
                # threads answering the watch's own /slots polls while the loop waits on a stopped peer
                st = parse_proc_stat(t.read_bytes(f"/proc/{pid}/task/{pid}/stat", max_bytes=4096)) if pid else None
            except Exception:  # an unreadable file or a host error: no reading from it this poll
                continue
            if pid and st:
                out.append((service, pid, st[0], st[1]))
        return tuple(out) or None

    return _Bounded(read)
