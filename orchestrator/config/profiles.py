"""Route profiles: the exact serving configuration of a pair, rendered to llama-server's argv.

Check sizes (per-slot context, near-full targets) are derived here as llama-server derives them with
an explicit `-np`, so one check runs at 266240 tokens on the real pair and a few thousand in the lab.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.flags import check_extra_args, file_problems, is_number, normalise
from orchestrator.config.inventory import PairSpec
from orchestrator.config.loader import load_model
from orchestrator.config.reference_gates import ReferenceGates
from orchestrator.config.request_surface import DEFAULT_SURFACE, RequestField
from orchestrator.config.rpc_consistency import RpcConsistency
from orchestrator.config.split import LOG_VERBOSITY, SplitExpectation
from orchestrator.errors import ConfigError
from orchestrator.paths import MANIFESTS

QUANTIZED_KV = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}
KV_TYPES = {"f32", "f16", "bf16", *QUANTIZED_KV}


def pad(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to


def per_slot_context(ctx_size: int, parallel: int, n_ctx_train: int | None = None) -> int:
    """llama-server with an explicit `-np N` (kv_unified false):
    GGML_PAD(GGML_PAD(n_ctx, 256) / N, 256), capped at the model's trained context."""
    n = pad(pad(ctx_size, 256) // parallel, 256)
    if n_ctx_train:
        n = min(n, n_ctx_train)
    return n


class DraftConfig(StrictModel):
    spec_type: Literal["draft-simple", "draft-mtp"] = "draft-simple"
    model: str | None = Field(default=None, description="model role (from the pair's models) used as draft")
    n_max: int = Field(default=3, ge=0, le=64)
    n_min: int = Field(default=0, ge=0, le=64)
    n_gpu_layers: int | None = Field(default=None, ge=0)
    expect: list[Literal["accepted", "rejected"]] = Field(
        default=["accepted"],
        description="verification outcomes the speculative check must see: drafts accepted, drafts rejected",
    )

    @model_validator(mode="after")
    def _check(self) -> DraftConfig:
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) is greater than n_max ({self.n_max})")
        if self.spec_type == "draft-simple" and not self.model:
            raise ValueError("draft-simple needs a draft model role in 'model'")
        return self


class SpeedFloors(StrictModel):
    """How slow this route may be and still be called working (checks/budget.py). The defaults
    admit a small model on a loaded CPU; a production profile declares its pair's own floors."""

    min_prompt_tokens_per_s: float = Field(default=2.0, gt=0, description="slower prompt processing fails")
    min_generated_tokens_per_s: float = Field(default=1.0, gt=0, description="slower generation fails")
    slowdown_allowance: float = Field(
        default=4.0, ge=1.0, description="a request may take this many times its work at the measured speed"
    )
    stall_s: float | None = Field(
        default=None, gt=0, description="no progress for this long fails a request (default: from the speed)"
    )


class BatchVariance(StrictModel):
    """How far this pair's numerics may move a logprob when only the batch around a request changes
    (checks/batch_floor.py, checks/parting.py). GPU kernels are not batch-invariant: a request decoded
    beside another lane or in a verification batch may flip a greedy near-tie. By default the floor is
    measured on the pair in each acceptance run (the same prompt in two slots at once against it
    alone); a profile may declare it instead."""

    floor_nats: float | None = Field(
        default=None, ge=0, description="declared batch-variance floor (nats); default: measured on the pair"
    )
    factor: float = Field(
        default=2.0, ge=1.0, description="a near-tie within this many times the floor may part two runs"
    )
    cap_nats: float = Field(
        default=2.0,
        gt=0,
        description="a measured floor above this fails acceptance (twice the widest near-tie a healthy H100 pair "
        "parted at, 0.96 nats): two runs of one prompt that differ more are not numerics",
    )


_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


class CorsPolicy(StrictModel):
    """Which web pages' scripts may read the server's answers (llama-server --cors-origins and
    --cors-credentials, always rendered). The pinned server's own default is `*` with credentials:
    it echoes any page's Origin back, so any web page a user on the network opens can drive the
    server and read its answers (with no API key, everything it serves). pairctl renders
    `localhost` (only pages served from localhost; the server's own web UI is same-origin and
    needs no CORS) and no credentials unless the profile says otherwise with a reason."""

    origins: str = Field(
        default="localhost",
        description="'localhost', exact origins (https://app.example.com:8443, comma-separated) or '*' (needs reason)",
    )
    credentials: bool = Field(default=False, description="allow credentials (needs reason)")
    reason: str | None = Field(default=None, description="why '*' or credentials are needed (recorded with the route)")

    @model_validator(mode="after")
    def _check(self) -> CorsPolicy:
        items = [o.strip() for o in self.origins.split(",")]
        bad = [o for o in items if o not in ("localhost", "*") and not _ORIGIN.match(o)]
        if not self.origins.strip() or bad:
            raise ValueError(
                f"cors.origins {self.origins!r}: each entry must be 'localhost', '*' or an exact origin like "
                "https://app.example.com:8443 (scheme, host, optional port; no path)"
            )
        wide = [w for w, on in (("origins '*'", "*" in items), ("credentials: true", self.credentials)) if on]
        if wide and not (self.reason or "").strip():
            raise ValueError(
                f"cors: {' and '.join(wide)} lets any web page a user opens drive the server and read its answers; "
                "set cors.reason to say why this route needs it, or use cors.origins: localhost (the default) or "
                "the exact origins of your web app"
            )
        return self

    def render(self) -> list[str]:
        return ["--cors-origins", self.origins, "--cors-credentials" if self.credentials else "--no-cors-credentials"]


class RouteProfile(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    model: str = Field(default="target", description="model role (from the pair's models) to serve")
    ctx_size: int = Field(gt=0, le=4_194_304)
    parallel: int = Field(ge=1, le=64, description="slots; always passed explicitly as -np")
    batch_size: int = Field(default=2048, gt=0)
    ubatch_size: int = Field(default=512, gt=0)
    flash_attn: Literal["on", "off", "auto"] = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_gpu_layers: int | Literal["all"] = "all"
    split_mode: Literal["none", "layer", "row", "tensor"] = "layer"
    draft: DraftConfig | None = None
    expect_pipeline_parallel: bool = False
    near_full_slack: int = Field(default=1024, ge=0, description="tokens left free by near-full checks")
    threads: int | None = Field(default=None, ge=1)
    metrics: bool = True
    extra_args: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(
        default_factory=dict,
        description="absolute path on the native host -> sha256 of every file an extra_args option reads that "
        "changes answers (--lora, --control-vector, --mmproj, --grammar-file, --chat-template-file, ...)",
    )
    cors: CorsPolicy = Field(default_factory=CorsPolicy, description="llama-server's CORS answer (always rendered)")
    reference_gates: ReferenceGates = Field(default_factory=ReferenceGates)
    rpc_consistency: RpcConsistency = Field(
        default_factory=RpcConsistency, description="the RPC host alone vs the native device (checks.rpc_consistency)"
    )
    split: SplitExpectation | None = Field(
        default=None, description="what identity requires of the devices' share (read from the load log)"
    )
    answer_fixtures: str | None = Field(
        default=None, description="answer fixture set (manifests/fixtures/NAME.yaml) this route is judged on"
    )
    reference_fixtures: str | None = Field(
        default=None, description="reference-logprob fixture set (manifests/fixtures/reference/NAME.yaml)"
    )
    speed: SpeedFloors = Field(default_factory=SpeedFloors, description="floors and bounds of acceptance requests")
    batch_variance: BatchVariance = Field(
        default_factory=BatchVariance, description="how comparisons of two runs allow for the devices' numerics"
    )
    request_surface: list[RequestField] = Field(
        default_factory=lambda: list(DEFAULT_SURFACE),
        description="request fields this route's clients send; request_contract probes each, and every "
        "acceptance receipt lists which were checked and which not (config/request_surface.py)",
    )
    alias: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$",
        description="the model name clients see (llama-server --alias; /v1/models shows it instead of a path)",
    )

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> RouteProfile:
        for field in ("cache_type_k", "cache_type_v"):
            if getattr(self, field) not in KV_TYPES:
                raise ValueError(f"{field} {getattr(self, field)!r} is not one of {sorted(KV_TYPES)}")
        if self.cache_type_v in QUANTIZED_KV and self.flash_attn != "on":
            raise ValueError("a quantized V cache (cache_type_v) needs flash_attn: on")
        if self.ubatch_size > self.batch_size:
            raise ValueError(f"ubatch_size ({self.ubatch_size}) is larger than batch_size ({self.batch_size})")
        slot = self.per_slot_ctx()
        if self.near_full_slack >= slot:
            raise ValueError(
                f"near_full_slack ({self.near_full_slack}) must be smaller than the per-slot context ({slot} = "
                f"pad(pad({self.ctx_size},256)/{self.parallel},256))"
            )
        if self.expect_pipeline_parallel and self.split_mode != "layer":
            raise ValueError("pipeline parallelism needs split_mode: layer")
        # Risky flags are judged for the pair that serves this profile: its allow_flags and API key
        # come in the validation context (load_profile(..., pair=...)); without one, none is allowed.
        ctx = info.context if isinstance(info.context, dict) else {}
        if ctx.get("reading_record"):
            return self  # a route entry read back: its fields are used, nothing is started from it
        problems = check_extra_args(
            list(self.extra_args), allowed=ctx.get("allow_flags") or {}, api_key=bool(ctx.get("api_key"))
        )
        problems += file_problems(list(self.extra_args), dict(self.files))
        problems += [
            f"files: {path!r} -> {sha!r}: write an absolute path and its 64-hex-digit sha256"
            for path, sha in self.files.items()
            if not path.startswith("/") or not re.fullmatch(r"[0-9a-f]{64}", sha)
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def per_slot_ctx(self, n_ctx_train: int | None = None) -> int:
        return per_slot_context(self.ctx_size, self.parallel, n_ctx_train)

    def near_full_tokens(self, n_ctx_train: int | None = None) -> int:
        """Prompt + generation a near-full lane aims for: per-slot capacity minus slack."""
        return self.per_slot_ctx(n_ctx_train) - self.near_full_slack

    def check_fits(self, tokens: int, what: str) -> None:
        if tokens > self.per_slot_ctx():
            raise ValueError(f"{what} needs {tokens} tokens, more than the per-slot context {self.per_slot_ctx()}")

    def render_args(
        self,
        *,
        model_paths: dict[str, str],
        host: str,
        port: int,
        rpc: list[str],
        api_key_file: str | None = None,
        log_file: str | None = None,
    ) -> list[str]:
        """llama-server arguments (without the binary). Pure, so `--dry-run` and tests show it exactly."""
        try:
            model = model_paths[self.model]
        except KeyError:
            raise ValueError(
                f"profile {self.name} serves model role {self.model!r}, which the pair does not define"
            ) from None
        args = ["--model", model, "--host", host, "--port", str(port)]
        if self.alias:
            args += ["--alias", self.alias]
        if rpc:
            args += ["--rpc", ",".join(rpc)]
        args += ["--ctx-size", str(self.ctx_size), "--parallel", str(self.parallel)]
        args += ["--batch-size", str(self.batch_size), "--ubatch-size", str(self.ubatch_size)]
        args += [
            "--flash-attn",
            self.flash_attn,
            "--cache-type-k",
            self.cache_type_k,
            "--cache-type-v",
            self.cache_type_v,
        ]
        args += ["--n-gpu-layers", str(self.n_gpu_layers), "--split-mode", self.split_mode]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if self.draft is not None:
            d = self.draft
            args += ["--spec-type", d.spec_type]
            if d.model:
                try:
                    args += ["--spec-draft-model", model_paths[d.model]]
                except KeyError:
                    raise ValueError(
                        f"profile {self.name} drafts with model role {d.model!r}, which the pair does not define"
                    ) from None
            args += ["--spec-draft-n-max", str(d.n_max), "--spec-draft-n-min", str(d.n_min)]
            if d.n_gpu_layers is not None:
                args += ["--spec-draft-ngl", str(d.n_gpu_layers)]
        if self.metrics:
            args += ["--metrics"]
        args += self.cors.render()
        if api_key_file:
            args += ["--api-key-file", api_key_file]
        if log_file:
            args += ["--log-file", log_file]
        if self.split is not None:
            args += ["--log-verbosity", str(LOG_VERBOSITY)]  # the level that prints the load log
        args += list(self.extra_args)
        return args


_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)")


def flags_in_help(help_text: str) -> set[str]:
    """Every flag spelled in a `--help` text (llama.cpp lists aliases comma-separated)."""
    return set(_FLAG.findall(help_text))


def unknown_flags(args: list[str], help_text: str) -> list[str]:
    """Flags in `args` that the package's own `--help` does not offer (renamed between versions)."""
    known = flags_in_help(help_text)
    return [a for a in args if a.startswith("-") and not is_number(a) and normalise(a) not in known]


def profiles_dir() -> Path:
    return MANIFESTS / "profiles"


def load_profile(name_or_path: str, *, pair: PairSpec | None = None) -> RouteProfile:
    """`pair`: the pair that will serve it, whose allow_flags and API key decide its risky flags."""
    return load_model(RouteProfile, search.resolve_ref("profile", name_or_path), context=pair_context(pair))


def profile_from_record(data: object, *, what: str = "the route entry") -> RouteProfile:
    """The profile a route entry recorded, for its sizes (parallel, context): the flag policy was
    applied when it was deployed, and a start always renders argv through preflight again."""
    try:
        return RouteProfile.model_validate(data, context={"reading_record": True})
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ConfigError(f"{what} holds no valid route profile: {str(exc).splitlines()[0]}") from None


def pair_context(pair: PairSpec | None) -> dict[str, object] | None:
    if pair is None:
        return None
    return {"allow_flags": dict(pair.allow_flags), "api_key": bool(pair.api_key_file)}
