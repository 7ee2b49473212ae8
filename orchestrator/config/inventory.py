"""Inventories: hosts (how to reach them, where to install) and pairs (a native + an RPC host)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.loader import expand, load_model
from orchestrator.errors import ConfigError
from orchestrator.paths import MANIFESTS

ANY_ADDRESSES = {"0.0.0.0", "::", "[::]", "*", ""}


class ModelRef(StrictModel):
    path: str = Field(description="path of the GGUF on the native host")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class HostSpec(StrictModel):
    address: str = Field(min_length=1)
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    key: str | None = Field(default=None, description="private key for this host (operator side)")
    install_root: str = Field(description="absolute directory on the host: releases/, current, previous, leases/, run/")
    role: Literal["native", "rpc"]
    transport: Literal["ssh", "local"] = "ssh"
    gpu: str | None = Field(default=None, description="expected GPU, e.g. 'Tesla V100'; none for CPU lab hosts")

    @field_validator("install_root")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not (v.startswith("/") or v.startswith("${") or v.startswith("~")):
            raise ValueError("install_root must be an absolute path")
        if v.rstrip("/") in ("", "/"):
            raise ValueError("install_root may not be /")
        return v


class PairSpec(StrictModel):
    native: str
    rpc: str
    profile: str = Field(default="lab", description="default route profile for this pair")
    server_port: int = Field(default=8080, ge=1, le=65535)
    server_bind: str | None = Field(default=None, description="llama-server --host; default: the native host's address")
    rpc_port: int = Field(default=50052, ge=1, le=65535)
    rpc_bind: str | None = Field(default=None, description="ggml-rpc-server -H; default: the RPC host's address")
    allow_rpc_bind_any: bool = Field(
        default=False, description="explicit opt-in to bind ggml-rpc-server to all interfaces (it is not secure)"
    )
    models: dict[str, ModelRef] = Field(default_factory=dict)
    api_key_file: str | None = Field(default=None, description="operator-side file holding the API key (never argv)")
    target_native: str | None = Field(default=None, description="build target expected on the native host")
    target_rpc: str | None = Field(default=None, description="build target expected on the RPC host")

    @model_validator(mode="after")
    def _check(self) -> "PairSpec":
        if self.native == self.rpc:
            raise ValueError("native and rpc must be two different hosts")
        if self.rpc_bind is not None and self.rpc_bind.strip() in ANY_ADDRESSES and not self.allow_rpc_bind_any:
            raise ValueError(
                f"rpc_bind {self.rpc_bind!r} exposes ggml-rpc-server on every interface, and it is not secure; "
                "name one address, or set allow_rpc_bind_any: true to opt in explicitly"
            )
        for name in (self.rpc_bind, self.server_bind):
            if name and name.strip() not in ANY_ADDRESSES:
                _check_address(name)
        return self


def _check_address(value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not value.replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"{value!r} is neither an IP address nor a host name") from None


class Inventory(StrictModel):
    known_hosts: str = Field(default="~/.ssh/known_hosts", description="strict host-key checking against this file")
    use_ssh_config: bool = Field(default=False, description="fill user/port/key left out here from ~/.ssh/config")
    keep_releases: int = Field(default=5, ge=1, description="releases kept per host by deploy and `releases prune`")
    hosts: dict[str, HostSpec]
    pairs: dict[str, PairSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "Inventory":
        for pname, pair in self.pairs.items():
            for side, expect in (("native", "native"), ("rpc", "rpc")):
                host = getattr(pair, side)
                if host not in self.hosts:
                    raise ValueError(f"pair {pname!r}: {side} host {host!r} is not in hosts ({sorted(self.hosts)})")
                if self.hosts[host].role != expect:
                    raise ValueError(f"pair {pname!r}: host {host!r} has role {self.hosts[host].role}, expected {expect}")
            rpc_host = self.hosts[pair.rpc]
            bind = pair.rpc_bind or rpc_host.address
            if bind.strip() in ANY_ADDRESSES and not pair.allow_rpc_bind_any:
                raise ValueError(f"pair {pname!r}: rpc host address {bind!r} binds every interface; set rpc_bind")
        return self

    def pair(self, name: str) -> PairSpec:
        try:
            return self.pairs[name]
        except KeyError:
            raise ConfigError(f"no pair named {name!r} in the inventory (pairs: {', '.join(sorted(self.pairs)) or 'none'})") from None

    def host(self, name: str) -> HostSpec:
        try:
            return self.hosts[name]
        except KeyError:
            raise ConfigError(f"no host named {name!r} in the inventory (hosts: {', '.join(sorted(self.hosts))})") from None

    def rpc_bind(self, pair: str) -> str:
        p = self.pair(pair)
        return p.rpc_bind or self.hosts[p.rpc].address

    def server_bind(self, pair: str) -> str:
        p = self.pair(pair)
        return p.server_bind or self.hosts[p.native].address

    def resolved(self, variables: dict[str, str] | None = None) -> "Inventory":
        """A copy with `${VAR}` and `~` expanded in every path."""
        def hx(h: HostSpec) -> HostSpec:
            return h.model_copy(update={
                "install_root": expand(h.install_root, variables),
                "key": expand(h.key, variables) if h.key else None,
            })

        def px(p: PairSpec) -> PairSpec:
            return p.model_copy(update={
                "models": {k: m.model_copy(update={"path": expand(m.path, variables)}) for k, m in p.models.items()},
                "api_key_file": expand(p.api_key_file, variables) if p.api_key_file else None,
            })

        return self.model_copy(update={
            "known_hosts": expand(self.known_hosts, variables),
            "hosts": {k: hx(h) for k, h in self.hosts.items()},
            "pairs": {k: px(p) for k, p in self.pairs.items()},
        })


@dataclass(frozen=True)
class ApiKey:
    """A pair's API key: the file as uploaded for `--api-key-file`, and what clients send."""

    file_bytes: bytes = field(repr=False)
    value: str = field(repr=False)  # the file's first non-empty line (sent as the Bearer token)

    def __repr__(self) -> str:
        return "ApiKey(***)"


def read_api_key(pair_name: str, pair: PairSpec) -> ApiKey | None:
    """Read the operator-side key file once, the same way for deploy, rollback and accept.
    An unreadable or empty file is a config error, never a silent "no key"."""
    if not pair.api_key_file:
        return None
    try:
        data = Path(pair.api_key_file).read_bytes()
    except OSError as exc:
        raise ConfigError(f"pair {pair_name}: cannot read api_key_file {pair.api_key_file}: {exc.strerror}") from None
    value = next((ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()), "")
    if not value:
        raise ConfigError(f"pair {pair_name}: api_key_file {pair.api_key_file} is empty")
    return ApiKey(file_bytes=data, value=value)


def inventories_dir() -> Path:
    return MANIFESTS / "inventories"


def load_inventory(name_or_path: str, variables: dict[str, str] | None = None) -> Inventory:
    p = search.resolve_ref("inventory", name_or_path)
    return load_model(Inventory, p).resolved(variables)
