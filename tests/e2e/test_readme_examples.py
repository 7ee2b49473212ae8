"""Issue 34's "done when" on one lab pair (`readme`: its own roots, ports and API key on the lab's
sshd hosts, deployed once for the whole module), run the way an operator runs pairctl:

- item 10 through the real commands: a first deploy's `status` says `previous -` (never
  `None`), keeps whole package ids on a 100-column terminal and does not claim the deploy's
  services were "started at boot"; `repair` of a healthy pair says "nothing to repair" first;
  `releases prune` reports the space it freed in human units;
- item 4: a real `pairctl build` (the build cache's hit of the lab baseline) through a pipe
  prints one plain line per phase on stderr while it runs, its result on stdout;
- the examples of README.md and of every guide (docs/guides/*.md): every `pairctl` line of their
  code blocks, expanded (tests/plugins/readme.py), run in-process against this pair with the exit
  code each must end with (blocks marked `<!-- examples: config-repo -->` in a config repo that the
  document's own `pairctl init` made); the lines that cannot run in the lab are listed in NOT_RUN
  with the reason and the test that covers them instead;
- item 3: `rollback` and `accept` on a real pseudo-terminal redraw cleanly: each step or check
  shown once, no spinner or start line left behind, the outcome last.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build.store import PackageStore
from tests.faults.harness import FaultPair, fresh_pair
from tests.plugins.cli import run_cli
from tests.plugins.readme import WALKS, Example, documents, example_lines, examples
from tests.plugins.tty import SPINNER_GLYPHS, run_in_pty, screen

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NAME = "readme"
PORTS = (8194, 50194)
PROFILE_C = "lab-real"  # a third package of the baseline: the same build, another id prefix

# lines of README.md and the guides (comment removed) that this lab cannot run, each with why and what covers it
NOT_RUN = {
    # first-deploy.md's GPU pair: tests/e2e/test_first_deploy.py follows that guide on lab hosts
    "pairctl build --rev REV --source ~/src/llama.cpp --target v100 --target rtx5060ti --profile production": (
        "CUDA targets of the real GPU hosts: tests/e2e/test_first_deploy.py builds the lab's targets"
    ),
    "pairctl deploy --pair prod --native NATIVE_ID --rpc RPC_ID": "the guide's pair: tests/e2e/test_first_deploy.py",
    "pairctl status --pair prod": "the guide's pair: tests/e2e/test_first_deploy.py",
    "pairctl accept --pair prod": "the guide's pair: tests/e2e/test_first_deploy.py",
    "pairctl deploy --rev REV --all --canary prod1 --serial 2 --max-fail 1 --dry-run": (  # README's tour
        "production pairs prod1...: tests/e2e/test_fleet_rollout.py runs rollouts on lab3"
    ),
    "pairctl deploy --rev REV --source ~/src/llama.cpp --all --canary prod1 --serial 2 --max-fail 1 --dry-run": (
        "production pairs prod1...: tests/e2e/test_fleet_rollout.py runs rollouts on lab3"
    ),
    "pairctl deploy --rev REV --source ~/src/llama.cpp --all --canary prod1 --serial 2 --max-fail 1": (
        "production pairs prod1...: tests/e2e/test_fleet_rollout.py runs rollouts on lab3"
    ),
    "pairctl qualify --calibrate --pair lab --baseline A A --plan lab": (
        "minutes of measurement: tests/e2e/test_qualify.py"
    ),
    "pairctl qualify --pair lab --baseline A A --candidate B B --plan manifests/plans/lab.yaml": (
        "minutes of measurement: tests/e2e/test_qualify.py"
    ),
    "pairctl receipts init-remote": "needs an evidence_remote: tests/e2e/test_team_evidence.py",
    "pairctl receipts pull": "needs an evidence_remote: tests/e2e/test_team_evidence.py",
    "pairctl receipts verify --remote": "needs an evidence_remote: tests/e2e/test_team_evidence.py",
    "pairctl bisect --pair lab --good baseline --bad v2 --checks cached_continuation": (
        "builds and tests each step (minutes): tests/e2e/test_bisect.py"
    ),
    "pairctl bisect --pair lab --good baseline --bad v2 --checks reference_logprobs": (
        "builds and tests each step (minutes): tests/e2e/test_bisect.py"
    ),
    "pairctl bisect --pair lab --good baseline --bad v2 --plan my-plan.yaml": (
        "my-plan.yaml is the reader's own plan; a qualification per step: tests/e2e/test_bisect.py"
    ),
    "pairctl bisect --pair lab --resume": "an interrupted bisect to resume: tests/e2e/test_bisect.py",
    "pairctl lease release lab --dead-run RUN": (
        "a killed bisect's lease: tests/e2e/test_bisect_killed.py releases it after each SIGKILL"
    ),
    'pairctl receipts quarantine mallory-vm-0badc0 --reason "signed by a key nobody on the team owns"': (
        "a stray branch on an evidence remote: tests/e2e/test_evidence_hook.py"
    ),
    "pairctl schedule install --pair prod --every 6h --checks identity,cached_continuation": (
        "installs and enables units on the operator's machine: tests/unit/test_ops_schedule.py renders them"
    ),
}

# exit codes other than 0 that an example must end with here, by its expanded (unfilled) words
EXIT = {
    "diff --pair lab --profile P --native ID --rpc ID": 1,  # P: another profile, so its flags differ
    # one reused step of a deploy covers too little of it: the derived record says what is not
    # covered and is inconclusive (9), as the exit-code table has it
    "receipts derive --from HASH --reuse STEP --reason TEXT": 9,
    # neither --yes nor --dry-run, and no terminal to ask on: refused before anything is read (2)
    "receipts prune --older-than DAYS": 2,
    "receipts prune --older-than DAYS --archive FILE": 2,
}


@pytest.fixture(scope="module")
def fp(request, pairctl_home) -> Iterator[FaultPair]:
    with fresh_pair(request, pairctl_home, NAME, PORTS) as pair:  # its first deploy has no previous
        yield pair


@pytest.fixture(scope="module")
def build_c(fp: FaultPair) -> tuple[subprocess.CompletedProcess[str], float]:
    """`pairctl build` of the baseline under another profile, as a child process with pipes."""
    t0 = time.monotonic()
    argv = fp.argv("build", "--rev", "baseline", "--target", "cpu-lab", "--profile", PROFILE_C)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=fp.env(), check=False)
    return p, time.monotonic() - t0


def _package_c(fp: FaultPair) -> str:
    a = fp.packages[0]
    return next(i for i in PackageStore(fp.home.store).ids() if i.startswith(f"{PROFILE_C}-") and a.split("-")[1] in i)


def _ok(p: subprocess.CompletedProcess[str], what: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    assert p.returncode == code, f"{what}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    return p


def _deploy(fp: FaultPair, pkg: str) -> dict[str, Any]:
    p = fp.cli("--json", "deploy", "--pair", NAME, "--native", pkg, "--rpc", pkg, "--skip-accept")
    return json.loads(_ok(p, f"deploy {pkg}").stdout)


def test_a_first_deploy_status_repair_and_prune_read_well(fp: FaultPair, build_c) -> None:
    """`build_c`: the third package (the baseline under another profile) this test deploys."""
    a, b = fp.packages
    out = fp.cli("deploy", "--pair", NAME, "--native", a, "--rpc", a, "--skip-accept")
    _ok(out, "the first deploy")
    assert "started at boot" not in out.stdout + out.stderr, out.stdout

    code, st = fp.status()
    assert code == 0 and all(h["previous"] is None for h in st["hosts"].values()), st["hosts"]
    assert st["route"]["previous"] is None, st["route"]
    rc, raw = run_in_pty(fp.argv("status", "--pair", NAME), env=fp.env(), timeout_s=120, columns=100)
    text = "\n".join(screen(raw))
    assert rc == 0, text
    assert "None" not in text and "…" not in text, text
    assert re.search(r"route: revision \d+ active .* previous - ", text), text
    assert a in "".join(ch for ch in text if ch not in " │┃\n"), text  # folded, never cut
    assert "started at boot" not in text, text
    assert all(f"boot: {NAME}-{r}:" not in text or "at the next boot" in text for r in ("native", "rpc")), text

    rep = _ok(fp.cli("repair", "--pair", NAME), "repair of a healthy pair")
    lines = rep.stdout.splitlines()
    assert lines[0].startswith(f"nothing to repair: pair {NAME}'s route record is valid"), rep.stdout
    assert len(lines) <= 3, rep.stdout  # not the 300-line record

    c = _package_c(fp)
    _deploy(fp, c)
    _deploy(fp, b)  # releases a, c, b: b current, c previous, a the one a prune may remove
    pr = _ok(fp.cli("releases", "prune", "--pair", NAME, "--keep", "1"), "releases prune")
    m = re.search(rf"pruned {NAME}: (\d+) release\(s\), ([\d.]+) (B|kB|MB|GB) freed", pr.stdout)
    assert m and int(m.group(1)) == 2 and m.group(3) in ("kB", "MB"), pr.stdout  # a on both hosts
    assert not (fp.roots["native"] / "releases" / a).exists()


def test_build_through_a_pipe_prints_a_line_per_phase(fp: FaultPair, build_c) -> None:
    p, took = build_c
    _ok(p, "build")
    progress = [line for line in p.stderr.splitlines() if line.startswith("pairctl: [")]
    assert len(progress) >= 3 and progress == p.stderr.splitlines()[: len(progress)], p.stderr
    assert _package_c(fp) in p.stdout and not re.search(r"^pairctl: \[", p.stdout, re.M), p.stdout
    assert took < 120, took


def _values(fp: FaultPair) -> dict[str, Callable[[], str]]:
    def last_receipt() -> str:
        """The pair's newest deploy: `derive` reusing one of its steps is then always incomplete (EXIT)."""
        rows = json.loads(_ok(fp.cli("--json", "receipts", "list", "--pair", NAME), "receipts list").stdout)
        rows = rows.get("receipts", rows) if isinstance(rows, dict) else rows
        rows = [r for r in rows if r.get("command") == "deploy"] or rows
        return rows[-1]["receipt"] if "receipt" in rows[-1] else rows[-1]["hash"]

    def a_step() -> str:
        doc = json.loads(_ok(fp.cli("--json", "receipts", "show", last_receipt()), "receipts show").stdout)
        return next(s["name"] for s in doc["steps"] if s["outcome"] == "passed")

    a = fp.packages[0]
    return {
        "ID": lambda: a,
        "A": lambda: a,
        "B": lambda: fp.packages[1],
        "RELEASE": lambda: a,
        "HASH": last_receipt,
        "STEP": a_step,
        "TEXT": lambda: "checked by the README test",
        "REV": lambda: "baseline",
        "N": lambda: "2",
        "v2": lambda: "lab-b",
        # no receipt here is 90 days old: the prune examples find nothing to remove in the session's home
        "DAYS": lambda: "90",
        "FILE": lambda: str(fp.home.root / NAME / "prune-example.tar.xz"),
    }


def _fill(argv: tuple[str, ...], values: dict[str, Callable[[], str]], tmp_path: Path) -> list[str]:
    out: list[str] = []
    for prev, w in zip(("",) + argv, argv, strict=False):
        if prev == "--pair" and w in ("lab", "P"):
            w = NAME
        elif prev == "--profile" and w == "P":
            w = "lab-draft-other"
        elif prev == "--watch" and w == "S":
            w = "0.2"
        elif prev == "--for" and w == "S":
            w = "1"
        elif prev == "--unit-dir" and w == "DIR":
            w = str(tmp_path / "units")
        elif w in values:
            w = values[w]()
        out.append(w)
    return out


def test_the_readme_examples_run(fp: FaultPair, tmp_path: Path, monkeypatch) -> None:
    """README.md's examples, then every guide's (docs/guides/*.md, by file name)."""
    lines = {line for doc in documents() for _, line in example_lines(doc.read_text())}
    assert set(NOT_RUN) <= lines, sorted(set(NOT_RUN) - lines)  # a line no document has any more
    if fp.status()[1]["route"] is None:  # run alone (-k): the pair the tests above leave
        _deploy(fp, fp.packages[0])
        _deploy(fp, fp.packages[1])
    values = _values(fp)
    # the examples' homes below are new folders, and ccache keeps its cache under $HOME: without
    # this a guide's `build --patch` compiles all of llama.cpp cold (500 s and 900 core-s on 2 cores,
    # with every other worker's build waiting on the build lock) instead of a few cache hits
    if shutil.which("ccache") and "CCACHE_DIR" not in os.environ:
        got = subprocess.run(["ccache", "--get-config", "cache_dir"], capture_output=True, text=True, check=False)
        if got.returncode == 0 and got.stdout.strip():
            monkeypatch.setenv("CCACHE_DIR", got.stdout.strip())
    ran: list[str] = []
    sources: set[str] = set()
    for ex in examples():
        if ex.line in NOT_RUN or ex.context in WALKS:  # a walk-through: its own test runs it
            continue
        words = " ".join(ex.argv)
        argv = _fill(ex.argv, values, tmp_path)
        # each document's own HOME: `~` in its examples (an archive, a config repo) lands there
        home = tmp_path / ex.source.stem
        home.mkdir(exist_ok=True)
        monkeypatch.setenv("HOME", str(home))
        if ex.context == "config-repo":  # the document's own config repository, made by `pairctl init`
            repo = home / "ops" / "pairctl"
            argv = [str(repo) if w == "~/ops/pairctl" else w for w in argv]
            monkeypatch.setenv("PAIRCTL_CONFIG", str(repo))
            # the guide's key step (`umask 077; ... cat > ~/.config/pairctl/prod.key`) in that home:
            # `config check` refuses an api_key_file that is missing or readable by others
            key = home / ".config" / "pairctl" / "prod.key"
            if not key.exists():
                key.parent.mkdir(parents=True, exist_ok=True)
                key.write_text("sk-readme-example\n")
                key.chmod(0o600)
            monkeypatch.setenv("PAIRCTL_INVENTORY", "site")
            r = run_cli(["--home", str(fp.home.root), *argv])
            monkeypatch.delenv("PAIRCTL_INVENTORY")
            monkeypatch.delenv("PAIRCTL_CONFIG")
        else:
            r = run_cli(["--home", str(fp.home.root), "--inventory", str(fp.inventory_path), *argv])
        want = EXIT.get(words, 0)
        assert r.exit_code == want, _failure(ex, argv, r.exit_code, want, r.stdout, r.stderr)
        assert "Traceback" not in r.output, r.output[-3000:]
        ran.append(words)
        sources.add(ex.source.name)
    assert len(ran) >= 30, ran
    guides = {d.name for d in documents()[1:] if example_lines(d.read_text())}
    assert guides <= sources, sorted(guides - sources)  # every guide with examples ran some


def _failure(ex: Example, argv: list[str], code: int, want: int, out: str, err: str) -> str:
    return f"{ex.where}: pairctl {' '.join(argv)}: exit {code}, want {want}\n{out[-2000:]}\n{err[-3000:]}"


def _clean(shown: list[str], text: str) -> None:
    assert not SPINNER_GLYPHS & set(text), text  # no stale spinner
    assert not any(s.rstrip().endswith("...") for s in shown), text  # no start line left behind
    assert not re.search(r"\x1b|\[\d+[A-Za-z]|\r", text), text  # no control bytes on the final screen


def test_rollback_and_accept_on_a_terminal_redraw_cleanly(fp: FaultPair) -> None:
    code, st = fp.status()
    if not (st["route"] or {}).get("previous"):  # run alone (-k): something to go back to
        _deploy(fp, fp.packages[1])
        _deploy(fp, fp.packages[0])
    code, raw = run_in_pty(fp.argv("rollback", "--pair", NAME), env=fp.env(), timeout_s=300)
    shown = screen(raw)
    text = "\n".join(shown)
    assert code == 0, text[-3000:]
    _clean(shown, text)
    steps = [s.split()[1] for s in shown if re.match(r"step \S+ +(ok|FAILED) ", s)]
    assert len(steps) >= 4 and len(steps) == len(set(steps)), text  # every step once
    result = [i for i, s in enumerate(shown) if s.startswith(f"rollback {NAME}: passed")]
    assert len(result) == 1 and result[0] >= len(shown) - 2, text  # the outcome last (then what is active)
    assert all(not s.startswith("step ") for s in shown[result[0] :]), text

    code, raw = run_in_pty(
        fp.argv("accept", "--pair", NAME, "--checks", "identity,cached_continuation"), env=fp.env(), timeout_s=300
    )
    shown = screen(raw)
    text = "\n".join(shown)
    assert code == 0, text[-3000:]
    _clean(shown, text)
    checks = [s for s in shown if re.match(r"check \S+ .*: (pass|FAIL)", s)]
    assert len(checks) == len({c.split(":")[0] for c in checks}) >= 2, text  # each check once
    last = [s for s in shown if s.strip()][-1]
    assert re.search(r"\b(passed|PASSED|pass)\b", last), text  # the final line says the outcome
