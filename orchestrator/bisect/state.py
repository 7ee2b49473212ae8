"""A bisect's state in the home: `<home>/bisect/<pair>/state.json` beside git's own (repo.git).
It keeps what git cannot: the request (a resume judges the same way), each verdict's evidence,
and the end. A verdict is written here before git is told, so a resume re-tells it, not re-judges."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, UsageError
from orchestrator.evidence import safejson
from orchestrator.evidence.atomic import replace
from orchestrator.paths import Home

STATE_VERSION = 1
# far above a state's size and depth (a few KB a step, 5 levels), far below what exhausts memory or recursion
MAX_STATE_BYTES = 16 << 20
MAX_STATE_DEPTH = 64
_RESET_HINT = "`pairctl bisect --pair PAIR --reset` discards it"


@dataclass(frozen=True)
class Judgement:
    """How a commit is judged: acceptance checks on a deploy, or a qualification plan's
    non-regression gates against the good revision's packages."""

    kind: str  # "checks" | "plan"
    checks: tuple[str, ...] = ()
    plan: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "checks": list(self.checks), "plan": self.plan}

    def describe(self) -> str:
        return (
            f"checks {','.join(self.checks) or '(the whole suite)'}" if self.kind == "checks" else f"plan {self.plan}"
        )


@dataclass
class StepRecord:
    commit: str
    verdict: str  # good | bad | skip
    reason: str
    receipt: str | None  # the step's own receipt (`pairctl receipts show`)
    evidence: dict[str, Any] = field(default_factory=dict)  # build / deploy / qualify receipts behind it


@dataclass
class BisectState:
    pair: str
    source: str
    good: str
    bad: str
    judgement: Judgement
    profile: str
    started_at: str
    steps: list[StepRecord] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # run ids of the bisect receipts (the first run, each resume)
    calibration: str | None = None  # plan judgement: the calibration receipt used
    finished: dict[str, Any] | None = None  # the answer, once git named it
    # what ran before the bisect (BisectDriver.saved_snapshot), saved before any step changes the
    # pair: every restore, a resume's too, puts back this, never what a killed run left active
    snapshot: dict[str, Any] | None = None
    version: int = STATE_VERSION

    def verdict_of(self, commit: str) -> StepRecord | None:
        return next((s for s in self.steps if s.commit == commit), None)

    @property
    def judged(self) -> int:
        """Steps that gave git a verdict of good or bad (skips are not judgements)."""
        return sum(1 for s in self.steps if s.verdict in ("good", "bad"))

    def same_request(self, good: str, bad: str, judgement: Judgement, profile: str) -> bool:
        return (self.good, self.bad, self.judgement, self.profile) == (good, bad, judgement, profile)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"  # the judgement's checks: a list

    @classmethod
    def from_json(cls, text: str | bytes, where: Path) -> BisectState:
        try:
            d = safejson.parse_bounded(text, max_bytes=MAX_STATE_BYTES, max_depth=MAX_STATE_DEPTH, noun="bisect state")
            if not isinstance(d, dict):
                raise ValueError(f"a JSON {type(d).__name__}, not an object")
            if d.get("version") != STATE_VERSION:
                raise ValueError(f"version {d.get('version')!r}, this pairctl reads {STATE_VERSION}")
            j = d.pop("judgement")
            d["judgement"] = Judgement(kind=j["kind"], checks=tuple(j["checks"]), plan=j["plan"])
            d["steps"] = [StepRecord(**s) for s in d["steps"]]
            return cls(**d)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # safejson.Unbounded too
            why = f": it {exc}" if isinstance(exc, safejson.Unbounded) else f" ({exc})"
            raise ConfigError(f"{where}: not a bisect state this pairctl can read{why}", hint=_RESET_HINT) from None


def folder(home: Home, pair: str) -> Path:
    return home.root / "bisect" / pair


def state_path(home: Home, pair: str) -> Path:
    return folder(home, pair) / "state.json"


def load(home: Home, pair: str) -> BisectState | None:
    p = state_path(home, pair)
    if not p.exists() and not p.is_symlink():
        return None
    try:
        with safejson.open_regular_or_unbounded(p) as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except (safejson.Unbounded, OSError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"{p}: not a bisect state this pairctl can read: {why}", hint=_RESET_HINT) from None
    return BisectState.from_json(data, p)


def save(home: Home, st: BisectState) -> None:
    p = state_path(home, st.pair)
    p.parent.mkdir(parents=True, exist_ok=True)
    replace(p, st.to_json().encode())


def refuse_other(st: BisectState) -> UsageError:
    return UsageError(
        f"pair {st.pair} has an unfinished bisect (--good {st.good[:10]} --bad {st.bad[:10]}, "
        f"{st.judgement.describe()}, profile {st.profile}); refusing to start another",
        hint=f"`pairctl bisect --pair {st.pair} --resume` continues it; `--reset` discards it",
    )
