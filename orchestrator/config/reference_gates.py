"""Gates of the reference-logprob comparison (`checks.reference_logprobs`), declared in the route profile.

The figures are those of `llama-perplexity --kl-divergence` (mean and max KL, top-1 agreement) plus
the largest |delta logprob| over the top-K set, which moves on a peaked model where KL barely does.
The KL and |delta logprob| gates derive from the reference pair's own replay floor times
`floor_factor`, never below `minimum`; a candidate at another numerics key is judged only through a
`tolerance` that names its reason. See docs/reference-answers.md.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.config.base import StrictModel


class GateFigures(StrictModel):
    """Bounds on the three figures that measure distance (nats)."""

    max_mean_kl: float = Field(ge=0, description="mean KL(reference || candidate) over positions")
    max_kl: float = Field(ge=0, description="largest KL at any one position")
    max_abs_dlogprob: float = Field(ge=0, description="largest |delta logprob| over the top-K set")


# The absolute minimum of a derived gate (docs/reference-answers.md, "Gates"): 10x under the
# smallest numeric mutant's effect measured in the lab, and above what a GPU's batch-shape noise
# does to a logprob on the fixtures measured so far (H200: 5e-7).
DEFAULT_MINIMUM = GateFigures(max_mean_kl=1e-9, max_kl=1e-8, max_abs_dlogprob=2e-3)


class NumericsTolerance(StrictModel):
    """Judge a route whose numerics key has no reference answers against the answers of the
    nearest recorded key of the same model and fixtures, with these declared gates. A deliberate
    act: `reason` says why the difference is acceptable (it is kept in every receipt that uses it)."""

    reason: str = Field(min_length=8, description="why this numerics change may be judged by these gates")
    gates: GateFigures


class ReferenceGates(StrictModel):
    top_k: int = Field(default=0, ge=0, description="logprobs read per position (n_probs); 0: the whole vocabulary")
    min_top1: float = Field(default=0.99, ge=0, le=1, description="share of positions whose greedy token agrees")
    floor_factor: float = Field(
        default=20.0, ge=1, description="a KL or |dlogprob| gate is this many times the measured replay floor"
    )
    minimum: GateFigures = Field(default=DEFAULT_MINIMUM, description="absolute minimum of each derived gate")
    tolerance: NumericsTolerance | None = Field(
        default=None, description="judge a numerics key without answers against the nearest one (with a reason)"
    )
    logprob_floor: float = Field(
        default=-80.0, le=0, description="logprobs below this count as this (float32 rounding rules far below)"
    )


def derived(floor: GateFigures, factor: float, minimum: GateFigures) -> GateFigures:
    """Each gate: the measured floor times the factor, never below the absolute minimum."""
    return GateFigures(
        max_mean_kl=max(floor.max_mean_kl * factor, minimum.max_mean_kl),
        max_kl=max(floor.max_kl * factor, minimum.max_kl),
        max_abs_dlogprob=max(floor.max_abs_dlogprob * factor, minimum.max_abs_dlogprob),
    )
