"""The request surface a route promises its clients: the request fields acceptance must prove.

A route profile declares `request_surface`; the `request_contract` check probes each declared field
it can, and the receipt lists what was checked, what was not, and known fields outside the surface.
The default is an OpenAI-compatible chat client's fields plus the llama.cpp ones the project's
clients use (`top_k`, `n_predict`, `grammar`, `n_probs`).
"""

from __future__ import annotations

from typing import Literal, get_args

RequestField = Literal[
    # OpenAI chat/completions fields
    "messages",  # a system message changes the rendered prompt exactly as the template renders it
    "max_tokens",  # N tokens asked, N tokens returned (finish_reason length, usage)
    "stop",  # the text ends before the first stop string (stop_type word / finish_reason stop)
    "temperature",  # a high temperature that keeps many tokens does not give the greedy text
    "top_p",  # a top_p that keeps one token makes high-temperature sampling greedy
    "seed",  # the `sampling` check: one seed repeats, two seeds differ
    "logit_bias",  # a banned token is not chosen, a boosted one is
    "logprobs",  # OpenAI logprobs/top_logprobs: one entry per token, top_logprobs of the size asked
    "response_format",  # json_schema: the answer parses and matches the schema
    "stream",  # the chunks add up to the non-streamed answer; one final chunk with finish_reason
    "stream_options",  # include_usage: a usage chunk equal to the non-streamed usage
    "tools",  # tool calls: no probe yet (named unchecked)
    "frequency_penalty",  # no probe yet
    "presence_penalty",  # no probe yet
    # llama.cpp fields
    "n_predict",  # /completion: N tokens asked, N returned, stop_type limit
    "top_k",  # top_k 1 at a high temperature gives the greedy tokens
    "grammar",  # the answer matches the GBNF grammar
    "n_probs",  # n_probs entries per token, sorted, the greedy token on top
]
KNOWN_FIELDS: tuple[str, ...] = get_args(RequestField)
# The default surface: every known field but the two penalties, in the same order.
DEFAULT_SURFACE: tuple[RequestField, ...] = tuple(
    f for f in get_args(RequestField) if f not in ("frequency_penalty", "presence_penalty")
)
