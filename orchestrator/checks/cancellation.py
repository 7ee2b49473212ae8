"""Cancellation: a streaming request cut off by closing the connection after a few tokens.

Passes when (1) the slot is idle again within a bound, (2) the native host's server log shows
the task's cancel and its slot's stop short of prompt + n_predict (the log is the only record of
where it stopped: `/slots` resets `n_decoded`), and (3) a follow-up on the same slot gives the
same greedy tokens the stream had produced.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.checks.split import log_grep_cmd
from orchestrator.hosts.probes import service_dir
from orchestrator.roles import LLAMA_SERVER

NAME = "cancellation"
SERVER_LOGS = ("llama-server.log", "llama-server.out")  # --log-file, then stdio


def cancel_line(id_task: int) -> str:
    return f"cancel task, id_task = {id_task}"


def stop_line(id_task: int) -> str:
    """The slot's release line for this task: `... | task N | stop processing: n_tokens = M, ...`."""
    return f"| task {id_task} | stop processing: n_tokens = "


def launch_line(id_task: int) -> str:
    """The slot's start line for this task: `... | task N | processing task, is_child = 0`."""
    return f"| task {id_task} | processing task"


_STOP = re.compile(r"\| task (\d+) \| stop processing: n_tokens = (\d+)")
# llama.cpp's log timestamp (common/log.cpp): minutes.seconds.milliseconds.microseconds since start
_STAMP = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")


def log_time(line: str) -> float | None:
    """Seconds since the server's log started, from a line's timestamp (None: no timestamp)."""
    m = _STAMP.match(line)
    if m is None:
        return None
    mins, secs, ms, us = (int(g) for g in m.groups())
    return mins * 60 + secs + ms / 1e3 + us / 1e6


def parse_log_lines(text: str, id_task: int) -> dict[str, Any]:
    """Whether the cancel was logged for `id_task`, the slot's token count when it stopped, and
    (where the lines carry llama.cpp's timestamps) when the task started and its slot was released."""
    out: dict[str, Any] = {"cancel_logged": False, "stop_n_tokens": None, "launch_t": None, "stop_t": None}
    for line in text.splitlines():
        if cancel_line(id_task) in line and line.rstrip().endswith(cancel_line(id_task)):
            out["cancel_logged"] = True
        if launch_line(id_task) in line:
            out["launch_t"] = log_time(line)
        m = _STOP.search(line)
        if m and int(m.group(1)) == id_task:
            out["stop_n_tokens"] = int(m.group(2))
            out["stop_t"] = log_time(line)
    return out


def held_after_close_s(log: dict[str, Any], open_s: float) -> float | None:
    """How long the slot kept the task after the client closed, on the server's own clock: release
    minus (start + time the stream was open); errs short by the request's latency, never long."""
    launch: float | None = log.get("launch_t")
    stop: float | None = log.get("stop_t")
    if launch is None or stop is None or stop < launch:
        return None
    return round(stop - (launch + open_s), 4)


def read_server_log(ctx: CheckContext, id_task: int, *, within_s: float = 3.0) -> dict[str, Any]:
    """Poll the native host's server logs for the task's cancel and stop lines (the log is
    written asynchronously, so both may take a moment to appear)."""
    tr = ctx.transports.get("native")
    root = ctx.host_roots.get("native")
    if tr is None or root is None:
        return {"checked": False, "found": False, "why": "no transport to the native host"}
    d = service_dir(tr, root, LLAMA_SERVER)
    deadline = time.monotonic() + within_s
    while True:
        for f in SERVER_LOGS:
            r = tr.run(
                log_grep_cmd(root, f, cancel_line(id_task), stop_line(id_task), launch_line(id_task), folder=d),
                check=False,
                timeout=30,
            )
            text = r.stdout.decode() if isinstance(r.stdout, bytes) else r.stdout
            seen = parse_log_lines(text, id_task)
            if seen["cancel_logged"] and seen["stop_n_tokens"] is not None:
                return {"checked": True, "found": True, "file": f, **seen}
        if time.monotonic() > deadline:
            return {"checked": True, "found": seen["cancel_logged"], "file": f, **seen}
        time.sleep(0.2)


def cancel_problems(
    *,
    idle_after_s: float | None,
    bound_s: float,
    full_n_tokens: int,
    log: dict[str, Any],
    followup_ok: bool,
    followup_same: bool,
    streamed: int,
    stopped_by: int | None = None,
    held_after_s: float | None = None,
    late_bound_s: float | None = None,
) -> list[str]:
    """`full_n_tokens`: prompt + n_predict (a finished request logs one less: the last token is
    never decoded). Whether it stopped at the cancel: `held_after_s` within `late_bound_s` where the
    log has timestamps, else the slot's tokens within `stopped_by` (a speed-based fallback)."""
    p = []
    if streamed == 0:
        p.append("the stream produced no tokens before it was closed")
    if idle_after_s is None:
        p.append(f"the slot was still processing {bound_s:g} s after the connection closed")
    if not log.get("checked"):
        p.append(f"server log not read: {log.get('why')}")
    else:
        if not log.get("cancel_logged"):
            p.append("the server log shows no cancel for the task")
        stopped = log.get("stop_n_tokens")
        if stopped is None:
            p.append("the server log shows no stop of the task's slot")
        elif stopped >= full_n_tokens - 1:
            p.append(f"the slot stopped at {stopped} tokens, the full request: it finished instead of being cancelled")
        elif held_after_s is not None and late_bound_s is not None:
            if held_after_s > late_bound_s:
                p.append(
                    f"the slot kept the task {held_after_s:.3f} s after the stream closed (server clock; bound "
                    f"{late_bound_s:.3f} s, decode steps measured on this pair), stopping at {stopped} tokens: "
                    "it did not stop at the cancel"
                )
        elif stopped_by is not None and stopped > stopped_by:
            p.append(
                f"the slot stopped at {stopped} tokens, more than the {stopped_by} it held when the stream "
                "closed plus the bound: it did not stop at the cancel"
            )
    if not followup_ok:
        p.append("the follow-up request failed")
    elif not followup_same:
        p.append("the follow-up's output differs from what the stream produced")
    return p


STOP_BOUND_MIN = 32  # tokens the server may still generate between the client's close and its failed write
STOP_BOUND_S = 0.25  # ... or this long at the measured speed, whichever is more
# the slot's release after the close, in decode steps: the step in flight, the step whose write
# fails (the server learns of the close only by writing), the cancel's turn in the queue, the release
STOP_STEPS = 4


def step_seconds(
    predicted_ms: float | None, predicted_n: int | None, tokens_per_step: int, probe_tokens_per_s: float | None
) -> tuple[float | None, str]:
    """One decode step of this pair in seconds (up to `tokens_per_step` tokens), and its source:
    the follow-up's server timings, else the budget's speed probe."""
    if predicted_ms and predicted_n and predicted_ms > 0 and predicted_n > 0:
        per_token = predicted_ms / 1000.0 / predicted_n
        src = f"follow-up: {predicted_n} tokens in {predicted_ms:.1f} ms"
    elif probe_tokens_per_s and probe_tokens_per_s > 0:
        per_token, src = 1.0 / probe_tokens_per_s, f"speed probe: {probe_tokens_per_s:.1f} generated tok/s"
    else:
        return None, "no decode speed measured"
    return per_token * tokens_per_step, f"{src}, x {tokens_per_step} token(s) per step"


def longest_gap_s(arrivals: list[float]) -> float | None:
    """The longest wait between two streamed chunks after the first (which also waits for the prompt)."""
    gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:], strict=False)]
    return round(max(gaps), 4) if gaps else None


def late_bound(
    step_s: float | None, gap_s: float | None, allowance: float, reaction_s: float | None = None
) -> tuple[float | None, str]:
    """How long after the close the slot may keep the task: STOP_STEPS steps times the allowance,
    each step the longest measured of a decode step, a stream gap and a `/slots` round trip (the
    server learns of the close on its HTTP thread, which a busy machine wakes late)."""
    unit = max((v for v in (step_s, gap_s, reaction_s) if v), default=None)
    if unit is None:
        return None, "no step measured: judged by tokens instead"
    bound = round(STOP_STEPS * allowance * unit, 4)
    return bound, (
        f"{STOP_STEPS} steps x allowance {allowance:g} x max(decode step {step_s or 0:.4f} s, "
        f"longest stream gap {gap_s or 0:.4f} s, /slots round trip {reaction_s or 0:.4f} s)"
    )


FOLLOWUP_TOKENS = 64  # the follow-up's length: enough decode steps for the server's own speed figure


def stream_speed(handle: Any) -> float | None:
    """Tokens per second the client read so far (None: too little to tell)."""
    n, dt = len(handle.tokens), time.monotonic() - handle.started_at
    return round(n / dt, 1) if n >= 2 and dt > 0 else None


def stop_bound_tokens(speed: float | None) -> int:
    return max(STOP_BOUND_MIN, int(speed * STOP_BOUND_S) + 1 if speed else 0)


def stopped_by_tokens(prompt_n: int, at_close: int, open_s: float, speed: float | None) -> int:
    """The most the slot may hold if the server stopped at the cancel: the prompt, what it can have
    generated before the close, and the bound after it. The client's read position lags what the
    server sent by dozens of tokens on a loaded machine, so `speed` x `open_s` bounds it too."""
    before = max(at_close, math.ceil(speed * open_s) if speed else 0)
    return prompt_n + before + stop_bound_tokens(speed)


def _read_until(ctx: CheckContext, handle: Any, chunks: Any, slot: int, k: int) -> tuple[int | None, float | None]:
    """Read the stream up to `k` tokens, asking /slots at each chunk: (the slot's task id, the
    longest /slots round trip), before the close only (after it the regression itself slows it)."""
    id_task, reaction_s = None, None
    for _chunk in chunks:
        asked = time.monotonic()
        busy = [s for s in ctx.client.slots(timeout=10) if s.id == slot and s.is_processing]
        reaction_s = max(reaction_s or 0.0, time.monotonic() - asked)
        if id_task is None:
            id_task = busy[0].id_task if busy else None
        if len(handle.tokens) >= k:
            break
    return id_task, reaction_s


def _idle_bound(
    ctx: CheckContext, per_step: int, probe_tg: float | None, gap_s: float | None, reaction_s: float | None
) -> float:
    """How long to watch for the idle slot: the configured bound, or the lateness bound when longer."""
    pre_step, _ = step_seconds(None, None, per_step, probe_tg)
    allowance = ctx.profile.speed.slowdown_allowance
    return max(ctx.options.cancel_idle_bound_s, late_bound(pre_step, gap_s, allowance, reaction_s)[0] or 0.0)


def _wait_idle(ctx: CheckContext, slot: int, closed_at: float, idle_bound: float) -> tuple[float | None, Any]:
    """Poll /slots until the slot is idle or the bound passes: (seconds after the close, last slot read)."""
    idle_after, last = None, None
    while time.monotonic() - closed_at <= idle_bound:
        last = next((s for s in ctx.client.slots(timeout=10) if s.id == slot), None)
        if last is not None and not last.is_processing:
            idle_after = round(time.monotonic() - closed_at, 4)
            break
        time.sleep(ctx.options.slots_poll_interval_s)
    return idle_after, last


def _follow_up(
    ctx: CheckContext, prompt: list[int], streamed: list[int], slot: int, raw: dict[str, Any]
) -> tuple[bool, bool, Any]:
    """The same request again on the same slot, whole: (answered, same first tokens, its timings)."""
    try:
        follow = ctx.client.completion(
            prompt,
            max(len(streamed), FOLLOWUP_TOKENS),
            id_slot=slot,
            cache_prompt=False,
            ignore_eos=True,
            seed=0,
            timeout=ctx.options.request_timeout_s,
        )
        same = list(follow.tokens)[: len(streamed)] == streamed
        raw["followup"] = {
            "tokens": list(follow.tokens),
            "id_slot": follow.id_slot,
            "stop_type": follow.stop_type,
            "predicted_per_second": follow.timings.predicted_per_second,
        }
        return True, same, follow.timings
    except Exception as exc:  # the follow-up failing is the finding, not an error of the check
        raw["followup"] = {"error": f"{type(exc).__name__}: {exc}"}
        return False, False, None


def run(ctx: CheckContext, *, close_connection: bool = True) -> CheckResult:
    """`close_connection=False` stops reading but keeps the connection open: the broken case."""
    timer = Timer()
    opts = ctx.options
    slot = 0
    pb = PromptBuilder(ctx.client, opts.seed + 400)
    prompt = list(pb.exact(64, variant=400, head="Count on:\n"))
    n_predict = ctx.per_slot() - len(prompt) - ctx.profile.near_full_slack
    k = opts.cancel_after_tokens
    raw: dict[str, Any] = {"n_predict": n_predict, "cancel_after_tokens": k}
    draft = ctx.profile.draft
    per_step = 1 + (draft.n_max if draft is not None and draft.n_max > 0 else 0)  # tokens one step may yield
    probe_tg = (ctx.budget.get("speeds") or {}).get("generated_per_s")
    allowance = ctx.profile.speed.slowdown_allowance
    with ctx.client.stream_completion(
        prompt, n_predict, id_slot=slot, cache_prompt=False, ignore_eos=True, seed=0, timeout=opts.request_timeout_s
    ) as (handle, chunks):
        id_task, reaction_s = _read_until(ctx, handle, chunks, slot, k)
        streamed = list(handle.tokens)[:k]
        at_close = len(handle.tokens)  # what the client had read when it let go
        client_speed = stream_speed(handle)
        if close_connection:
            handle.close()
        closed_at = time.monotonic()
        open_s = closed_at - handle.started_at
        gap_s = longest_gap_s(handle.arrivals[:at_close])
        idle_bound = _idle_bound(ctx, per_step, probe_tg, gap_s, reaction_s)
        idle_after, last = _wait_idle(ctx, slot, closed_at, idle_bound)
        if last is not None and id_task is None:
            id_task = last.id_task
        # read the log before the broken case lets go of its connection, so its close is not counted
        log = (
            read_server_log(ctx, id_task, within_s=3.0 if close_connection else 0.5)
            if id_task is not None
            else {"checked": False, "why": "no task id seen in /slots"}
        )
        if not close_connection:
            handle.close()
    followup_ok, followup_same, t = _follow_up(ctx, prompt, streamed, slot, raw)
    server_speed = t.predicted_per_second if t else None
    # the server's own decode speed (the same slot, prompt and settings), else what the client saw
    speeds = [v for v in (server_speed, client_speed) if v]
    speed = max(speeds) if speeds else None
    bound = stop_bound_tokens(speed)
    stopped_by = stopped_by_tokens(len(prompt), at_close, open_s, speed)
    held_after = held_after_close_s(log, open_s) if log.get("checked") else None
    step_s, step_why = step_seconds(t.predicted_ms if t else None, t.predicted_n if t else None, per_step, probe_tg)
    late_s, late_why = late_bound(step_s, gap_s, allowance, reaction_s)
    raw["late_bound"] = {"bound_s": late_s, "why": late_why, "step_s": step_s, "step_from": step_why,
                         "longest_stream_gap_s": gap_s, "slots_round_trip_s": reaction_s}  # fmt: skip
    problems = cancel_problems(
        idle_after_s=idle_after,
        bound_s=idle_bound,
        full_n_tokens=len(prompt) + n_predict,
        log=log,
        followup_ok=followup_ok,
        followup_same=followup_same,
        streamed=len(streamed),
        stopped_by=stopped_by,
        held_after_s=held_after,
        late_bound_s=late_s,
    )
    raw.update(
        {
            "tokens_at_close": at_close,
            "stream_tokens_per_s": client_speed,
            "server_tokens_per_s": server_speed,
            "stream_open_s": round(open_s, 4),
            "stop_bound_tokens": bound,
            "could_finish_within_idle_bound": speed is not None and n_predict <= speed * idle_bound,
            "id_task": id_task,
            "streamed_tokens": streamed,
            "slot_after": last.model_dump() if last else None,
            "log": log,
            "problems": problems,
        }
    )
    figures = {
        "idle_after_s": idle_after,
        "bound_s": idle_bound,
        "streamed": len(streamed),
        "slot_tokens_at_stop": log.get("stop_n_tokens"),
        "full_request_tokens": len(prompt) + n_predict,
        "cancel_logged": bool(log.get("cancel_logged")),
        "followup_same": followup_same,
        "stopped_by": stopped_by,
        "held_after_close_s": held_after,
        "late_bound_s": late_s,
    }
    ok = f"cancelled after {len(streamed)} tokens, slot idle in {idle_after} s, follow-up matched"
    return judged(NAME, problems, ok, timer, figures=figures, raw=raw)
