"""Cancellation: a streaming request cut off by closing the connection after a few tokens.

Passes when (1) the slot is idle again within a bound (read from `/slots`), having decoded
fewer tokens than asked (so it stopped, not finished), (2) the server log on the native host
shows `cancel task, id_task = N` for that very task, and (3) a follow-up request on the same
slot succeeds with the expected output: the same greedy tokens the stream had produced.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.checks.base import CheckContext, CheckResult, Timer, verdict_of
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.remote.command import Cmd

NAME = "cancellation"
SERVER_LOGS = ("llama-server.log", "llama-server.out")  # --log-file, then stdio


def cancel_line(id_task: int) -> str:
    return f"cancel task, id_task = {id_task}"


def log_grep_cmd(root: str, file: str, text: str) -> Cmd:
    """Count lines holding a fixed string in a file under `<root>/run/` (no shell, no regex)."""
    return Cmd(("grep", "-c", "-F", "--", text, f"{root.rstrip('/')}/run/{file}"))


def count_from_grep(exit_status: int, stdout: str) -> int | None:
    """`grep -c`: 0 with a count, 1 with "0", 2 when the file is unreadable (None)."""
    if exit_status == 2:
        return None
    try:
        return int(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def find_in_server_log(ctx: CheckContext, text: str, *, within_s: float = 3.0) -> dict[str, Any]:
    """Poll the native host's server logs for `text` (the log is written asynchronously)."""
    tr = ctx.transports.get("native")
    root = ctx.host_roots.get("native")
    if tr is None or root is None:
        return {"checked": False, "found": False, "why": "no transport to the native host"}
    deadline = time.monotonic() + within_s
    seen: dict[str, int | None] = {}
    while True:
        for f in SERVER_LOGS:
            r = tr.run(log_grep_cmd(root, f, text), check=False, timeout=30)
            seen[f] = count_from_grep(r.exit_status, r.stdout)
            if seen[f]:
                return {"checked": True, "found": True, "file": f, "count": seen[f]}
        if time.monotonic() > deadline:
            return {"checked": True, "found": False, "counts": seen}
        time.sleep(0.2)


def cancel_problems(*, idle_after_s: float | None, bound_s: float, n_decoded: int | None, n_predict: int,
                    log: dict[str, Any], followup_ok: bool, followup_same: bool, streamed: int) -> list[str]:
    p = []
    if streamed == 0:
        p.append("the stream produced no tokens before it was closed")
    if idle_after_s is None:
        p.append(f"the slot was still processing {bound_s:g} s after the connection closed")
    if n_decoded is not None and n_decoded >= n_predict:
        p.append(f"the slot decoded all {n_predict} tokens: the request finished instead of being cancelled")
    if not log.get("checked"):
        p.append(f"server log not read: {log.get('why')}")
    elif not log.get("found"):
        p.append("the server log shows no cancel for the task")
    if not followup_ok:
        p.append("the follow-up request failed")
    elif not followup_same:
        p.append("the follow-up's output differs from what the stream produced")
    return p


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
    id_task = None
    with ctx.client.stream_completion(prompt, n_predict, id_slot=slot, cache_prompt=False, ignore_eos=True, seed=0,
                                      timeout=opts.request_timeout_s) as (handle, chunks):
        for _chunk in chunks:
            if id_task is None:
                busy = [s for s in ctx.client.slots(timeout=10) if s.id == slot and s.is_processing]
                id_task = busy[0].id_task if busy else None
            if len(handle.tokens) >= k:
                break
        streamed = list(handle.tokens)[:k]
        if close_connection:
            handle.close()
        closed_at = time.monotonic()
        idle_after = None
        last = None
        while time.monotonic() - closed_at <= opts.cancel_idle_bound_s:
            last = next((s for s in ctx.client.slots(timeout=10) if s.id == slot), None)
            if last is not None and not last.is_processing:
                idle_after = round(time.monotonic() - closed_at, 4)
                break
            time.sleep(opts.slots_poll_interval_s)
        if last is not None and id_task is None:
            id_task = last.id_task
        if not close_connection:
            handle.close()  # clean up the broken case only after measuring it
    log = find_in_server_log(ctx, cancel_line(id_task)) if id_task is not None else {"checked": False, "why": "no task id seen in /slots"}
    try:
        follow = ctx.client.completion(prompt, len(streamed), id_slot=slot, cache_prompt=False, ignore_eos=True,
                                       seed=0, timeout=opts.request_timeout_s)
        followup_ok = True
        followup_same = list(follow.tokens) == streamed
        raw["followup"] = {"tokens": list(follow.tokens), "id_slot": follow.id_slot, "stop_type": follow.stop_type}
    except Exception as exc:  # the follow-up failing is the finding, not an error of the check
        followup_ok, followup_same = False, False
        raw["followup"] = {"error": f"{type(exc).__name__}: {exc}"}
    n_decoded = last.n_decoded if last is not None else None
    problems = cancel_problems(idle_after_s=idle_after, bound_s=opts.cancel_idle_bound_s, n_decoded=n_decoded,
                               n_predict=n_predict, log=log, followup_ok=followup_ok, followup_same=followup_same,
                               streamed=len(streamed))
    raw.update({"id_task": id_task, "streamed_tokens": streamed, "slot_after": last.model_dump() if last else None,
                "log": log, "problems": problems})
    figures = {"idle_after_s": idle_after, "bound_s": opts.cancel_idle_bound_s, "streamed": len(streamed),
               "decoded_before_stop": n_decoded, "cancel_logged": bool(log.get("found")), "followup_same": followup_same}
    return CheckResult(name=NAME, verdict=verdict_of(problems),
                       message="; ".join(problems) or f"cancelled after {len(streamed)} tokens, slot idle in {idle_after} s, follow-up matched",
                       figures=figures, raw=raw, duration_s=timer.elapsed())
