"""pydantic models of llama-server's responses, for the fields pairctl relies on.

Unknown fields are kept (`extra="allow"`), so a newer server adding fields never breaks
parsing, while a missing field the checks depend on does.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class Timings(_Lenient):
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    prompt_per_second: float | None = None
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_second: float | None = None
    # present only when drafting happened
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @property
    def draft_rejected(self) -> int | None:
        if self.draft_n is None or self.draft_n_accepted is None:
            return None
        return self.draft_n - self.draft_n_accepted


class CompletionResult(_Lenient):
    """The final (non-OAI) `/completion` response."""

    content: str
    tokens: list[int] = Field(default_factory=list)
    id_slot: int
    tokens_predicted: int
    tokens_evaluated: int
    tokens_cached: int = 0
    truncated: bool
    stop_type: str
    stopping_word: str = ""
    timings: Timings = Field(default_factory=Timings)

    @property
    def population(self) -> int:
        """Tokens this request put into its slot (prompt plus generation)."""
        return self.tokens_evaluated + self.tokens_predicted


class StreamChunk(_Lenient):
    """One server-sent event of a streaming `/completion`."""

    content: str = ""
    tokens: list[int] = Field(default_factory=list)
    stop: bool = False
    id_slot: int | None = None
    tokens_predicted: int | None = None
    tokens_evaluated: int | None = None
    timings: Timings | None = None


class SlotState(_Lenient):
    """One entry of `GET /slots`."""

    id: int
    n_ctx: int
    speculative: bool = False
    is_processing: bool
    id_task: int | None = None
    n_prompt_tokens: int | None = None
    n_prompt_tokens_processed: int | None = None
    n_prompt_tokens_cache: int | None = None
    n_decoded: int | None = None

    @property
    def population(self) -> int:
        """Tokens in the slot now: `n_prompt_tokens` is the slot's token list, which grows with
        each generated token (captured: 402 prompt + 9 decoded reads 410), so it is not added to."""
        return self.n_prompt_tokens or 0


class Props(_Lenient):
    """`GET /props`: what pairctl reads for identity and sizing."""

    build_info: str
    total_slots: int
    model_path: str = ""
    n_ctx_per_slot: int = Field(description="default_generation_settings.n_ctx")
    endpoint_slots: bool | None = None
    endpoint_metrics: bool | None = None
    is_sleeping: bool | None = None


class ServerError(_Lenient):
    """llama-server's error object: `{"error": {"code", "message", "type", ...}}`."""

    code: int
    message: str
    type: str
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None
