"""How `checks.rpc_consistency` judges the RPC host's half on its own, declared in the route profile.

The check computes the same fixtures through the live pair and through a probe llama-server on the
native host with no `--rpc`; the gate on the difference is `max(factor * floor, minimum)`, floor
measured on a healthy build, all written into the receipt. The defaults are the lab's (two CPUs that
agree bit for bit: docs/guides/acceptance.md); a pair of two different devices declares its own
measured floor here with where it came from.
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
