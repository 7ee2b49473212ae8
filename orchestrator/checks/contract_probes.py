"""The probes of `request_contract` (checks/contract.py): one request field each, judged so that a
build which breaks the field cannot pass by accident.

Every probe asks greedy or one-token-kept questions on slot 0 without the prompt cache, one after
another, so answers it compares come from one configuration of the model and are equal on any
device. Each returns the fields it covered, the problems found and the server's answers for the
receipt. The pure judges (`*_problems`) take the server's answers as parsed JSON.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.server.client import ServerClient

SLOT = 0
GREEDY_TOKENS = 8  # the greedy reference run: the stop string is chosen in its text
N_PROBS = 4  # top entries asked per token (logit_bias needs the first three)
CHAT_TOKENS = 6  # max_tokens of the chat probes (system message, stream)
TOP_LOGPROBS = 2
HOT = 100.0  # a temperature that flattens even the tiny lab models' 30-logit margins (see sampling.py)
# A sampler setting that keeps many tokens: at HOT, N_PREDICT tokens all equal to greedy have a
# chance below 40**-GREEDY_TOKENS on a flat top 40 (1e-13 for 8).
KEEP_MANY = {"top_k": 40, "top_p": 1.0, "min_p": 0.0}
KEEP_ONE = {
    "top_k": {"top_k": 1, "top_p": 1.0, "min_p": 0.0},
    "top_p": {"top_k": 0, "top_p": 1e-6, "min_p": 0.0},
}
SYSTEM_A = "You are a terse assistant. Answer in one word."
SYSTEM_B = "You are pairctl's probe; reply with a single short sentence, please."
USER = "Name a colour."
GRAMMAR = 'root ::= [a-z] [a-z] [a-z]? "-" [0-9] [0-9]'
GRAMMAR_RE = re.compile(r"[a-z]{2,3}-[0-9]{2}")
GRAMMAR_TOKENS = 16
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["colour", "ok"],
    "additionalProperties": False,
}
SCHEMA_TOKENS = 256  # bounded: the schema's grammar allows at most 20 blanks between items


@dataclass
class ProbeResult:
    name: str
    fields: tuple[str, ...]
    problems: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


class Prober:
    """Sends the probes' requests: `/completion` on a token prompt, chat on fixed messages."""

    def __init__(self, client: ServerClient, prompt: list[int], timeout: float) -> None:
        self.client = client
        self.prompt = prompt
        self.timeout = timeout

    def completion(self, n_predict: int, **params: Any) -> dict[str, Any]:
        return self.client.completion_raw(
            self.prompt, n_predict, cache_prompt=False, id_slot=SLOT, timeout=self.timeout, **params
        )

    def chat_body(self, messages: list[dict[str, str]], max_tokens: int, **params: Any) -> dict[str, Any]:
        return {
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "cache_prompt": False,
            "id_slot": SLOT,
            **params,
        }

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        out = self.client.post_json("/v1/chat/completions", {**body, "stream": False}, timeout=self.timeout)
        if not isinstance(out, dict):
            raise ValueError(f"/v1/chat/completions answered a {type(out).__name__}, not a JSON object")
        return out


# -- pure judges -------------------------------------------------------------------------------


def tokens_of(body: dict[str, Any]) -> list[int]:
    return [int(t) for t in body.get("tokens") or []]


def top_entries(body: dict[str, Any], i: int) -> list[dict[str, Any]]:
    probs = body.get("completion_probabilities") or []
    if i >= len(probs) or not isinstance(probs[i], dict):
        return []
    return [e for e in probs[i].get("top_logprobs") or [] if isinstance(e, dict)]


def n_predict_problems(body: dict[str, Any], n: int) -> list[str]:
    """`/completion` asked for `n` tokens (ignore_eos): `n` tokens, stop_type limit."""
    out = []
    toks = tokens_of(body)
    if len(toks) != n or body.get("tokens_predicted") != n:
        out.append(
            f"n_predict {n}: the server returned {len(toks)} tokens (tokens_predicted {body.get('tokens_predicted')!r})"
        )
    if body.get("stop_type") != "limit":
        out.append(f"n_predict {n}: stop_type is {body.get('stop_type')!r}, not 'limit'")
    return out


def n_probs_problems(body: dict[str, Any], k: int, *, drafting: bool) -> list[str]:
    """Every generated token carries `k` top entries, sorted, log-probabilities, mass at most 1;
    at the first token (never drafted) the greedy token is on top. An accepted drafted token may
    carry none (the pinned server fills them only for a token sampled from its own position)."""
    out = []
    probs = body.get("completion_probabilities") or []
    toks = tokens_of(body)
    if len(probs) != len(toks):
        out.append(f"n_probs {k}: {len(probs)} completion_probabilities for {len(toks)} tokens")
    for i in range(len(probs)):
        top = top_entries(body, i)
        given = [e.get("logprob") for e in top]
        if len(top) != k and not (drafting and i > 0 and not top):
            out.append(f"n_probs {k}: token {i} carries {len(top)} top entries")
            break
        if not all(isinstance(x, (int, float)) and x <= 1e-6 for x in given):
            out.append(f"n_probs {k}: token {i}'s top logprobs are not log-probabilities: {given}")
            break
        lps = [float(x) for x in given]  # type: ignore[arg-type]
        if any(b > a + 1e-6 for a, b in zip(lps, lps[1:], strict=False)):
            out.append(f"n_probs {k}: token {i}'s top entries are not sorted by logprob: {lps}")
            break
        if sum(math.exp(x) for x in lps) > 1.0 + 1e-3:
            out.append(f"n_probs {k}: token {i}'s top {k} probabilities add up to more than 1: {lps}")
            break
    top0 = top_entries(body, 0)
    if toks and top0 and top0[0].get("id") != toks[0]:
        out.append(f"n_probs {k}: greedy chose token {toks[0]} first, but the top entry there is {top0[0].get('id')!r}")
    return out


def choose_stop(content: str) -> str | None:
    """A one-character stop string whose first occurrence is after the text's start, taken from
    the second half of the text first (so the stopped text is long enough to mean something)."""
    half = len(content) // 2
    for i in list(range(max(1, half), len(content))) + list(range(1, half)):
        c = content[i]
        if c.isprintable() and not c.isspace() and content.find(c) >= 1:
            return c
    return None


def stop_problems(full: dict[str, Any], stopped: dict[str, Any], stop: str) -> list[str]:
    """The stopped answer is the free answer's text before the first `stop`, with stop_type word."""
    text = str(full.get("content") or "")
    want = text[: text.find(stop)]
    got = stopped.get("content")
    out = []
    if got != want:
        out.append(f"stop {stop!r}: the text is {got!r}, want the text before the first {stop!r}: {want!r}")
    if stopped.get("stop_type") != "word" or stopped.get("stopping_word") != stop:
        out.append(
            f"stop {stop!r}: stop_type {stopped.get('stop_type')!r}, stopping_word {stopped.get('stopping_word')!r} "
            f"(want 'word', {stop!r})"
        )
    return out


def logit_bias_problems(greedy: dict[str, Any], banned: dict[str, Any], boosted: dict[str, Any]) -> list[str]:
    """Banning the greedy first token gives the second-ranked one; boosting the third-ranked one
    past the first gives it."""
    top = top_entries(greedy, 0)
    out = []
    if len(top) < 3:
        return [f"logit_bias: the greedy reference carries {len(top)} top entries at token 0, need 3"]
    got = tokens_of(banned)[:1]
    if got != [top[1].get("id")]:
        out.append(
            f"logit_bias: token {top[0].get('id')} banned, the server chose {got} instead of the second-ranked "
            f"{top[1].get('id')}"
        )
    got = tokens_of(boosted)[:1]
    if got != [top[2].get("id")]:
        out.append(f"logit_bias: token {top[2].get('id')} raised above the top token, the server chose {got}")
    return out


def boost_for(greedy: dict[str, Any]) -> tuple[int, float] | None:
    """The third-ranked first token and a bias that puts it 2 nats above the first."""
    top = top_entries(greedy, 0)
    if len(top) < 3:
        return None
    return int(top[2]["id"]), round(float(top[0]["logprob"]) - float(top[2]["logprob"]) + 2.0, 3)


def keep_one_problems(name: str, greedy: list[int], sampled: list[int]) -> list[str]:
    if sampled != greedy:
        return [
            f"{name}: a setting that keeps one token at temperature {HOT} gave {sampled}, the greedy tokens are "
            f"{greedy}: the parameter is not applied"
        ]
    return []


def keep_many_problems(greedy: list[int], sampled: list[int]) -> list[str]:
    if sampled == greedy:
        return [
            f"temperature: {HOT} with top_k {KEEP_MANY['top_k']} gave the greedy tokens {greedy}: the temperature "
            "is not applied"
        ]
    return []


def chat_choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices") or []
    return choices[0] if choices and isinstance(choices[0], dict) else {}


def chat_text(answer: dict[str, Any]) -> str:
    msg = chat_choice(answer).get("message") or {}
    return str(msg.get("content") or "")


def max_tokens_problems(answer: dict[str, Any], n: int) -> list[str]:
    usage = answer.get("usage") or {}
    choice = chat_choice(answer)
    out = []
    if usage.get("completion_tokens") != n or choice.get("finish_reason") != "length":
        out.append(
            f"max_tokens {n} (ignore_eos): usage.completion_tokens {usage.get('completion_tokens')!r}, "
            f"finish_reason {choice.get('finish_reason')!r} (want {n}, 'length')"
        )
    return out


def logprobs_problems(answer: dict[str, Any], n: int, k: int, *, drafting: bool) -> list[str]:
    """One logprobs entry a token, each with `k` top_logprobs (none allowed for a drafted token
    after the first on a drafting pair, as for n_probs)."""
    content = (chat_choice(answer).get("logprobs") or {}).get("content")
    if not isinstance(content, list) or len(content) != n:
        return [f"logprobs: {len(content) if isinstance(content, list) else content!r} entries for {n} tokens"]
    out = []
    for i, e in enumerate(content):
        top = e.get("top_logprobs") if isinstance(e, dict) else None
        if not isinstance(top, list) or (len(top) != k and not (drafting and i > 0 and not top)):
            out.append(f"logprobs: token {i} carries {len(top) if isinstance(top, list) else top!r} top_logprobs, "
                       f"asked {k}")  # fmt: skip
            break
    return out


def template_problems(with_a: str, with_b: str, without: str, user: str) -> list[str]:
    """The system text appears verbatim in the rendered prompt, before the user's, at a place that
    does not depend on what it says (A's rendering with A's text swapped for B's is B's rendering),
    and the prompt without it differs."""
    out = []
    if with_a.count(SYSTEM_A) != 1 or with_a.find(SYSTEM_A) > with_a.rfind(user):
        out.append(f"messages: the rendered prompt does not hold the system message once, before the user's: "
                   f"{with_a!r}")  # fmt: skip
    elif with_a.replace(SYSTEM_A, SYSTEM_B) != with_b:
        out.append(f"messages: two system messages render differently beyond their text: {with_a!r} vs {with_b!r}")
    if without == with_a or SYSTEM_A in without:
        out.append(f"messages: the prompt without a system message is {without!r}")
    if user not in without:
        out.append(f"messages: the user's message is missing from the rendered prompt {without!r}")
    return out


def stream_problems(events: list[dict[str, Any]], answer: dict[str, Any]) -> list[str]:
    """The stream of a chat answer: one role chunk first, deltas adding up to the non-streamed
    message, exactly one chunk with a finish_reason (the non-streamed one) and no content after
    it, then a usage chunk (include_usage) equal to the non-streamed usage."""
    out = []
    with_choices = [e for e in events if e.get("choices")]
    text, after_finish = "", False
    finishes: list[tuple[int, Any]] = []
    for i, e in enumerate(with_choices):
        c = e["choices"][0] if isinstance(e["choices"][0], dict) else {}
        delta = c.get("delta") or {}
        if finishes and delta.get("content"):
            after_finish = True
        text += str(delta.get("content") or "")
        if c.get("finish_reason") is not None:
            finishes.append((i, c.get("finish_reason")))
    if text != chat_text(answer):
        out.append(f"stream: the deltas add up to {text!r}, the non-streamed message is {chat_text(answer)!r}")
    want = chat_choice(answer).get("finish_reason")
    if [f for _, f in finishes] != [want] or (finishes and finishes[0][0] != len(with_choices) - 1) or after_finish:
        out.append(f"stream: finish_reason chunks {finishes} of {len(with_choices)}, want one, last, {want!r}")
    if with_choices and ((with_choices[0]["choices"][0].get("delta") or {}).get("role")) != "assistant":
        out.append("stream: the first chunk does not carry the role 'assistant'")
    usage: list[dict[str, Any]] = [
        e["usage"] for e in events if not e.get("choices") and isinstance(e.get("usage"), dict)
    ]
    want_usage = answer.get("usage") or {}
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    if len(usage) != 1 or {k: usage[0].get(k) for k in keys} != {k: want_usage.get(k) for k in keys}:
        out.append(f"stream_options: usage chunks {usage}, the non-streamed usage is {want_usage}")
    return out


def grammar_problems(body: dict[str, Any]) -> list[str]:
    text = str(body.get("content") or "")
    if not GRAMMAR_RE.fullmatch(text) or body.get("stop_type") != "eos":
        return [f"grammar {GRAMMAR!r}: the answer is {text!r} with stop_type {body.get('stop_type')!r} "
                f"(want a full match of {GRAMMAR_RE.pattern} ended by eos)"]  # fmt: skip
    return []


def schema_problems(answer: dict[str, Any]) -> list[str]:
    text = chat_text(answer)
    reason = chat_choice(answer).get("finish_reason")
    try:
        obj = json.loads(text)
    except ValueError:
        return [f"response_format json_schema: the answer {text!r} (finish_reason {reason!r}) is not JSON"]
    props = SCHEMA["properties"]
    ok = (
        isinstance(obj, dict)
        and set(obj) == set(props)
        and obj.get("colour") in props["colour"]["enum"]
        and isinstance(obj.get("ok"), bool)
    )
    if not ok or reason != "stop":
        return [f"response_format json_schema: {text!r} (finish_reason {reason!r}) does not match {SCHEMA}"]
    return []
