"""Qualification plans: frozen fixtures, run shape and gates. The plan's sha256 is recorded before
the first measurement (a gate cannot move after the data is seen); fixtures are checked against
their sha256 on load (a changed prompt is a different experiment)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationInfo, field_validator, model_validator

from orchestrator.config import search
from orchestrator.config.base import StrictModel
from orchestrator.config.loader import load_model, validate
from orchestrator.config.profiles import RouteProfile
from orchestrator.errors import ConfigError
from orchestrator.hashing import sha256_bytes, sha256_file, sha256_json
from orchestrator.paths import MANIFESTS
from orchestrator.qualify import sequential as seq

ALL = "*"  # a gate or flag on every family
COMBINED = "combined"  # the per-pair geometric mean over families
Arm = Literal["baseline", "candidate"]


def plans_dir() -> Path:
    return MANIFESTS / "plans"


class Fixture(StrictModel):
    """One frozen prompt. `family` groups fixtures into the cells the gates judge."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    family: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    path: str = Field(description="text file; relative paths are relative to the plan file's folder")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tokens: int | None = Field(
        default=None,
        gt=0,
        description="expected prompt tokens (checked against the profile; measured again by the server)",
    )

    def resolve(self, base_dir: Path) -> Path:
        p = Path(self.path).expanduser()
        return p if p.is_absolute() else (base_dir / p).resolve()


class Warmup(StrictModel):
    """The one fixed request after each fresh load, before any measured request (never measured)."""

    prompt: str = Field(default="Warm-up: count from one to ten.", min_length=1)
    n_predict: int = Field(default=16, ge=1)


class Bootstrap(StrictModel):
    """The percentile bootstrap reported beside the deciding Student-t interval (never deciding)."""

    exact_limit: int = Field(default=100_000, ge=1, description="enumerate all n**n resamples up to this many")
    resamples: int = Field(default=20_000, ge=1000, description="seeded resamples when n**n is larger")
    seed: int = Field(default=0, ge=0)


class Gate(StrictModel):
    """A declared decision on one family ('*' = each family, 'combined' = the combined result).

    gain: paired geometric gain >= threshold AND the Student-t interval's lower bound > 0.
    non_regression: the Student-t interval's lower bound >= threshold (e.g. -0.01).

    Power: the gate must pass with probability `power` (default: the plan's) when the true gain
    is `power_at` (default: twice the threshold for a gain gate, 0 for non_regression: identical
    code must pass). Calibration turns that into the pairs the gate needs at the measured noise.
    """

    kind: Literal["gain", "non_regression"]
    family: str = Field(default=ALL)
    threshold: float = Field(ge=-1, le=10, description="fraction: 0.05 = 5%, -0.01 = -1%")
    power_at: float | None = Field(default=None, gt=-1, le=10, description="true gain at which the gate must pass")
    power: float | None = Field(
        default=None, gt=0, lt=1, description="pass probability at power_at (default: the plan's)"
    )

    @model_validator(mode="after")
    def _check(self) -> Gate:
        if self.kind == "gain" and self.threshold < 0:
            raise ValueError("a gain gate needs a threshold >= 0 (use non_regression for a floor below parity)")
        if self.kind == "non_regression" and self.threshold > 0:
            raise ValueError("a non_regression threshold is a floor at or below 0 (e.g. -0.01)")
        if self.power_at is not None and self.power_at <= self.threshold:
            raise ValueError(
                f"power_at {self.power_at} must be above the threshold {self.threshold}: "
                "a gate cannot be required to pass where it is meant to fail"
            )
        return self

    @property
    def design_gain(self) -> float:
        if self.power_at is not None:
            return self.power_at
        if self.kind == "gain":
            return 2 * self.threshold if self.threshold > 0 else 0.02
        return 0.0


class Calibration(StrictModel):
    """The A/A calibration a plan is judged by (`pairctl qualify --calibrate`): baseline against
    baseline, `pairs` pairs of fresh activations, same fixtures, repeats and tokens as the plan."""

    pairs: int = Field(default=8, ge=3, le=200, description="A/A pairs measured by --calibrate")
    required: bool = Field(default=True, description="refuse to qualify without a matching calibration")
    upper_confidence: float = Field(
        default=0.8, gt=0.5, lt=1, description="pairs are planned on this upper bound of the noise"
    )
    floor: Literal["sigma_upper", "none"] = Field(
        default="sigma_upper",
        description="sigma_upper: a run's deciding interval uses the larger of its own sd and the calibration's "
        "upper bound (never narrower than the measured noise allows); none: the run's own sd only",
    )


class Drift(StrictModel):
    """When a run's noise is not the noise it was planned for, its verdict is not trusted (exit 9).

    trend: the baseline arms' log TG regressed on their position in the run; drift when the
    slope's interval (at `confidence`) excludes zero AND the fitted change over the run exceeds
    `max_trend`. spread: a family's own sd of the per-pair log ratio above `max_spread_ratio`
    times the calibration's upper bound (needs a calibration)."""

    max_trend: float = Field(default=0.10, gt=0, le=5, description="fitted baseline change over the run (0.10 = 10%)")
    max_spread_ratio: float = Field(default=2.0, gt=1, le=100, description="own sd / calibrated sigma_upper")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="of the trend's slope interval")


class Sequential(StrictModel):
    """Opt-in group-sequential design (`orchestrator/qualify/sequential.py`): the run is looked at
    after ceil(k pairs / looks) pairs; a look before the last stops it when a gate has failed with
    its whole interval below the threshold (at a confidence from `spending`, so a good candidate is
    failed early at most alpha of the time); passes are decided only at the last look, as a fixed run."""

    looks: int = Field(ge=2, le=10, description="pre-planned looks, equally spaced in pairs; the last at `pairs`")
    spending: Literal["bonferroni", "obrien-fleming"] = Field(
        default="bonferroni",
        description="how the one-sided alpha of the early fails is split over the looks before the last: "
        "equally (bonferroni), or strict at first (Lan-DeMets O'Brien-Fleming-type)",
    )


class Flag(StrictModel):
    """Reported, never deciding: the point ratio of `metric` (higher = candidate better) >= min_ratio."""

    metric: Literal["client_wall", "ttft", "prompt", "generation"]
    family: str = Field(default=ALL)
    min_ratio: float = Field(gt=0)


class QualifyPlan(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    fixtures: list[Fixture] = Field(min_length=1)
    n_predict: int = Field(ge=1, description="generated tokens per measured request (EOS ignored)")
    pairs: int = Field(ge=2, le=1000, description="baseline/candidate pairs (>= 2: one pair measures no spread)")
    repeats: int = Field(
        default=1,
        ge=1,
        le=50,
        description="measured requests per fixture per arm after the warm-up; the arm's value is their median",
    )
    max_arm_dispersion: float | None = Field(
        default=None,
        gt=0,
        le=5,
        description="an arm whose repeats' sd of log TG exceeds this is invalid (its pair counts as missing)",
    )
    arm_retries: int = Field(
        default=1,
        ge=0,
        le=5,
        description="re-measure (same activation) a fixture whose repeats spread more than "
        "max_arm_dispersion, up to this many times; every attempt is recorded",
    )
    confidence: float = Field(
        default=0.95, gt=0, lt=1, description="of the deciding Student-t interval and the bootstrap"
    )
    power: float = Field(default=0.8, gt=0, lt=1, description="default pass probability of a gate at its power_at")
    calibration: Calibration | None = Field(default=None, description="A/A calibration; absent = none needed")
    order: Literal["alternating", "random"] | list[Arm] = Field(
        default="alternating",
        description="'alternating' = B C C B B C ... (each pair reverses the previous); 'random' = each pair's "
        "order drawn from `order_seed`, half of the pairs each way (a periodic load cannot line up with an "
        "arm); or an explicit list of arms",
    )
    order_seed: int | None = Field(
        default=None,
        ge=0,
        description="seed of a 'random' order; absent: drawn by the run and recorded in its receipt",
    )
    drift: Drift = Field(default_factory=Drift)
    sequential: Sequential | None = Field(
        default=None, description="stop early at a pre-planned look once a gate has failed decisively; absent = off"
    )
    warmup: Warmup = Field(default_factory=Warmup)
    active_slots: Literal[1] = Field(default=1, description="measured requests run one at a time")
    temperature: float = Field(default=0.0, ge=0)
    seed: int = Field(default=42, ge=0, description="sampling seed sent with every request")
    bootstrap: Bootstrap = Field(default_factory=Bootstrap)
    gates: list[Gate] = Field(min_length=1)
    flags: list[Flag] = Field(default_factory=list)

    @field_validator("fixtures")
    @classmethod
    def _fixtures(cls, v: list[Fixture], info: ValidationInfo) -> list[Fixture]:
        names = [f.name for f in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"fixture names must be unique; repeated: {dup}")
        ctx = info.context or {}
        if ctx.get("verify_fixtures") is False:  # a plan read back from a receipt: its hashes are the record
            return v
        base = Path(ctx.get("base_dir") or plans_dir())
        for f in v:
            p = f.resolve(base)
            if not p.is_file():
                raise ValueError(f"fixture {f.name!r}: file {p} not found")
            actual = sha256_file(p)
            if actual != f.sha256:
                raise ValueError(f"fixture {f.name!r}: {p} has sha256 {actual}, the plan says {f.sha256}")
        return v

    @model_validator(mode="after")
    def _check(self) -> QualifyPlan:
        fams = set(self.families)
        judged: list[Gate | Flag] = [*self.gates, *self.flags]
        for g in judged:
            if g.family not in fams | {ALL, COMBINED}:
                raise ValueError(
                    f"{type(g).__name__.lower()} on family {g.family!r}: no fixture has that family ({sorted(fams)})"
                )
        if self.max_arm_dispersion is not None and self.repeats < 2:
            raise ValueError("max_arm_dispersion needs repeats >= 2 (one request per arm measures no spread)")
        if self.sequential is not None:
            first = -(-self.pairs // self.sequential.looks)
            if first < seq.MIN_LOOK_PAIRS:
                raise ValueError(
                    f"sequential: {self.sequential.looks} looks at {self.pairs} pairs put the first look at "
                    f"{first} pairs; each look needs at least {seq.MIN_LOOK_PAIRS} (fewer looks or more pairs)"
                )
        if isinstance(self.order, list):
            if len(self.order) != 2 * self.pairs:
                raise ValueError(f"an explicit order lists 2 x pairs = {2 * self.pairs} arms, got {len(self.order)}")
            for i in range(self.pairs):
                if sorted(self.order[2 * i : 2 * i + 2]) != ["baseline", "candidate"]:
                    raise ValueError(
                        f"explicit order: pair {i + 1} (arms {2 * i + 1}-{2 * i + 2}) "
                        "must hold one baseline and one candidate"
                    )
        return self

    @property
    def families(self) -> list[str]:
        """Families in first-seen order (report order)."""
        return list(dict.fromkeys(f.family for f in self.fixtures))

    def arm_order(self, seed: int | None = None) -> list[tuple[int, Arm]]:
        """(pair index, arm) in run order. Alternating: B C, C B, ... so a linear drift cancels.
        Random: a seeded shuffle of as many B-first as C-first pairs (no period for a periodic load
        to match), within each sequential look's new pairs; `seed` defaults to `order_seed`."""
        if isinstance(self.order, list):
            return [(i // 2, a) for i, a in enumerate(self.order)]
        if self.order == "random":
            seed = self.order_seed if seed is None else seed
            if seed is None:
                raise ValueError("a random arm order needs a seed (the plan's order_seed or the run's)")
            # True: candidate first; per look, so every look has half of its pairs each way
            rng = np.random.default_rng(seed)
            d = self.sequential_design()
            ends = d["pairs_at"] if d is not None else [self.pairs]
            blocks = []
            for lo, hi in zip([0, *ends[:-1]], ends, strict=True):
                block = np.array([i % 2 == 1 for i in range(hi - lo)])
                rng.shuffle(block)
                blocks.append(block)
            firsts = np.concatenate(blocks)
        else:
            firsts = np.array([i % 2 == 1 for i in range(self.pairs)])
        out: list[tuple[int, Arm]] = []
        for i in range(self.pairs):
            arms: tuple[Arm, Arm] = ("candidate", "baseline") if firsts[i] else ("baseline", "candidate")
            out += [(i, arms[0]), (i, arms[1])]
        return out

    def sequential_design(self) -> dict[str, Any] | None:
        """The looks, their pair counts and confidences (None: no sequential design)."""
        if self.sequential is None:
            return None
        return seq.design(self.pairs, self.sequential.looks, self.sequential.spending, self.confidence)

    def measurement_key(self) -> str:
        """What a calibration must share with its plan: the measurement, not the gates or the pair
        count (a plan may get more pairs after its calibration says how many it needs)."""
        measured = self.model_dump(
            mode="json", include={"n_predict", "repeats", "warmup", "temperature", "seed", "active_slots"}
        )
        measured["order"] = self.order if isinstance(self.order, str) else "explicit"
        return sha256_json({**measured, "fixtures": [[f.name, f.family, f.sha256, f.tokens] for f in self.fixtures]})

    def check_fits(self, profile: RouteProfile) -> None:
        """Every fixture's declared tokens + n_predict must fit one slot of the profile."""
        for f in self.fixtures:
            if f.tokens is None:
                continue
            what = f"fixture {f.name!r} ({f.tokens} prompt + {self.n_predict} generated)"
            try:
                profile.check_fits(f.tokens + self.n_predict, what)
            except ValueError as e:
                raise ConfigError(f"plan {self.name}: {e} of profile {profile.name}") from None


@dataclass
class LoadedPlan:
    """A validated plan plus where it came from and its hash (what the receipt records)."""

    plan: QualifyPlan
    path: Path
    sha256: str

    @cached_property
    def fixture_paths(self) -> dict[str, Path]:
        return {f.name: f.resolve(self.path.parent) for f in self.plan.fixtures}

    def fixture_text(self, name: str) -> str:
        """The fixture's text, re-checked against its sha256 (it could change during a run)."""
        fx = next(f for f in self.plan.fixtures if f.name == name)
        p = self.fixture_paths[name]
        data = p.read_bytes()
        if sha256_bytes(data) != fx.sha256:
            raise ConfigError(f"fixture {name!r}: {p} changed since the plan was loaded (sha256 mismatch)")
        return data.decode("utf-8")


def plan_from_text(text: str, *, source: str) -> QualifyPlan:
    """A plan as recorded in a receipt (`plan_text`): validated, fixture files not consulted."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: recorded plan is not valid YAML: {exc}") from None
    return validate(QualifyPlan, data, source=source, context={"verify_fixtures": False})


def load_plan(name_or_path: str | Path) -> LoadedPlan:
    p = search.resolve_ref("plan", str(name_or_path)).expanduser().resolve()
    plan = load_model(QualifyPlan, p, context={"base_dir": str(p.parent)})
    return LoadedPlan(plan, p, sha256_file(p))
