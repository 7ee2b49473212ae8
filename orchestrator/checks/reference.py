"""Reference answers: which package pair is a route's yardstick, and its recorded answers.

Both live in the pair's receipt chain, so every change is evidence:
- the *pinned reference* is the newest passed `reference` receipt (`pairctl reference set`), else
  the first passed acceptance that recorded reference answers;
- *reference answers* are the raw data of a passed `check:reference_logprobs` step whose role was
  `reference`, keyed by packages, model hashes, answer-defining profile fields, fixture set and
  numerics (KV types, flash attention, a split spanning device kinds); recorded once per key by
  the reference pair itself, with its replay floor and gates.
An accepted candidate never becomes the yardstick. Neither pin nor answers come from a run limited
by `--checks`/`--skip`: the receipt must say the whole suite ran (`acceptance_whole_suite`) and passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.config.profiles import RouteProfile
from orchestrator.hashing import sha256_json
from orchestrator.roles import Role

# KV types for which the pinned CPU flash-attention kernel's summation order follows threads and ubatch
CPU_SPLIT_KV_TYPES = frozenset({"f16", "f32"})

COMMAND = "reference"  # the receipt command of `pairctl reference set`
FIELD = "reference"  # the receipt field it sets
CHECK = "reference_logprobs"
STEP = "check:" + CHECK
WHOLE_SUITE = "acceptance_whole_suite"  # receipt field (checks.suite): no check of the suite was left out
# Receipts written before WHOLE_SUITE existed: their `acceptance_plan` must hold every check the
# suite ran on 2026-12-06 (checks.suite.CHECKS with a function; identity and telemetry wrap them).
LEGACY_WHOLE_SUITE = frozenset(
    "check:" + n
    for n in (
        "two_lane_near_full", "one_lane_near_full", "exactly_full", "speculative", "sampling",
        "cached_continuation", "cancellation", "long_prefix_cache", "answer_fixtures", "reference_logprobs",
        "rpc_consistency",
    )
)  # fmt: skip


@dataclass(frozen=True)
class Pin:
    """A route's reference package pair and how it became one."""

    native_package: str
    rpc_package: str
    receipt: str | None  # the receipt that set it (a `reference set`, or the first accepted run)
    how: str  # "set" | "first accepted"

    def packages(self) -> tuple[str, str]:
        return self.native_package, self.rpc_package

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Answers:
    """One recorded set of reference answers (the step's raw data) and where it is kept."""

    key: str
    receipt: str
    raw: Mapping[str, Any]


@dataclass(frozen=True)
class ReferenceState:
    """What acceptance compares with: the pin (None: the route has none yet) and every recorded
    answer set of the pin by key (the check picks the one of its own key)."""

    pin: Pin | None
    answers: Mapping[str, Answers]

    def for_key(self, key: str) -> Answers | None:
        return self.answers.get(key)

    def nearest(self, base: str, numerics: Mapping[str, Any]) -> Answers | None:
        """Of the answers of the same base key at other numerics, the one differing in fewest fields."""
        same = [a for a in self.answers.values() if a.raw.get("base_key") == base]
        if not same:
            return None
        return min(same, key=lambda a: len(changed_fields(a.raw.get("numerics") or {}, numerics)))


def profile_answer_fields(profile: RouteProfile, n_ctx_train: int | None = None) -> dict[str, Any]:
    """The profile fields that define *what* the answers are (model served, slot size that sizes
    the near-full fixtures). Threads, batch sizes, KV types, flash attention, offload and drafting
    change only *how* they are computed: the gates judge those against the same answers."""
    return {"model": profile.model, "per_slot_ctx": profile.per_slot_ctx(n_ctx_train)}


# how answers are recorded (teacher-forced walk, every position filled; 3: with the replay floor
# and derived gates, per numerics key); part of the key
ANSWERS_FORMAT = 3

# extra_args that move layers or tensors between devices (llama-server --help)
PLACEMENT_FLAGS = {"-ts", "--tensor-split", "-ot", "--override-tensor", "-mg", "--main-gpu", "-dev", "--device"}


def device_kind(manifest: Any) -> str:
    """What computes on a package's device: its target's backend and arch (`cpu`, `cuda:sm_90`).
    Two devices of one kind run the same kernels, so moving layers between them changes no number."""
    spec = getattr(getattr(manifest, "target", None), "spec", None)  # the manifest keeps the target spec as a dict
    spec = spec if isinstance(spec, Mapping) else {}
    backend = str(spec.get("backend") or "unknown")
    arch = spec.get("cuda_arch")
    return f"{backend}:{arch}" if arch else backend


def numerics_fields(profile: RouteProfile, kinds: Mapping[Role, str]) -> dict[str, Any]:
    """The profile fields that legitimately change the numbers (measured: docs/reference-answers.md):
    KV types and flash attention; the split of layers only when the devices that may hold layers
    are of different kinds (`kinds`: role -> device_kind). Batch sizes and drafting change nothing,
    except where a CPU holds layers with an f16/f32 KV cache under flash attention: the pinned CPU
    kernel then splits the cache across threads and tiles large batches, so threads and ubatch
    join the key."""
    used = {kinds.get("native", "unknown"), kinds.get("rpc", "unknown")}
    if profile.n_gpu_layers != "all":
        used.add("cpu")
    fields: dict[str, Any] = {
        "cache_type_k": profile.cache_type_k,
        "cache_type_v": profile.cache_type_v,
        "flash_attn": profile.flash_attn,
        "device_kinds": sorted(used),
    }
    kv = profile.cache_type_k
    if "cpu" in used and profile.flash_attn != "off" and kv == profile.cache_type_v and kv in CPU_SPLIT_KV_TYPES:
        fields["threads"] = profile.threads
        fields["ubatch_size"] = profile.ubatch_size
    if len(used) > 1:
        args = list(profile.extra_args)
        placement = [a for i, a in enumerate(args) if a in PLACEMENT_FLAGS or (i and args[i - 1] in PLACEMENT_FLAGS)]
        fields["split"] = {"n_gpu_layers": profile.n_gpu_layers, "split_mode": profile.split_mode, "args": placement}
    return fields


def base_key(
    packages: tuple[str, str], models: Mapping[str, str], profile_fields: Mapping[str, Any], fixture_set_sha256: str
) -> str:
    """What the answers are *of* (packages, models, answer-defining fields, fixtures)."""
    return sha256_json(
        {
            "format": ANSWERS_FORMAT,
            "packages": list(packages),
            "models": dict(sorted(models.items())),
            "profile": dict(profile_fields),
            "fixtures": fixture_set_sha256,
        }
    )


def answers_key(base: str, numerics: Mapping[str, Any]) -> str:
    """The numerics key: the base key plus how the numbers are computed."""
    return sha256_json({"base": base, "numerics": dict(numerics)})


def changed_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """`field old -> new` for each numerics field that differs (old: a, new: b)."""
    return [f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _raw(r: Any) -> Mapping[str, Any] | None:
    st = r.step(STEP)
    raw = st.data.get("raw") if st is not None else None
    return raw if isinstance(raw, Mapping) else None


def ran_whole_suite(receipt: Any) -> bool:
    """Did this receipt's acceptance run every check of the suite (no `--checks`/`--skip`)?"""
    extra = receipt.extra_fields()
    flag = extra.get(WHOLE_SUITE)
    if isinstance(flag, bool):
        return flag
    plan = extra.get("acceptance_plan")
    return isinstance(plan, list) and LEGACY_WHOLE_SUITE <= set(plan)


def state_from_receipts(receipts: Iterable[Any]) -> ReferenceState:
    """Pure over loaded receipts (oldest first): the pin, then the pin's answers by key. Answers
    (and the first-accepted pin) come only from passed receipts whose acceptance ran the whole suite."""
    passed = [r for r in receipts if r.outcome == "passed"]
    rs = [r for r in passed if r.command != COMMAND and ran_whole_suite(r)]
    pin: Pin | None = None
    for r in reversed(passed):
        if r.command == COMMAND:
            v = r.extra_fields().get(FIELD)
            if isinstance(v, Mapping) and v.get("native_package") and v.get("rpc_package"):
                pin = Pin(str(v["native_package"]), str(v["rpc_package"]), r.sha256, "set")
                break
    if pin is None:
        for r in rs:
            raw = _raw(r)
            if raw and raw.get("role") == "reference" and raw.get("packages"):
                n, p = raw["packages"]
                pin = Pin(str(n), str(p), r.sha256, "first accepted")
                break
    answers: dict[str, Answers] = {}
    if pin is not None:
        for r in rs:
            raw = _raw(r)
            if (
                raw
                and raw.get("role") == "reference"
                and tuple(raw.get("packages") or ()) == pin.packages()
                and raw.get("key")
                and raw["key"] not in answers
            ):
                answers[str(raw["key"])] = Answers(key=str(raw["key"]), receipt=str(r.sha256), raw=raw)
    return ReferenceState(pin=pin, answers=answers)


def load_state(evidence: Any, pair: str) -> ReferenceState:
    """The reference of `pair` from its receipt chain (every receipt that verifies)."""
    return state_from_receipts(evidence.iter(pair=pair))
