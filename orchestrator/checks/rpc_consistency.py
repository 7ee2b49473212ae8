"""RPC consistency: the RPC host's half judged on its own, with no reference answers needed.

On a route's first deploy there is no reference to compare with, yet a fault in `ggml-rpc-server`,
its kernels or the transport moves every layer the RPC device holds. So the profile's fixtures are
answered through the live pair and through a probe `llama-server` on the native host, from the same
release and model, the profile minus `--rpc` and drafting; what differs is the RPC host's part.

The probe runs under its own `pairctl-svc` root (`<install_root>/run/rpc-consistency`) on the
pair's server address at `server_port + port_offset`, with the pair's API key file when it has one,
and is always stopped after. The gates derive from the profile's measured floor and are in the receipt.
"""

from __future__ import annotations

import dataclasses
import posixpath
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.checks import logprobs as lp
from orchestrator.checks.base import CheckContext, CheckResult, Timer, judged, result
from orchestrator.checks.live import http_url, server_host
from orchestrator.checks.oracle_fixtures import load_oracle_set
from orchestrator.checks.reference_logprobs import (
    NO_VOCAB,
    Answer,
    Asker,
    asked_raw,
    compare,
    record,
    top_k_for,
)
from orchestrator.config.profiles import RouteProfile
from orchestrator.config.reference_gates import ReferenceGates
from orchestrator.config.rpc_consistency import RpcConsistency
from orchestrator.errors import CheckFailed
from orchestrator.hosts import probes, services
from orchestrator.hosts.layout import LLAMA_SERVER, HostLayout, install_helper
from orchestrator.server.client import ServerClient

NAME = "rpc_consistency"
PROBE_DIR = "rpc-consistency"  # under <install_root>/run: the probe server's own svc root


@dataclass(frozen=True)
class ProbePlan:
    """The native-only probe server: where it runs, from which binary, with which argv."""

    host: str
    root: str  # <install_root>/run/rpc-consistency
    argv: list[str]
    bind: str
    port: int

    @property
    def layout(self) -> HostLayout:
        return HostLayout(self.root)

    @property
    def base_url(self) -> str:
        return http_url(self.bind, self.port)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "root": self.root, "argv": list(self.argv), "url": self.base_url}


def probe_profile(profile: RouteProfile) -> RouteProfile:
    """The profile as the native device alone runs it: no draft (drafting never changes a
    distribution, it only costs time) and no load-log expectation (`split` is identity's)."""
    return profile.model_copy(update={"draft": None, "split": None})


def plan_probe(ctx: CheckContext, cfg: RpcConsistency) -> ProbePlan:
    """Pure: the probe's argv from the active native package, the pair's models and the profile."""
    if ctx.inventory is None:
        raise CheckFailed("the RPC consistency probe needs the inventory (the pair's models and addresses)")
    pair = ctx.inventory.pair(ctx.pair)
    native = ctx.packages.get("native")
    root = ctx.host_roots.get("native")
    if native is None or not root:
        raise CheckFailed("the RPC consistency probe needs the native host's active package and install root")
    bind = server_host(ctx.inventory, ctx.pair)
    port = pair.server_port + cfg.port_offset
    if port in (pair.server_port, pair.rpc_port) or port > 65535:
        raise CheckFailed(f"rpc_consistency.port_offset {cfg.port_offset} gives port {port}, which the pair cannot use")
    state = ctx.inventory.hosts[pair.native].state_dir or HostLayout(root).run  # never through run/'s link
    layout, probe = HostLayout(root), HostLayout(posixpath.join(state, PROBE_DIR))
    profile = probe_profile(ctx.profile)
    if cfg.threads is not None:
        profile = profile.model_copy(update={"threads": cfg.threads})
    args = profile.render_args(
        model_paths={role: m.path for role, m in pair.models.items()},
        host=bind,
        port=port,
        rpc=[],
        api_key_file=layout.api_key if ctx.api_key is not None else None,
        log_file=probe.log(services.SERVER_LOG),
    )
    return ProbePlan(
        host=pair.native, root=probe.root, argv=[layout.binary(native.id, LLAMA_SERVER), *args], bind=bind, port=port
    )


def gates_of(cfg: RpcConsistency) -> dict[str, Any]:
    """What the receipt keeps of how the gates were derived."""
    return {
        "floor_abs_dlogprob": cfg.floor_abs_dlogprob,
        "floor_max_kl": cfg.floor_max_kl,
        "floor_source": cfg.floor_source,
        "factor": cfg.factor,
        "min_abs_dlogprob": cfg.min_abs_dlogprob,
        "min_max_kl": cfg.min_max_kl,
        "max_abs_dlogprob": cfg.gate_abs_dlogprob(),
        "max_kl": cfg.gate_max_kl(),
    }


def judge(summary: lp.Summary, cfg: RpcConsistency) -> list[str]:
    """Pure: each gate the RPC device's answers miss against the native device's."""
    return lp.gate_problems(
        summary,
        max_mean_kl=cfg.gate_max_kl(),
        max_kl=cfg.gate_max_kl(),
        min_top1=1.0,  # the same sequence on two devices within a floor this small: any flip is a fault
        max_abs_dlogprob=cfg.gate_abs_dlogprob(),
    )


class _Probe:
    """Start and stop of the probe server on the native host (a context manager: always stopped)."""

    def __init__(self, ctx: CheckContext, plan: ProbePlan, timeout_s: float) -> None:
        self.ctx, self.plan, self.timeout_s = ctx, plan, timeout_s
        self.t = ctx.transports["native"]
        self.started = False
        self.log_tail = ""

    def __enter__(self) -> _Probe:
        layout = self.plan.layout
        install_helper(self.t, layout)
        self.started = True  # from here on, always try to stop it
        services.stop(self.t, layout, LLAMA_SERVER)  # a leftover of a killed check would hold the port
        taken = probes.port_taken(probes.tcp_listeners(self.t), self.plan.bind, self.plan.port)
        if taken:
            raise CheckFailed(
                f"{self.plan.host}: port {self.plan.port} is in use ({', '.join(taken)}); the RPC consistency "
                "probe needs it: set rpc_consistency.port_offset in the profile"
            )
        pid, _ = services.start(self.t, layout, LLAMA_SERVER, self.plan.argv)
        services.wait_health(self.t, layout, self.plan.base_url, pid, timeout_s=self.timeout_s, poll_s=0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.started:
            return
        self.log_tail = services.read_tail(self.t, self.plan.layout.log(services.SERVER_LOG), 8)
        services.stop(self.t, self.plan.layout, LLAMA_SERVER)


def run(ctx: CheckContext) -> CheckResult:
    timer = Timer()
    cfg = ctx.profile.rpc_consistency
    if not cfg.enabled:
        return result(NAME, "skipped", "rpc_consistency.enabled is false in the profile", timer)
    fs = load_oracle_set(cfg.fixtures)
    ref_gates: ReferenceGates = ctx.profile.reference_gates
    k, vocab, complete = top_k_for(ctx, ref_gates)
    if k <= 0:
        return result(NAME, "failed", NO_VOCAB, timer)
    plan = plan_probe(ctx, cfg)
    raw: dict[str, Any] = {**asked_raw(ctx, fs, k, vocab), "gates": gates_of(cfg), "probe": plan.to_dict()}
    # 1. the live pair: the layers on the RPC device
    live = Asker(ctx, k)
    t0 = timer.elapsed()
    answers: list[Mapping[str, Any]] = list(record(ctx, live, fs, ref_gates.logprob_floor))
    live_s = round(timer.elapsed() - t0, 3)
    # 2. the same package and model with every layer on the native device, teacher-forced on (1)
    t1 = timer.elapsed()
    probe = _Probe(ctx, plan, cfg.start_timeout_s)
    with probe, ServerClient(plan.base_url, api_key=ctx.api_key, timeout=ctx.client.timeout) as client:
        start_s = round(timer.elapsed() - t1, 3)
        native = _Recorder(dataclasses.replace(ctx, client=client), k)
        summary, per_fixture, problems = compare(native, answers, ref_gates, complete)
        chosen = chosen_deltas(answers, native.got)
    native_s = round(timer.elapsed() - t1, 3)
    problems += judge(summary, cfg)
    figures = {
        **summary.as_dict(),
        "gate_max_abs_dlogprob": cfg.gate_abs_dlogprob(),
        "gate_max_kl": cfg.gate_max_kl(),
        "greedy_flips": sum(f["greedy_flips"] for f in per_fixture),
        # |delta logprob| of the token the live pair chose, position by position: the figure a user's
        # sampled text feels (max over the top-K above also moves with tokens far in the tail)
        "chosen_max_abs_dlogprob": max(chosen, default=0.0),
        "chosen_median_abs_dlogprob": _median(chosen),
        "live_s": live_s,
        "probe_start_s": start_s,
        "probe_s": native_s,
        "requests": live.requests + native.requests,
    }
    raw |= {"summary": summary.as_dict(), "fixtures": per_fixture, "problems": problems, "probe_log": probe.log_tail}
    failed = "the RPC device's answers differ from the native device's: " + "; ".join(problems)
    passed = (
        f"the RPC device agrees with the native device: max |dlogprob| {summary.max_abs_dlogprob:.3g} "
        f"(gate {cfg.gate_abs_dlogprob():g}), max KL {summary.max_kl:.3g} (gate {cfg.gate_max_kl():g}), "
        f"{summary.positions} positions"
    )
    return judged(NAME, problems, passed, timer, figures=figures, raw=raw, failed=failed)


class _Recorder(Asker):
    """An Asker that keeps each fixture's teacher-forced answer (the positions `compare` judged),
    so the chosen tokens' deltas come from the same requests, not a second pass."""

    def __init__(self, ctx: CheckContext, k: int) -> None:
        super().__init__(ctx, k)
        self.got: list[Answer] = []

    def first(self, endpoint: str, prompt: Any, n: int) -> Answer:
        a = super().first(endpoint, prompt, n)
        self.got.append(a)
        return a

    def cont(self, prefix: Any, forced: list[int], n: int) -> Answer:
        a = super().cont(prefix, forced, n)
        self.got[-1] = Answer(self.got[-1].tokens, _joined(self.got[-1], a, len(forced)))
        return a


def _joined(before: Answer, cont: Answer, at: int) -> list[dict[int, float]]:
    """Positions of a teacher-forced walk: the first `at` from before, the rest from the continuation."""
    return list(before.positions[:at]) + list(cont.positions)


def chosen_deltas(answers: list[Mapping[str, Any]], got: list[Answer]) -> list[float]:
    """|delta logprob| of each position's chosen token (the live pair's greedy token), native side
    teacher-forced on the live pair's tokens; a token missing from one side's top-K is skipped."""
    out = []
    for fx, g in zip(answers, got, strict=False):
        for tok, ref, cand in zip(fx["tokens"], fx["positions"], g.positions, strict=False):
            r = {int(t): float(v) for t, v in ref}
            if int(tok) in r and cand and int(tok) in cand:
                out.append(abs(r[int(tok)] - float(cand[int(tok)])))
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0
