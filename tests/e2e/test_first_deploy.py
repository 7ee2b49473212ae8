"""docs/guides/first-deploy.md followed as a new operator follows it, on two lab hosts: every line
of the guide's code blocks in order, read by the README examples' own reader
(tests/plugins/readme.py), each done the way the guide says:

- `pipx install .`: the wheel installed into a fresh venv (`installed_pairctl`); every `pairctl`
  line then runs that console script, from a directory outside the checkout;
- `pairctl init`, `export`, the API key line: run as written, in a home of the test's own;
- `$EDITOR .../site.yaml`: the edits the guide lists, and only those (hosts' address, port, user,
  key, install_root and gpu; the pair's models, ports, targets and profile), made for the lab's
  sshd hosts, CPU targets and tiny models; the hosts' keys go into `~/.ssh/known_hosts` first, as
  "What you need" asks;
- build, deploy, status, accept: what the guide tells the reader to fill in (REV, `--source`, the
  pair's targets and profile, the ids `build` printed) and nothing else; each must exit 0.

A line the test does not know how to follow fails it: the guide changed, so must this test.
pairctl's state is the operator's own (the default state directory of that home: no lab source,
no packages); only its build cache is the session's, so the build compiles nothing. The deploy
runs the guide's full acceptance suite.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.build.store import PackageStore
from orchestrator.lab.lab import stop_supervisors
from orchestrator.lab.source import BASELINE_TAG
from orchestrator.paths import Home
from tests.faults.harness import processes_under
from tests.plugins.readme import GUIDES, code_lines, expand
from tests.plugins.wheel import Installed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

GUIDE = GUIDES / "first-deploy.md"
PAIR = "prod"  # the pair `pairctl init` writes
# the ports the guide says to change when taken: the lab's own pairs use 8080/50052 on these hosts
PORTS = (8197, 50197)
PROFILE = "lab"  # the lab's route on the tiny models (the guide: "or name another profile")
TARGET = "cpu-lab"  # the lab hosts' target (no GPU)
API_KEY = "sk-first-deploy-guide"


@pytest.fixture
def operator(tmp_path: Path, lab: Any, lab_packages: Any) -> Iterator[dict[str, Any]]:
    """The operator's shell: a home of its own, the lab's host keys in its known_hosts, install
    roots of its own on the lab hosts; its services stopped after."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(lab.known_hosts, home / ".ssh" / "known_hosts")
    roots = {role: tmp_path / f"{role}-root" for role in ("native", "rpc")}
    for root in roots.values():
        root.mkdir()
    # pairctl's default state directory for that home (no lab source, no packages), its build
    # cache the session's: the build compiles nothing, yet finds no source the guide did not name
    state = home / ".local" / "state" / "pairctl"
    state.mkdir(parents=True)
    (state / lab.home.build_cache.name).symlink_to(lab.home.build_cache)
    env = {"HOME": str(home), "PAIRCTL_HOME": str(state)}
    try:
        yield {"home": home, "roots": roots, "env": env, "lab": lab, "cwd": tmp_path}
    finally:
        for root in roots.values():
            stop_supervisors(root)
            for pid in processes_under(root):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass


def _edit_inventory(path: Path, op: dict[str, Any]) -> None:
    """The guide's list of what to make yours in site.yaml, for the lab."""
    lab = op["lab"]
    inv = yaml.safe_load(path.read_text())
    pair = inv["pairs"][PAIR]
    lab_pair = lab.inventory.pairs["lab"]  # its sshd hosts and models
    for role in ("native", "rpc"):
        host = inv["hosts"][pair[role]]
        lab_host = lab.inventory.hosts[getattr(lab_pair, role)]
        host.update(
            address=lab_host.address,
            port=lab_host.port,
            user=lab_host.user,
            key=str(lab.operator_key),
            install_root=str(op["roots"][role]),
        )
        host.pop("gpu", None)  # the lab's hosts have no NVIDIA GPU
    pair.update(server_port=PORTS[0], rpc_port=PORTS[1], target_native=TARGET, target_rpc=TARGET, profile=PROFILE)
    # one path per model role the lab profile uses: its model and its draft's
    pair["models"] = {role: {"path": lab_pair.models[role].path} for role in ("target", "draft_perturbed")}
    path.write_text(yaml.safe_dump(inv, sort_keys=False))


def _fill(argv: tuple[str, ...], op: dict[str, Any], ids: dict[str, str]) -> list[str]:
    """What the guide tells the reader to fill in: REV, their source clone, the pair's targets and
    profile, the package ids `build` printed; `~` as their shell expands it. Both halves of the
    lab pair have one target, so the build names it once."""
    out: list[str] = []
    for prev, w in zip(("",) + argv, argv, strict=False):
        if w == "REV":
            w = BASELINE_TAG
        elif prev == "--source":
            w = str(op["lab"].home.lab / "source")
        elif prev == "--profile":
            w = PROFILE
        elif w in ("NATIVE_ID", "RPC_ID"):
            w = ids[w]
        elif prev == "--target":
            if TARGET in out:
                out.pop()  # its `--target`
                continue
            w = TARGET
        out.append(_home(w, op))
    return out


def _home(word: str, op: dict[str, Any]) -> str:
    return str(op["home"]) + word[1:] if word == "~" or word.startswith("~/") else word


def _run(op: dict[str, Any], installed: Installed, where: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    extra = {k: v for k, v in op["env"].items() if k != "PAIRCTL_HOME"}
    p = installed.run(op["cwd"], Path(op["env"]["PAIRCTL_HOME"]), *argv, timeout=1500, **extra)
    assert p.returncode == 0, (
        f"{where}: pairctl {shlex.join(argv)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    )
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    return p


def test_the_first_deploy_guide_takes_an_operator_to_an_accepted_pair(
    operator: dict[str, Any], installed_pairctl: Installed
) -> None:
    op = operator
    ids: dict[str, str] = {}
    done: list[str] = []
    for n, raw, _ in code_lines(GUIDE.read_text()):
        line = " ".join(raw.split("#", 1)[0].split())  # the command, its comment left out
        if not line:
            continue
        where = f"{GUIDE.name}:{n}"
        if line.startswith(("pipx install ", "uv tool install ")):
            assert installed_pairctl.pairctl.exists()  # the wheel, installed by the session fixture
        elif line.startswith("export "):
            for word in shlex.split(line)[1:]:
                name, _, value = word.partition("=")
                op["env"][name] = _home(value, op)
        elif line.startswith("$EDITOR "):
            path = Path(_home(line.split()[1], op))
            assert path.name == "site.yaml", f"{where}: an edit this test does not know: {line}"
            _edit_inventory(path, op)
        elif line.startswith("(umask 077;"):
            shell = subprocess.run(
                ["bash", "-c", line], input=API_KEY + "\n", text=True, env={**os.environ, **op["env"]}, check=False
            )
            assert shell.returncode == 0, f"{where}: {line}"
        elif line.startswith("pairctl "):
            for argv in expand(line):
                filled = _fill(argv, op, ids)
                p = _run(op, installed_pairctl, where, filled)
                if argv[0] == "build":  # "It prints the ids you deploy."
                    built = set(re.findall(rf"\b{PROFILE}-[0-9a-f]{{10}}-{TARGET}\b", p.stdout))
                    assert len(built) == 1, p.stdout
                    (pkg,) = built
                    PackageStore(Home.resolve(op["env"]["PAIRCTL_HOME"]).store).get(pkg)
                    ids.update(NATIVE_ID=pkg, RPC_ID=pkg)
                done.append(" ".join(argv[:2]))
        else:
            pytest.fail(f"{where}: a line of the guide this test does not know how to follow: {line}")
    want = ["init ~/ops/pairctl", "config check", "build --rev", "deploy --pair", "status --pair", "accept --pair"]
    assert [w for w in want if w in done] == want, done
    st = json.loads(_run(op, installed_pairctl, "after the guide", ["--json", "status", "--pair", PAIR]).stdout)
    assert st["route"] is not None and ids["NATIVE_ID"] in json.dumps(st["route"]), st
