"""Where two greedy runs of one request part, and whether the device's numerics explain it.

GPU kernels are not batch-invariant: a request decoded beside another lane, or verified in a batch
of drafted tokens, takes other kernels than alone, so a greedy near-tie can flip (the CPU lab is
bit-identical). So checks that compare two runs (two lanes vs solo, drafted vs draft-free, cached
vs uncached) never demand equal text; they walk the two token lists and judge each parting:

- the reference side's top-K at the common prefix (one `probe` request) gives the *margin*: how
  much more it preferred its own token than the other side's;
- a margin within the tolerance (the batch-variance floor measured by `batch_floor`) is a near-tie:
  reported, one side continues from the other's prefix (`reanchor`), and the walk goes on;
- a margin above it, or the other token outside the top K, is a real difference: the check fails.

The regressions these checks exist for part where the reference was sure, and part again after
every re-anchor. Pure except through the two callables the caller passes in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Probe = Callable[[list[int]], Mapping[int, float]]  # generated prefix -> the reference side's next-token logprobs
Reanchor = Callable[[list[int], int], list[int]]  # (generated prefix, tokens left) -> the re-run side's tokens

# How many near-tie partings one walk may hold: batch_floor measures this pair's parting rate on its
# twins (`pooled`: P partings in T tokens); a walk of m tokens may hold the count a healthy pair
# exceeds with chance at most FALSE_FAIL, the rate's uncertainty included (Garwood upper bound at
# FALSE_FAIL / 2, scaled to m, then its Poisson upper quantile at FALSE_FAIL / 2), capped at
# MAX_PARTINGS (each parting costs two requests). More is a small systematic shift that keeps parting.
MAX_PARTINGS = 8
FALSE_FAIL = 1e-3  # per walk; a suite walks about six times
UNMEASURED = (MAX_PARTINGS, f"no parting rate measured: at most {MAX_PARTINGS}")


@dataclass(frozen=True)
class Tolerance:
    """How far apart a near-tie may be and still be flipped by this pair's numerics (nats), and
    where the number comes from (recorded in the receipt of every check that uses it)."""

    nats: float
    origin: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    problem: str | None = None  # the measurement itself found the pair unfit (e.g. a floor above the cap)

    def as_dict(self) -> dict[str, Any]:
        return {"nats": self.nats, "origin": self.origin, **dict(self.figures), "problem": self.problem}

    def parting_bound(self, tokens: int) -> tuple[int, str]:
        """How many near-tie partings a walk of `tokens` tokens may hold, and why (see MAX_PARTINGS)."""
        events, exposure = pooled(self.figures)
        if not exposure:
            return UNMEASURED
        n = parting_limit(events, exposure, tokens)
        return min(n, MAX_PARTINGS), (
            f"twins parted {events} times in {exposure} tokens compared; {n} or more partings in {tokens} "
            f"tokens has chance < {FALSE_FAIL:g} at that rate's upper bound, at most {MAX_PARTINGS}"
        )


def pooled(figures: Mapping[str, Any]) -> tuple[int, int]:
    """Every twin comparison of a batch_floor measurement pooled: (partings, tokens compared). A
    short twin is compared up to its first parting (k + 1 tokens, one parting) or over all it
    generated; a long twin is walked on past each parting. (0, 0) where nothing was measured."""
    events = exposure = 0
    for t in figures.get("twins", []):
        if t.get("round") == "long":
            continue  # walked: counted from long_twin_walks
        k = t.get("parted_at")
        events, exposure = events + (k is not None), exposure + (figures["twin_generate"] if k is None else k + 1)
    for w in figures.get("long_twin_walks", []):
        events, exposure = events + len(w["partings"]), exposure + w["compared"]
    return events, exposure


def _poisson_above(n: int, mean: float) -> float:
    """P(X > n) for X ~ Poisson(mean)."""
    term = total = math.exp(-mean)
    for i in range(1, n + 1):
        term *= mean / i
        total += term
    return max(0.0, 1.0 - total)


def parting_limit(events: int, exposure: int, tokens: int, false_fail: float = FALSE_FAIL) -> int:
    """The most partings a walk of `tokens` tokens may hold when `events` partings were seen in
    `exposure` tokens: a healthy pair exceeds it with chance below `false_fail` (see MAX_PARTINGS)."""
    lo, hi = 0.0, events + 20.0 + 10.0 * math.sqrt(events + 1)  # expected partings in `exposure`
    for _ in range(60):  # Garwood's upper bound: P(X <= events) = false_fail / 2, by bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1.0 - _poisson_above(events, mid) > false_fail / 2 else (lo, mid)
    mean = hi / exposure * tokens
    n = 0
    while _poisson_above(n, mean) >= false_fail / 2:
        n += 1
    return n


@dataclass(frozen=True)
class Parting:
    position: int
    ours: int  # the token the run under test chose
    theirs: int  # the token the reference side chose
    margin: float | None  # lp(theirs) - lp(ours) in the reference side's distribution; None: ours not in its top K
    at_least: float  # when `margin` is None: the margin is at least this (lp(theirs) - the smallest listed)
    within: bool

    def describe(self) -> str:
        m = (
            f"{self.margin:.4g}"
            if self.margin is not None
            else f">= {self.at_least:.4g} (not in the top K)"
            if self.at_least != float("inf")
            else "unknown: the reference's own token is not in its probe's top K"
        )
        return f"token {self.position} (margin {m} nats)"


@dataclass
class Walk:
    """What a walk found: every parting, how many positions were compared, and a problem if any."""

    partings: list[Parting] = field(default_factory=list)
    compared: int = 0
    stopped_early: bool = False  # more near-ties than the parting bound: a problem, the rest not compared
    problem: str | None = None
    requests: int = 0

    @property
    def max_margin(self) -> float | None:
        ms = [p.margin for p in self.partings if p.margin is not None]
        return max(ms) if ms else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_difference(a: list[int], b: list[int], start: int = 0) -> int | None:
    """The first position from `start` where the two lists differ (a shorter list differs where it ends)."""
    for i in range(start, min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_of(dist: Mapping[int, float], theirs: int, ours: int) -> tuple[float | None, float]:
    """(lp(theirs) - lp(ours), lower bound when `ours` is not listed); negative: the probe preferred
    ours. A top K without the reference's own token gives no margin (never a tie)."""
    if not dist or theirs not in dist:
        return None, float("inf")
    top = dist[theirs]
    if ours in dist:
        return top - dist[ours], top - dist[ours]
    return None, top - min(dist.values())


def walk(
    subject: list[int],
    reference: list[int],
    *,
    probe: Probe,
    reanchor: Reanchor,
    side: Literal["subject", "reference"],
    tolerance: float,
    max_partings: tuple[int, str] = UNMEASURED,
) -> Walk:
    """Compare `subject` (the run under test) with `reference` (generated tokens only) token by
    token. Within `tolerance` the side named by `side` is re-run from the other's prefix and the
    walk goes on; more near-ties than `max_partings` fail the walk, except a measuring one
    (`tolerance` infinite), which stops there."""
    a, r = list(subject), list(reference)
    n = len(r)
    out = Walk()
    start = 0
    while True:
        k = first_difference(a, r, start)
        if k is None:
            out.compared = n
            return out
        if k >= min(len(a), len(r)):
            out.compared = k
            out.problem = f"the runs have {len(a)} and {len(r)} tokens, same up to token {k}"
            return out
        dist = probe(r[:k])
        out.requests += 1
        margin, at_least = margin_of(dist, r[k], a[k])
        within = margin is not None and abs(margin) <= tolerance
        p = Parting(position=k, ours=a[k], theirs=r[k], margin=margin, at_least=at_least, within=within)
        out.partings.append(p)
        out.compared = k
        if not within:
            out.problem = f"parted at {p.describe()}, above the tolerance {tolerance:.4g} nats"
            return out
        if len(out.partings) > max_partings[0] or (tolerance == math.inf and len(out.partings) >= max_partings[0]):
            out.stopped_early = True
            if tolerance != math.inf:
                out.problem = (
                    f"parted {len(out.partings)} times by token {k}, each a near-tie within the tolerance "
                    f"{tolerance:.4g} nats, more than this pair's numerics explain ({max_partings[0]}: "
                    f"{max_partings[1]}): a shift that keeps parting the runs"
                )
            return out
        left = n - k - 1
        if side == "reference":
            r = r[:k] + [a[k]] + list(reanchor(a[: k + 1], left))[:left]
        else:
            a = a[:k] + [r[k]] + list(reanchor(r[: k + 1], left))[:left]
        out.requests += 1
        start = k + 1


def summary(walks: list[Walk], tol: Tolerance) -> dict[str, Any]:
    """Figures for a check's table: partings seen, the widest near-tie accepted, the tolerance."""
    margins = [m for w in walks for m in [w.max_margin] if m is not None]
    return {
        "partings": sum(len(w.partings) for w in walks),
        "max_parting_margin": round(max(margins), 6) if margins else None,
        "tolerance_nats": round(tol.nats, 6),
        "tolerance_origin": tol.origin,
        "compared_tokens": sum(w.compared for w in walks),
        "stopped_early": any(w.stopped_early for w in walks),
    }
