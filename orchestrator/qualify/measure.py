"""One measured request (streamed: the client's TTFT and wall time plus the server's `timings`
of the same request), and the exact prompts both arms send: cold (`cache_prompt: false`) and
exactly `n_predict` generated tokens (`ignore_eos`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator import interrupt
from orchestrator.errors import ConfigError, PairctlError
from orchestrator.hashing import sha256_json
from orchestrator.qualify.plan import LoadedPlan

MemoryProbe = Callable[[], tuple[int | None, str]]
_TIMINGS = "prompt_n prompt_ms prompt_per_second predicted_n predicted_ms predicted_per_second".split()
_TIMINGS += ["draft_n", "draft_n_accepted", "cache_n"]


@dataclass(frozen=True)
class Prompt:
    """The token ids a fixture sends (a prefix of its tokenized text) and their hash."""

    fixture: str
    family: str
    fixture_sha256: str
    tokens: tuple[int, ...]

    @property
    def sha256(self) -> str:
        return sha256_json(list(self.tokens))


def prompts_for(loaded: LoadedPlan, tokenize: Callable[[str], list[int]], per_slot_ctx: int) -> list[Prompt]:
    """Each fixture tokenized by the server and cut to the plan's `tokens`; one too short, or not
    fitting the server's slot, is a config error naming the fixture."""
    plan = loaded.plan
    out = []
    for fx in plan.fixtures:
        ids = tokenize(loaded.fixture_text(fx.name))
        want = fx.tokens or len(ids)
        if len(ids) < want:
            raise ConfigError(
                f"fixture {fx.name!r}: its text is {len(ids)} tokens with this model's tokenizer, the plan needs {want}"
            )
        if want + plan.n_predict > per_slot_ctx:
            raise ConfigError(
                f"fixture {fx.name!r}: {want} prompt + {plan.n_predict} generated tokens do not fit the server's "
                f"per-slot context of {per_slot_ctx}"
            )
        out.append(Prompt(fx.name, fx.family, fx.sha256, tuple(ids[:want])))
    return out


def request_params(plan_seed: int, temperature: float) -> dict[str, Any]:
    params = {"cache_prompt": False, "ignore_eos": True, "temperature": temperature, "seed": plan_seed}
    return {**params, "return_tokens": True}


def measure(
    client: Any,
    prompt: Prompt,
    *,
    n_predict: int,
    params: dict[str, Any],
    memory: MemoryProbe | None,
    base: dict[str, Any],
) -> dict[str, Any]:
    """One streaming request -> one sample dict. A failed request
    is a sample with ok=False and the error, never an exception: the analysis decides. A signal
    (orchestrator/interrupt.py) stops the arm here, between requests; the pair is then restored."""
    interrupt.check(f"before a qualification request ({prompt.fixture})")
    row: dict[str, Any] = {
        **base,
        "fixture": prompt.fixture,
        "family": prompt.family,
        "fixture_sha256": prompt.fixture_sha256,
        "prompt_sha256": prompt.sha256,
        "prompt_tokens": len(prompt.tokens),
        "ok": False,
        "error": None,
    }
    t0 = time.monotonic()
    ttft = None
    final = None
    n_chunks = 0
    try:
        with client.stream_completion(list(prompt.tokens), n_predict, **params) as (_handle, chunks):
            for ch in chunks:
                n_chunks += 1
                if ttft is None and (ch.content or ch.tokens):
                    ttft = time.monotonic() - t0
                if ch.stop:
                    final = ch
                    break
        wall = time.monotonic() - t0
    except (PairctlError, ValueError) as exc:  # ValueError: the server parsers' ParseError
        row.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:500]}", wall_s=time.monotonic() - t0)
        return row
    row.update(wall_s=wall, ttft_s=ttft, chunks=n_chunks)
    if final is None or final.timings is None:
        row["error"] = "the stream ended without a final event carrying timings"
        return row
    t = final.timings
    row["ok"] = True
    row.update({k: getattr(t, k) for k in _TIMINGS}, stop_type=getattr(final, "stop_type", None))
    if memory is not None:
        try:
            peak, source = memory()
        except PairctlError as exc:
            peak, source = None, f"probe failed: {str(exc).splitlines()[0][:200]}"
        row.update(peak_memory_bytes=peak, memory_source=source)
    else:
        row.update(peak_memory_bytes=None, memory_source="not measured")
    return row


def warmup(client: Any, loaded: LoadedPlan, params: dict[str, Any]) -> dict[str, Any]:
    """The one fixed request after a fresh load; recorded, never measured."""
    w = loaded.plan.warmup
    t0 = time.monotonic()
    res = client.completion(w.prompt, w.n_predict, **params)
    wall = time.monotonic() - t0
    return {"prompt": w.prompt, "n_predict": w.n_predict, "predicted_n": res.timings.predicted_n, "wall_s": wall}
