"""How `checks.rpc_consistency` judges the RPC host's half on its own, declared in the route profile.

The check computes the same fixtures twice with the same package and model: through the live pair
(layers on the RPC device) and through a probe llama-server on the native host with no `--rpc`
(the same layers on the native device). The gate on the difference is derived from the measured
floor of that comparison on a healthy build: `max(factor * floor, minimum)`. Floor, factor,
minimum and the derived gate are written into the receipt with the figures.

Defaults are the lab's, measured 2026-12-05 with the baseline package on both lab profiles
(docs/guides/acceptance.md, "The RPC host's half on its own"): both devices are CPUs running the same ggml code and
agree bit for bit; the floor is the 6-digit rounding of the recorded answers. The minimum sits 200
times above that floor (the same 5e-7 nats as the replay floor in docs/reference-answers.md). A
pair whose two devices differ (a V100 and an RTX 5060 Ti) must measure its own floor (`pairctl
accept --checks rpc_consistency` on a build it trusts reports it) and declare it here with where
it came from.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.config.base import StrictModel


class RpcConsistency(StrictModel):
    enabled: bool = Field(default=True, description="false: the check is skipped (with its reason in the receipt)")
    fixtures: str = Field(default="rpc-probe", description="reference fixture set (name or path) the probe computes")
    floor_abs_dlogprob: float = Field(
        default=5e-7, ge=0, description="measured largest |delta logprob| between the two devices on a healthy build"
    )
    floor_max_kl: float = Field(default=5.1e-14, ge=0, description="measured largest KL on a healthy build")
    floor_source: str = Field(
        default="lab, 2026-12-05: baseline 9d37488533, CPU RPC device vs CPU; lab 5.0e-7 / KL 1.4e-28, lab-real "
        "5.0e-7 / KL 5.0e-14 (the 6-digit rounding of recorded answers: the devices agree bit for bit)",
        description="where the floor was measured (kept in the receipt)",
    )
    factor: float = Field(default=10.0, ge=1, description="gate = max(factor * floor, minimum)")
    min_abs_dlogprob: float = Field(default=1e-4, gt=0, description="absolute minimum of the |delta logprob| gate")
    min_max_kl: float = Field(default=1e-9, gt=0, description="absolute minimum of the KL gate")
    port_offset: int = Field(
        default=1, ge=1, le=1000, description="the probe llama-server listens on the pair's server_port + this"
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="the probe's --threads (default: the profile's); with a quantized KV cache ggml's CPU "
        "threads split rows, never a sum, so the count changes no number (the lab's floor is the same at 1 "
        "and 2); with an f16/f32 cache under flash attention the CPU kernel sums the cache in thread order, "
        "so set it to the RPC host's ggml-rpc-server thread count (its default: hardware threads / 2)",
    )
    start_timeout_s: float = Field(default=120.0, gt=0, description="bound on the probe server becoming healthy")

    def gate_abs_dlogprob(self) -> float:
        return max(self.factor * self.floor_abs_dlogprob, self.min_abs_dlogprob)

    def gate_max_kl(self) -> float:
        return max(self.factor * self.floor_max_kl, self.min_max_kl)
