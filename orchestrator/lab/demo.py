"""`python -m orchestrator.lab.demo` (`make demo`): the lab demo, as an ordered list of pairctl
commands run through the real CLI, stopping at the first failure.

Extend it by appending to `STEPS` (build, deploy, accept, roll back ...): each step is exactly
what an operator would type after `pairctl`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable

from orchestrator import cli
from orchestrator.build.git import git
from orchestrator.build.store import Package, PackageStore
from orchestrator.lab.source import BASELINE_TAG
from orchestrator.paths import Home

# a step run as is (must exit 0), or one that works out its argv and expected exit code when run
Deferred = Callable[[], tuple[tuple[str, ...], int]]
Step = tuple[str, ...] | Deferred

STEPS: list[Step] = [
    ("lab", "up"),
    ("lab", "status"),
]


def run_step(argv: tuple[str, ...]) -> int:
    """Run one `pairctl` command in-process; return its exit code."""
    try:
        cli.main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _resolve(step: Step) -> tuple[tuple[str, ...], int]:
    """A step is an argv tuple (must exit 0), or a callable returning (argv, expected exit code)
    for steps that need something only known at run time (a package id) or must fail."""
    if callable(step):
        return step()
    return tuple(step), 0


def main(steps: list[Step] | None = None) -> int:
    for step in steps if steps is not None else STEPS:
        argv, expect = _resolve(step)
        if not argv:  # a step that did its own work (asking the model) and printed it
            continue
        print(f"\n$ pairctl {shlex.join(argv)}" + (f"    # expected to exit {expect}" if expect else ""), flush=True)
        code = run_step(argv)
        if code != expect:
            print(f"demo: `pairctl {shlex.join(argv)}` exited {code}, expected {expect}; stopping", file=sys.stderr)
            return code or 1
    print("\ndemo: all steps passed", flush=True)
    return 0


# -- the story: a failed candidate rolls back, the candidate deployed, status, rollback to baseline

PATCH = "kernels/mmvf-warp-per-row"


def _packages() -> list[Package]:
    return [p for p in PackageStore(Home.resolve().store).list() if p.manifest.target.name == "cpu-lab"]


def _baseline_rev() -> str:
    return git(Home.resolve().lab / "source", "rev-parse", f"{BASELINE_TAG}^{{commit}}").stdout.strip()


def _newest(pkgs: list[Package], what: str, step: str = "build") -> str:
    if not pkgs:
        raise SystemExit(f"demo: no cpu-lab package of the {what} (did the {step} step run?)")
    return max(pkgs, key=lambda p: p.manifest.finished_at).id


def _baseline_package() -> str:
    """The cpu-lab package `pairctl build` made from the lab source's baseline tag (no patch)."""
    rev = _baseline_rev()
    pkgs = [p for p in _packages() if p.manifest.revision == rev and p.manifest.patch is None]
    return _newest(pkgs, "baseline revision")


def _candidate_package() -> str:
    """The cpu-lab package built from the baseline with the MMVF kernel patch committed on top."""
    rev = _baseline_rev()
    patched = [(p, p.manifest.patch) for p in _packages()]
    pkgs = [p for p, c in patched if c is not None and c.name == "mmvf-warp-per-row" and c.base_revision == rev]
    return _newest(pkgs, "MMVF candidate", "candidate build")


_WHICH: dict[str, Callable[[], str]] = {"baseline": _baseline_package, "candidate": _candidate_package}


def _deploy(which: str, profile: str, expect: int, *, accept: bool = False) -> Deferred:
    def step() -> tuple[tuple[str, ...], int]:
        pid = _WHICH[which]()
        argv = ("deploy", "--pair", "lab", "--packages", pid, pid, "--profile", profile)
        return argv + (() if accept else ("--skip-accept",)), expect

    return step


def _expect_active(current: str, previous: str | None) -> Deferred:
    """`status --pair lab`, then a check that both hosts run CURRENT with PREVIOUS as previous."""

    def step() -> tuple[tuple[str, ...], int]:
        _check_links(current, previous)
        return ("status", "--pair", "lab"), 0

    return step


def _check_links(current: str, previous: str | None) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--json", "status", "--pair", "lab"], capture_output=True, text=True
    )
    st = json.loads(proc.stdout or "{}")
    want_cur, want_prev = _WHICH[current](), (_WHICH[previous]() if previous else None)
    for host, h in (st.get("hosts") or {}).items():
        if h.get("current") != want_cur or (previous and h.get("previous") != want_prev) or not h.get("running"):
            raise SystemExit(
                f"demo: {host} has current {h.get('current')}, previous {h.get('previous')}; "
                f"expected {current} ({want_cur}) and {previous} ({want_prev})"
            )
    if proc.returncode != 0 or not st.get("hosts"):
        raise SystemExit(f"demo: status exited {proc.returncode}: {proc.stderr[-500:]}")
    prev = f", previous {previous} ({want_prev})" if previous else ""
    print(f"demo: both hosts run the {current} ({want_cur}){prev}", flush=True)


QUESTION = "What is the capital of France? Answer in one short sentence."
REAL_PROFILE = "lab-real"  # SmolLM2-135M-Instruct, the lab's real model (orchestrator/lab/real_model.py)


def _ask(question: str = QUESTION) -> Deferred:
    """What a newcomer's OpenAI client sees: one chat request to the pair, its answer printed."""

    def step() -> tuple[tuple[str, ...], int]:
        import os

        import httpx

        from orchestrator.config.inventory import load_inventory
        from orchestrator.engine.plan import pair_view

        inv = load_inventory(os.environ.get("PAIRCTL_INVENTORY", "lab"), {"PAIRCTL_HOME": str(Home.resolve().root)})
        url = pair_view(inv, "lab").base_url + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0}
        print(f"\n$ curl -s {url} -d '{json.dumps(body)}'", flush=True)
        with httpx.Client(timeout=120, trust_env=False) as c:
            r = c.post(url, json=body)
        r.raise_for_status()
        data = r.json()
        print(f"model {data.get('model')}: {data['choices'][0]['message']['content']!r}", flush=True)
        return (), 0

    return step


STEPS += [
    ("build", "--target", "cpu-lab", "--rev", "baseline", "--profile", "lab"),  # revision 1: baseline
    # revision 2: the MMVF candidate (the kernel patch committed on top of the baseline)
    ("build", "--target", "cpu-lab", "--rev", "baseline", "--patch", PATCH, "--profile", "lab"),
    ("packages", "list"),
    _deploy("baseline", REAL_PROFILE, 0, accept=True),  # the real model: identities, then the acceptance suite
    _expect_active("baseline", None),
    _ask(),  # a real answer from the pair
    _deploy("candidate", "lab-unloadable", 7),  # a broken profile: llama-server cannot load; back to the baseline
    _expect_active("baseline", None),
    _deploy("candidate", REAL_PROFILE, 0, accept=True),  # the candidate, accepted on the real model
    _expect_active("candidate", "baseline"),
    ("rollback", "--pair", "lab"),  # back to the previous pair: the baseline revision, verified
    _expect_active("baseline", "candidate"),
    ("receipts", "list", "--pair", "lab", "--since", "1h"),
    ("receipts", "verify"),
]


if __name__ == "__main__":
    sys.exit(main())
