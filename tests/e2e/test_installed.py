"""Done-when of issue 17: the wheel, installed in a fresh venv, run from a temporary directory
outside the checkout against a config repo made by `pairctl init` (its hosts replaced by the
lab's), builds nothing and deploys, shows and rolls back a real llama-server + ggml-rpc-server
pair. Deploys prune old releases under the lease and say so in their receipt."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from tests.plugins.wheel import Installed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

LAB_HOST = {"v100": "lab-native", "rtx5060ti": "lab-rpc"}  # init's hosts -> the lab's sshd hosts
# The pair `prod` lives beside the lab's own pair on the same sshd hosts: its own install roots (so
# neither pair's route record names the other) and its own ports (so both can run at once).
PROD_SUFFIX = "-prod"
PROD_PORTS = {"server_port": 8181, "rpc_port": 50181}


def _prod_root(lab_root: str) -> str:
    return lab_root.rstrip("/") + PROD_SUFFIX


def _stop_prod(roots: list[str]) -> None:
    """The lab's `down` stops what runs under the lab's roots; prod's services run under their own."""
    for root in roots:
        for pidfile in Path(root, "run").glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            except (ValueError, IndexError, ProcessLookupError):
                pass


def _substitute_lab_hosts(site: Path, lab_inventory: Path) -> None:
    """Keep init's inventory (its names, comments lost), swap in how to reach the lab hosts,
    the lab's targets, models and profile (the production profile needs a 266240-token model)."""
    inv = yaml.safe_load(site.read_text())
    lab = yaml.safe_load(lab_inventory.read_text())
    inv["known_hosts"] = lab["known_hosts"]
    for name, lab_name in LAB_HOST.items():
        h = lab["hosts"][lab_name]
        inv["hosts"][name].update({k: h[k] for k in ("address", "port", "user", "key")})
        inv["hosts"][name]["install_root"] = _prod_root(h["install_root"])
        inv["hosts"][name].pop("gpu", None)
    lab_pair = lab["pairs"]["lab"]
    inv["pairs"]["prod"].update(
        profile="lab", target_native="cpu-lab", target_rpc="cpu-lab", models=lab_pair["models"], **PROD_PORTS
    )
    # the lab serves on loopback: its pair's API key setting comes along with its hosts
    inv["pairs"]["prod"].pop("api_key_file", None)
    if lab_pair.get("api_key_file"):
        inv["pairs"]["prod"]["api_key_file"] = lab_pair["api_key_file"]
    site.write_text(yaml.safe_dump(inv, sort_keys=False))


def _status(installed: Installed, cwd: Path, home: Path) -> dict:
    r = installed.run(cwd, home, "-i", "site", "--json", "status", "--pair", "prod")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _links(st: dict) -> set[tuple[str, str | None]]:
    return {(h["current"], h["previous"]) for h in st["hosts"].values()}


def test_installed_wheel_init_repo_deploy_and_rollback(
    installed_pairctl: Installed,
    lab,
    lab_packages,
    lab_packages_b,
    pairctl_home: Path,
    tmp_path: Path,
    restore_baseline,
):
    home = pairctl_home
    cwd = tmp_path / "ops"
    cwd.mkdir()
    run = installed_pairctl.run
    r = run(cwd, home, "init", "pairctl")
    assert r.returncode == 0, r.stderr
    _substitute_lab_hosts(cwd / "pairctl" / "inventories" / "site.yaml", lab.inventory_path)
    r = run(cwd, home, "config", "check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]

    a, b = lab_packages.id, lab_packages_b.id
    roots = [_prod_root(lab.inventory.host(h).install_root) for h in LAB_HOST.values()]
    try:
        _deploy_show_rollback(installed_pairctl, cwd, home, a, b)
    finally:
        _stop_prod(roots)


def _deploy_show_rollback(installed_pairctl: Installed, cwd: Path, home: Path, a: str, b: str) -> None:
    run = installed_pairctl.run
    receipts = []
    for pid in (a, b):
        r = run(cwd, home, "-i", "site", "--json", "deploy", "--pair", "prod", "--packages", pid, pid, "--skip-accept")
        assert r.returncode == 0, r.stderr[-4000:]
        receipts.append(json.loads(r.stdout)["receipt"])
    assert _links(_status(installed_pairctl, cwd, home)) == {(b, a)}

    r = run(cwd, home, "-i", "site", "--json", "rollback", "--pair", "prod")
    assert r.returncode == 0, r.stderr[-4000:]
    st = _status(installed_pairctl, cwd, home)
    assert _links(st) == {(a, b)} and not st["problems"] and st["health"] == "ok"
    # issue 34 item 7 from the installed tool: its restart playbook ships, the logs read
    r = run(cwd, home, "-i", "site", "--json", "restart", "--pair", "prod")
    assert r.returncode == 0 and json.loads(r.stdout)["outcome"] == "passed", r.stderr[-3000:]
    r = run(cwd, home, "-i", "site", "logs", "--pair", "prod", "-n", "3")
    assert r.returncode == 0 and "v100 | " in r.stdout and "rtx5060ti | " in r.stdout, r.stdout + r.stderr[-2000:]

    r = run(cwd, home, "--json", "receipts", "show", receipts[-1])
    assert r.returncode == 0, r.stderr[-2000:]
    shown = json.loads(r.stdout)
    prune = shown.get("prune") or shown.get("receipt", {}).get("prune")
    assert prune is not None and "error" not in prune, shown.keys()
    assert {h["host"] for h in prune["hosts"]} == {"v100", "rtx5060ti"}
    for h in prune["hosts"]:
        assert {a, b} <= set(h["plan"]["keep"]) and h["skipped"] is None
    r = run(cwd, home, "receipts", "verify")
    assert r.returncode == 0, r.stderr[-2000:]
