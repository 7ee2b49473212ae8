"""Request contract: what a client asks for is what it gets, field by field.

A fork can keep every token right and still break a request field clients depend on (a sampling
parameter echoed but never applied, a stop string never honoured). This check probes each field
of the profile's declared `request_surface` with a question whose answer a broken build cannot
fake (the probes and what each demands: checks/contract_probes.py). Compared answers come from one
configuration, so their tokens are equal on any device. `seed` is the `sampling` check's; `tools`
and the penalties have no probe yet: the suite's `request_surface` record names them unchecked.
A probe whose request the server refuses fails with the server's answer; the others still run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from orchestrator.checks import contract_probes as cp
from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged
from orchestrator.checks.prompts import PromptBuilder
from orchestrator.config.profiles import RouteProfile
from orchestrator.config.request_surface import KNOWN_FIELDS
from orchestrator.server.client import ServerRequestError
from orchestrator.server.parsers import ParseError

NAME = "request_contract"
PROMPT_TOKENS = 16
SEED = 4747
# fields judged by another check of the suite (it must have run for the field to count as checked)
ELSEWHERE = {"seed": "sampling"}
COMPLETION_FIELDS = {"n_predict", "n_probs", "stop", "logit_bias", "top_k", "top_p", "temperature"}
CHAT_FIELDS = {"messages", "max_tokens", "logprobs", "stream", "stream_options"}


Judged = tuple[list[str], dict[str, Any]]  # a probe's problems and its raw answers


def _probe(out: list[cp.ProbeResult], name: str, fields: tuple[str, ...], fn: Callable[[], Judged]) -> None:
    """Run one probe; a server that refuses its request (an HTTP error, an answer that does not
    parse) fails that probe, saying what the server answered. A server that does not answer at
    all is not a contract question: that propagates (the suite stops on a transport failure)."""
    try:
        problems, raw = fn()
    except (ServerRequestError, ParseError, ValueError, KeyError, TypeError) as exc:
        problems, raw = [f"{name}: the server answered {type(exc).__name__}: {exc}"[:600]], {}
    out.append(cp.ProbeResult(name, fields, problems, raw))


def _wanted(out: list[cp.ProbeResult], want: set[str], name: str, fn: Callable[[], Judged]) -> None:
    """`_probe` of the field `name` when the profile's request surface declares it."""
    if name in want:
        _probe(out, name, (name,), fn)


def _base_probe(out: list[cp.ProbeResult], name: str, fn: Callable[[], Judged], fields: set[str], why: str) -> bool:
    """Run the request every later probe builds on (it judges nothing itself); when the server
    refuses it, each of `fields` fails with it, saying why (True: stop probing)."""
    _probe(out, name, (), fn)
    refused = out.pop()
    for f in sorted(fields) if refused.problems else ():
        out.append(cp.ProbeResult(f, (f,), [f"{f}: {why}: {refused.problems[0]}"]))
    return bool(refused.problems)


def _completion_probes(p: cp.Prober, want: set[str], drafting: bool) -> list[cp.ProbeResult]:
    out: list[cp.ProbeResult] = []
    box: dict[str, Any] = {}

    def reference() -> Judged:
        box["greedy"] = p.completion(cp.GREEDY_TOKENS, ignore_eos=True, n_probs=cp.N_PROBS)
        return [], {}

    if _base_probe(out, "reference", reference, want & COMPLETION_FIELDS, "no greedy reference"):
        return out
    greedy = box["greedy"]
    g = cp.tokens_of(greedy)
    ref = {"tokens": g, "content": greedy.get("content"), "top0": cp.top_entries(greedy, 0)}
    _wanted(out, want, "n_predict", lambda: (cp.n_predict_problems(greedy, cp.GREEDY_TOKENS), ref))
    _wanted(out, want, "n_probs", lambda: (cp.n_probs_problems(greedy, cp.N_PROBS, drafting=drafting), ref))

    def stop() -> Judged:
        word = cp.choose_stop(str(greedy.get("content") or ""))
        if word is None:
            return [f"stop: no character to stop at in the greedy text {greedy.get('content')!r}"], {"reference": ref}
        stopped = p.completion(cp.GREEDY_TOKENS, ignore_eos=True, stop=[word])
        answer = {k: stopped.get(k) for k in ("content", "stop_type", "stopping_word", "tokens")}
        return cp.stop_problems(greedy, stopped, word), {"reference": ref, "stop": word, "answer": answer}

    def logit_bias() -> Judged:
        boost = cp.boost_for(greedy)
        if boost is None or not g:
            return [f"logit_bias: the greedy reference has no three top entries at token 0: {ref['top0']}"], {}
        banned = p.completion(1, logit_bias=[[g[0], False]])
        boosted = p.completion(1, logit_bias={str(boost[0]): boost[1]})
        raw = {"reference": ref, "banned": cp.tokens_of(banned), "boosted": cp.tokens_of(boosted), "boost": list(boost)}
        return cp.logit_bias_problems(greedy, banned, boosted), raw

    def sampled(name: str, settings: dict[str, Any]) -> Judged:
        toks = cp.tokens_of(p.completion(cp.GREEDY_TOKENS, ignore_eos=True, temperature=cp.HOT, seed=SEED, **settings))
        judge = cp.keep_many_problems(g, toks) if name == "temperature" else cp.keep_one_problems(name, g, toks)
        return judge, {"greedy": g, "sampled": toks, "settings": settings}

    _wanted(out, want, "stop", stop)
    _wanted(out, want, "logit_bias", logit_bias)
    for name in ("top_k", "top_p"):
        _wanted(out, want, name, partial(sampled, name, cp.KEEP_ONE[name]))
    _wanted(out, want, "temperature", partial(sampled, "temperature", cp.KEEP_MANY))
    return out


def _chat_probes(p: cp.Prober, want: set[str], drafting: bool) -> list[cp.ProbeResult]:
    out: list[cp.ProbeResult] = []
    user = {"role": "user", "content": cp.USER}
    extra: dict[str, Any] = {"logprobs": True, "top_logprobs": cp.TOP_LOGPROBS} if "logprobs" in want else {}
    body = p.chat_body([{"role": "system", "content": cp.SYSTEM_A}, user], cp.CHAT_TOKENS, ignore_eos=True, **extra)
    box: dict[str, Any] = {}

    def chat() -> Judged:
        box["answer"] = p.chat(body)
        return [], {}

    if _base_probe(out, "chat", chat, want & CHAT_FIELDS, "the chat request was refused"):
        return out
    answer = box["answer"]
    brief = {"content": cp.chat_text(answer), "usage": answer.get("usage"),
             "finish_reason": cp.chat_choice(answer).get("finish_reason")}  # fmt: skip

    def messages() -> Judged:
        rendered = {
            label: str(p.client.post_json("/apply-template", {"messages": msgs}, timeout=p.timeout).get("prompt"))
            for label, msgs in (
                ("system_a", [{"role": "system", "content": cp.SYSTEM_A}, user]),
                ("system_b", [{"role": "system", "content": cp.SYSTEM_B}, user]),
                ("no_system", [user]),
            )
        }
        problems = cp.template_problems(rendered["system_a"], rendered["system_b"], rendered["no_system"], cp.USER)
        n_rendered = len(p.client.tokenize(rendered["system_a"], add_special=True))
        used = (answer.get("usage") or {}).get("prompt_tokens")
        if used != n_rendered:
            problems.append(f"messages: the chat used {used!r} prompt tokens, its rendered prompt is {n_rendered}")
        return problems, {"rendered": rendered, "rendered_tokens": n_rendered, "prompt_tokens": used}

    def stream() -> Judged:
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        events = p.client.stream_events("/v1/chat/completions", streamed, timeout=p.timeout)
        return cp.stream_problems(events, answer), {"answer": brief, "events": events[-3:], "n_events": len(events)}

    _wanted(out, want, "max_tokens", lambda: (cp.max_tokens_problems(answer, cp.CHAT_TOKENS), brief))
    if "logprobs" in want:
        problems = cp.logprobs_problems(answer, cp.CHAT_TOKENS, cp.TOP_LOGPROBS, drafting=drafting)
        _probe(out, "logprobs", ("logprobs",), lambda: (problems, brief))
    _wanted(out, want, "messages", messages)
    if want & {"stream", "stream_options"}:
        _probe(out, "stream", tuple(f for f in ("stream", "stream_options") if f in want), stream)
    return out


def _constrained_probes(p: cp.Prober, want: set[str]) -> list[cp.ProbeResult]:
    out: list[cp.ProbeResult] = []

    def grammar() -> Judged:
        body = p.completion(cp.GRAMMAR_TOKENS, grammar=cp.GRAMMAR)
        return cp.grammar_problems(body), {"content": body.get("content"), "stop_type": body.get("stop_type")}

    def response_format() -> Judged:
        fmt = {"type": "json_schema", "json_schema": {"name": "probe", "schema": cp.SCHEMA}}
        msgs = [{"role": "user", "content": "Name a colour and say if it is ok, as JSON."}]
        answer = p.chat(p.chat_body(msgs, cp.SCHEMA_TOKENS, response_format=fmt))
        raw = {"content": cp.chat_text(answer), "finish_reason": cp.chat_choice(answer).get("finish_reason")}
        return cp.schema_problems(answer), raw

    _wanted(out, want, "grammar", grammar)
    _wanted(out, want, "response_format", response_format)
    return out


def run(ctx: CheckContext) -> CheckResult:
    timer = Timer()
    want: set[str] = set(ctx.profile.request_surface)
    prompt = list(PromptBuilder(ctx.client, ctx.options.seed + 747).exact(PROMPT_TOKENS, variant=747, head="Once "))
    p = cp.Prober(ctx.client, prompt, ctx.options.request_timeout_s)
    probes: list[cp.ProbeResult] = []
    if want & COMPLETION_FIELDS:
        probes += _completion_probes(p, want, ctx.drafting())
    if want & CHAT_FIELDS:
        probes += _chat_probes(p, want, ctx.drafting())
    probes += _constrained_probes(p, want)
    problems = [x for r in probes for x in r.problems]
    covered = {f: f"{NAME}/{r.name}" for r in probes for f in r.fields}
    failed = sorted({r.name for r in probes if r.problems})
    return judged(
        NAME,
        problems,
        f"{len(probes)} probes held their contract: {', '.join(r.name for r in probes)}",
        timer,
        figures={"probes": len(probes), "failed_probes": failed, "fields_checked": sorted(covered)},
        raw={
            "covered": covered,
            "probes": [{"name": r.name, "fields": list(r.fields), "problems": r.problems, **r.raw} for r in probes],
            "prompt_tokens": len(prompt),
        },
    )


def surface_report(profile: RouteProfile, results: Iterable[CheckResult]) -> dict[str, Any]:
    """For the receipt: each declared request field checked (by which check or probe, with the
    verdict) or not (and why), and the known fields outside the declared surface."""
    by_name = {r.name: r for r in results}
    declared = list(profile.request_surface)
    checked: dict[str, dict[str, str]] = {}
    contract = by_name.get(NAME)
    if contract is not None and contract.verdict in ("passed", "failed"):
        failed = set(contract.figures.get("failed_probes") or [])
        for f, probe in (contract.raw.get("covered") or {}).items():
            checked[f] = {"by": probe, "verdict": "failed" if probe.split("/")[-1] in failed else "passed"}
    for f, check in ELSEWHERE.items():
        other = by_name.get(check)
        if f in declared and other is not None and other.verdict in ("passed", "failed"):
            checked[f] = {"by": check, "verdict": other.verdict}
    unchecked = {}
    for f in declared:
        if f not in checked:
            if f in ELSEWHERE:
                why = f"{ELSEWHERE[f]} did not run"
            elif contract is None or contract.verdict not in ("passed", "failed"):
                why = f"{NAME} did not run" + (f" ({contract.verdict})" if contract is not None else "")
            else:
                why = "no probe for this field"
            unchecked[f] = why
    return {
        "declared": declared,
        "checked": checked,
        "unchecked": unchecked,
        "not_declared": [f for f in KNOWN_FIELDS if f not in declared],
    }
