"""Pure parsers of llama-server responses; tested with output captured from the real server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.server.models import CompletionResult, Props, ServerError, SlotState, StreamChunk

M = TypeVar("M", bound=BaseModel)


class ParseError(ValueError):
    """A response did not have the shape this pinned llama-server produces."""


def _obj(data: Any, what: str, kind: type[dict[str, Any]] | type[list[Any]] = dict) -> Any:
    """`data` (JSON text, or already parsed) as a JSON object (or list, `kind`)."""
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ParseError(f"{what}: not JSON: {exc}") from None
    if not isinstance(data, kind):
        raise ParseError(f"{what}: expected a JSON {'object' if kind is dict else 'list'}, got {type(data).__name__}")
    return data


def _model(model: type[M], data: dict[str, Any], what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ParseError(f"{what}: {exc}") from None


def parse_props(data: Any) -> Props:
    d = _obj(data, "/props")
    try:
        n_ctx = d["default_generation_settings"]["n_ctx"]
    except (KeyError, TypeError):
        raise ParseError("/props: no default_generation_settings.n_ctx") from None
    return _model(Props, {**d, "n_ctx_per_slot": n_ctx}, "/props")


def parse_slots(data: Any) -> list[SlotState]:
    data = _obj(data, "/slots", list)
    out = []
    for s in data:
        if not isinstance(s, dict):
            raise ParseError("/slots: an entry is not an object")
        nt = s.get("next_token")
        n_decoded = nt[0].get("n_decoded") if isinstance(nt, list) and nt and isinstance(nt[0], dict) else None
        # drop the slot's prompt/generated text: it can be a whole context long
        slim = {k: v for k, v in s.items() if k not in ("prompt", "generated", "params")}
        out.append(_model(SlotState, {**slim, "n_decoded": n_decoded}, "/slots"))
    return out


def parse_completion(data: Any) -> CompletionResult:
    d = _obj(data, "/completion")
    if "error" in d:
        raise ParseError(f"/completion: server error: {d['error']}")
    return _model(CompletionResult, d, "/completion")


def parse_error(data: Any) -> ServerError | None:
    """The server's error object, or None when the body is not one."""
    try:
        d = _obj(data, "error")
    except ParseError:
        return None
    err = d.get("error")
    if not isinstance(err, dict):
        return None
    try:
        return ServerError.model_validate(err)
    except ValidationError:
        return None


def parse_tokenize(data: Any) -> list[int]:
    d = _obj(data, "/tokenize")
    toks = d.get("tokens")
    if not isinstance(toks, list):
        raise ParseError("/tokenize: no tokens list")
    # with_pieces gives [{"id": .., "piece": ..}]
    return [t["id"] if isinstance(t, dict) else int(t) for t in toks]


def parse_detokenize(data: Any) -> str:
    d = _obj(data, "/detokenize")
    content = d.get("content")
    if not isinstance(content, str):
        raise ParseError("/detokenize: no content string")
    return content


def parse_sse_lines(lines: Iterable[str]) -> Iterator[StreamChunk]:
    """Server-sent events of a streaming /completion, each a StreamChunk."""
    for d in parse_sse_events(lines, what="stream chunk"):
        yield _model(StreamChunk, d, "stream chunk")


def parse_sse_events(lines: Iterable[str], *, what: str = "stream event") -> Iterator[dict[str, Any]]:
    """Server-sent events of any streaming endpoint (`/v1/chat/completions`): each `data: {json}`
    line as a JSON object, until `data: [DONE]`; other lines (blank separators, `:` comments) are
    passed over; an `error:` line or an error object raises."""
    for line in lines:
        line = line.strip()
        if line.startswith("error:"):
            raise ParseError(f"stream: server error: {line[6:].strip()}")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        d = _obj(payload, what)
        if "error" in d:
            raise ParseError(f"stream: server error: {d['error']}")
        yield d


_METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\d+)?$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition of `/metrics` -> {name: value}; `llamacpp:` prefix kept off.

    Labelled series (none in the pinned server) are keyed `name{labels}`.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if not m:
            raise ParseError(f"/metrics: cannot parse line {line!r}")
        name, labels, value = m.groups()
        if name.startswith("llamacpp:"):
            name = name[len("llamacpp:") :]
        try:
            v = float(value)
        except ValueError:
            raise ParseError(f"/metrics: bad value in {line!r}") from None
        out[name + (labels or "")] = v
    return out


def _logprob(v: Any) -> float:
    return float("-inf") if v is None else float(v)


def parse_token_logprobs(data: Any, where: str) -> tuple[list[int], list[dict[int, float]]]:
    """The generated token ids and each position's `{id: logprob}` from llama-server's
    pre-sampling probabilities: `completion_probabilities` of `/completion`, or
    `choices[0].logprobs.content` of `/v1/completions` and `/v1/chat/completions`."""
    d = _obj(data, where)
    if "completion_probabilities" in d:
        entries = d["completion_probabilities"]
    else:
        try:
            entries = d["choices"][0]["logprobs"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ParseError(f"{where}: no logprobs in the answer (keys: {sorted(d)[:12]})") from None
    if not isinstance(entries, list):
        raise ParseError(f"{where}: logprobs are not a list")
    tokens: list[int] = []
    positions: list[dict[int, float]] = []
    try:
        for e in entries:
            tokens.append(int(e["id"]))
            # JSON has no inf/NaN: the server writes a non-finite logprob as null; it counts as -inf
            # (the comparison clamps it at its floor), a numeric failure, not a malformed answer
            top = e["top_logprobs"]
            positions.append({int(t["id"]): _logprob(t["logprob"]) for t in top})
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseError(f"{where}: malformed logprob entry ({type(exc).__name__}: {exc})") from None
    return tokens, positions
