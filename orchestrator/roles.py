"""A pair's two roles and the service each one runs: the one place they are spelled.

The service names are also argv[0]'s basename, which `pairctl-svc stop` checks before it signals.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["native", "rpc"]
ROLES: tuple[Role, Role] = ("native", "rpc")

LLAMA_SERVER = "llama-server"
RPC_SERVER = "ggml-rpc-server"
SERVICE_OF_ROLE: dict[str, str] = {"native": LLAMA_SERVER, "rpc": RPC_SERVER}
