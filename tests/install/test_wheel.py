"""The wheel works from any directory: bundled defaults are package data, read through
importlib.resources, never found relative to a checkout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.plugins.wheel import Installed, wheel_names


def test_wheel_carries_the_bundled_defaults(installed_pairctl: Installed):
    names = wheel_names(installed_pairctl.wheel)
    data = "orchestrator/_data/"
    for must in (
        "manifests/inventories/lab.yaml",
        "manifests/targets/v100.yaml",
        "manifests/profiles/production.yaml",
        "manifests/fixtures/lab.yaml",
        "manifests/fixtures/qualify/lab-code.txt",
        "playbooks/deploy.yaml",
        "kernels/mmvf-warp-per-row/patch.diff",
        "kernels/harness/kernel_cases.cpp",
    ):
        assert data + must in names, must
    assert "orchestrator/hosts/pairctl-svc.sh" in names
    for pkg in (
        "build",
        "checks",
        "cli",
        "config",
        "engine",
        "evidence",
        "hosts",
        "lab",
        "ops",
        "qualify",
        "remote",
        "server",
    ):
        assert any(n.startswith(f"orchestrator/{pkg}/") and n.endswith(".py") for n in names), pkg
    repo = Path(__file__).resolve().parents[2]
    bundled = {
        f"{data}{p.relative_to(repo).as_posix()}"
        for top in ("manifests", "playbooks", "kernels")
        for p in (repo / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert bundled == {n for n in names if n.startswith(data)}  # every bundled file, nothing else
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "manifests/"))]


def test_installed_pairctl_runs_from_a_temporary_directory(installed_pairctl: Installed, tmp_path: Path):
    cwd, home = tmp_path / "elsewhere", tmp_path / "home"
    cwd.mkdir()
    code = "import orchestrator, orchestrator.paths as p; print(orchestrator.__file__); print(p.MANIFESTS)"
    where = subprocess.run(
        [str(installed_pairctl.python), "-c", code],
        cwd=cwd,
        env=installed_pairctl.env(home),
        capture_output=True,
        text=True,
        check=True,
    )
    mod, manifests = where.stdout.split()
    assert mod.startswith(str(installed_pairctl.venv)), mod  # the wheel's code, not the checkout's
    assert manifests.startswith(str(installed_pairctl.venv)) and manifests.endswith("orchestrator/_data/manifests")

    r = installed_pairctl.run(cwd, home, "--json", "config", "check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    checked = json.loads(r.stdout)
    assert len(checked) > 20 and all(c["ok"] for c in checked)
    assert all(c["file"].startswith(str(installed_pairctl.venv)) for c in checked)

    r = installed_pairctl.run(cwd, home, "--json", "lab", "status")
    assert r.returncode == 0, r.stderr[-3000:]
    st = json.loads(r.stdout)
    assert {h["host"] for h in st["hosts"]} == {"lab-native", "lab-rpc"}
    assert all(h["install_root"].startswith(str(home)) for h in st["hosts"])


def test_installed_pairctl_with_an_init_config_repo(installed_pairctl: Installed, tmp_path: Path):
    cwd, home = tmp_path / "ops", tmp_path / "home"
    cwd.mkdir()
    r = installed_pairctl.run(cwd, home, "init", "pairctl")  # ./pairctl: found from the working directory
    assert r.returncode == 0, r.stderr
    r = installed_pairctl.run(cwd, home, "--json", "config", "show")
    shown = json.loads(r.stdout)
    assert shown["search_path"][0] == {"origin": "./pairctl", "root": str(cwd / "pairctl")}
    assert shown["names"]["inventory"]["site"]["path"] == str(cwd / "pairctl" / "inventories" / "site.yaml")
    # init's pair names an api_key_file the operator has not written yet: config check says so (issue 34)
    user_home = tmp_path / "user"
    r = installed_pairctl.run(cwd, home, "config", "check", HOME=str(user_home))
    assert r.returncode == 3 and "api_key_file" in r.stdout and "does not exist" in r.stdout, r.stdout[-3000:]
    key = user_home / ".config" / "pairctl" / "prod.key"
    key.parent.mkdir(parents=True)
    key.write_text("k3y\n")
    key.chmod(0o600)
    r = installed_pairctl.run(cwd, home, "config", "check", HOME=str(user_home))
    assert r.returncode == 0, r.stdout[-3000:]
    r = installed_pairctl.run(cwd, home, "-i", "site", "--json", "releases", "list", "--pair", "nosuch")
    assert r.returncode == 3 and "no pair named 'nosuch'" in r.stderr
