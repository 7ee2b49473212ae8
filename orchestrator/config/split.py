"""What a route profile expects of the model's split between the pair's devices (`split`).

A profile that declares `split` makes llama-server log the split; identity (`checks.split`) fails
when the RPC device holds less than declared, e.g. an RPC host that serves nothing.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.config.base import StrictModel

LOG_VERBOSITY = 4  # llama-server's -lv level that prints the load log's buffer sizes and layer count


class SplitExpectation(StrictModel):
    rpc_min_layers: int = Field(default=1, ge=0, description="layers the RPC device(s) must hold at least")
    rpc_min_model_mib: float = Field(default=0.0, ge=0, description="MiB of weights the RPC device(s) must hold")
    rpc_kv: bool = Field(default=True, description="the RPC device(s) must hold part of the KV cache")
