"""Gates of the reference-logprob comparison (`checks.reference_logprobs`), declared in the route
profile so they are part of what is deployed and hashed.

The figures are the ones llama.cpp's `llama-perplexity --kl-divergence` reports (mean and
maximum KL divergence of the candidate's next-token distribution from the reference's, top-1
agreement) plus the largest |delta logprob| over the whole top-K set, which is the figure that
moves on a peaked model where KL barely does. Defaults: see docs/reference-answers.md for the
measured noise floor of a legitimate numeric change and the mutants they must reject.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.config.base import StrictModel


class ReferenceGates(StrictModel):
    top_k: int = Field(default=0, ge=0, description="logprobs read per position (n_probs); 0: the whole vocabulary")
    max_mean_kl: float = Field(default=2e-5, ge=0, description="mean KL(reference || candidate) over positions, nats")
    max_kl: float = Field(default=1e-4, ge=0, description="largest KL at any one position, nats")
    min_top1: float = Field(default=0.99, ge=0, le=1, description="share of positions whose greedy token agrees")
    max_abs_dlogprob: float = Field(default=1.0, ge=0, description="largest |delta logprob| over the top-K set, nats")
    logprob_floor: float = Field(
        default=-80.0, le=0, description="logprobs below this count as this (float32 rounding rules far below)"
    )
