"""Pure comparison of two next-token distributions given as top-K logprobs (no I/O).

A position is `{token id: logprob}` as llama-server reports it with `n_probs`. A token missing on
one side counts as that side's smallest listed logprob; every value is clamped at `floor` (the
server writes log(0) as the lowest float). Figures follow `llama-perplexity --kl-divergence` (KL,
top-1 agreement) plus the largest |delta logprob| over the union of both top-K sets; since a token
crossing the cut alone can make most of a nat, `shared_max_abs_dlogprob` (tokens both sides list)
is reported apart, not gated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

Position = Mapping[int, float]


@dataclass(frozen=True)
class PositionDiff:
    kl: float
    top1_agrees: bool
    max_abs_dlogprob: float
    worst_token: int | None
    shared_max_abs_dlogprob: float = 0.0  # over tokens listed above the floor on both sides


def _clamped(p: Position, floor: float) -> dict[int, float]:
    return {int(t): max(float(lp), floor) for t, lp in p.items()}


def _renorm(lp: dict[int, float]) -> dict[int, float]:
    """log-softmax again after clamping, so KL is between two proper distributions."""
    m = max(lp.values())
    z = m + math.log(sum(math.exp(v - m) for v in lp.values()))
    return {t: v - z for t, v in lp.items()}


def trimmed(p: Position, floor: float, digits: int = 6) -> list[list[float]]:
    """What a receipt keeps of a position: [id, logprob] above the floor, rounded, by id."""
    return [[int(t), round(float(lp), digits)] for t, lp in sorted(p.items()) if lp > floor]


def argmax(p: Position) -> int:
    return max(p.items(), key=lambda kv: (kv[1], -kv[0]))[0]


def compare_position(ref: Position, cand: Position, *, floor: float, complete: bool = True) -> PositionDiff:
    """`complete`: both sides list the whole vocabulary except tokens at or below the floor, so a
    missing token is at the floor; otherwise (top-K cut) at that side's smallest listed logprob."""
    if not ref or not cand:
        raise ValueError("a position without logprobs cannot be compared")
    r, c = _clamped(ref, floor), _clamped(cand, floor)
    r_min, c_min = (floor, floor) if complete else (min(r.values()), min(c.values()))
    tokens = set(r) | set(c)
    rf = {t: r.get(t, r_min) for t in tokens}
    cf = {t: c.get(t, c_min) for t in tokens}
    worst, worst_d = None, 0.0
    for t in tokens:
        d = abs(rf[t] - cf[t])
        if d > worst_d:
            worst, worst_d = t, d
    shared = [abs(r[t] - c[t]) for t in set(r) & set(c) if r[t] > floor and c[t] > floor]
    rn, cn = _renorm(rf), _renorm(cf)
    kl = sum(math.exp(rn[t]) * (rn[t] - cn[t]) for t in tokens)
    return PositionDiff(
        kl=max(kl, 0.0),
        top1_agrees=argmax(ref) == argmax(cand),
        max_abs_dlogprob=worst_d,
        worst_token=worst,
        shared_max_abs_dlogprob=max(shared, default=0.0),
    )


@dataclass(frozen=True)
class Summary:
    positions: int
    mean_kl: float
    max_kl: float
    top1: float
    max_abs_dlogprob: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(diffs: Iterable[PositionDiff]) -> Summary:
    ds = list(diffs)
    if not ds:
        return Summary(0, 0.0, 0.0, 1.0, 0.0)
    return Summary(
        positions=len(ds),
        mean_kl=sum(d.kl for d in ds) / len(ds),
        max_kl=max(d.kl for d in ds),
        top1=sum(d.top1_agrees for d in ds) / len(ds),
        max_abs_dlogprob=max(d.max_abs_dlogprob for d in ds),
    )


def gate_problems(
    s: Summary, *, max_mean_kl: float, max_kl: float, min_top1: float, max_abs_dlogprob: float
) -> list[str]:
    """Each gate the summary misses, as one phrase naming the figure and its bound."""
    p = []
    if s.mean_kl > max_mean_kl:
        p.append(f"mean KL {s.mean_kl:.3g} > {max_mean_kl:g}")
    if s.max_kl > max_kl:
        p.append(f"max KL {s.max_kl:.3g} > {max_kl:g}")
    if s.top1 < min_top1:
        p.append(f"top-1 agreement {s.top1:.4f} < {min_top1:g}")
    if s.max_abs_dlogprob > max_abs_dlogprob:
        p.append(f"max |delta logprob| {s.max_abs_dlogprob:.3g} > {max_abs_dlogprob:g}")
    return p
