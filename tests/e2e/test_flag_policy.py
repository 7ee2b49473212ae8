"""Issue 16 item 1 through the real CLI and a package `pairctl build` made: a profile that turns
on llama-server's tools is refused by deploy before any host is touched (the inventory's hosts
are unreachable here: touching one would be exit 4), and goes past preflight only where the
inventory allows it for the pair with a reason and an API key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config.loader import read_yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp_path: Path, extra_args: list[str], pair_update: dict | None = None) -> Path:
    prof = read_yaml(ROOT / "manifests/profiles/lab.yaml") | {"name": "hostile", "extra_args": extra_args}
    (tmp_path / "hostile.yaml").write_text(yaml.safe_dump(prof))
    inv = read_yaml(ROOT / "manifests/inventories/lab.yaml")
    for h in inv["hosts"].values():
        h["port"] = 1  # unreachable: a deploy that touched a host would fail with exit 4
    inv["pairs"]["lab"]["profile"] = str(tmp_path / "hostile.yaml")
    inv["pairs"]["lab"].update(pair_update or {})
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps(inv))
    return path


@pytest.mark.parametrize(
    "extra",
    [
        ["--tools", "exec_shell_command"],
        ["--tools=all"],
        ["-ag"],
        ["--path", "/"],
        ["--mcp_servers_config", "/tmp/x.json"],
        ["--host=0.0.0.0"],
    ],
)
def test_risky_profile_refused_by_deploy_and_config_check(lab_packages, cli, tmp_path, extra):
    inv = _setup(tmp_path, extra)
    pid = lab_packages.id
    r = cli("deploy", "--pair", "lab", "--packages", pid, pid, "--skip-accept", inventory=str(inv))
    assert r.exit_code == 3, r.output
    assert "refused" in r.stderr or "may not set" in r.stderr
    c = cli("config", "check", "--kind", "inventory", str(inv))
    assert c.exit_code == 3 and extra[0].split("=")[0] in c.stdout + c.stderr, c.output


def test_allowed_tools_pass_preflight_only_with_reason_and_key(lab_packages, cli, tmp_path):
    key = tmp_path / "key"
    key.write_text("k3y-for-tools\n")
    key.chmod(0o600)
    pid = lab_packages.id
    no_key = _setup(tmp_path, ["--tools", "get_info"], {"allow_flags": {"--tools": "sandboxed bench host"}})
    r = cli("deploy", "--pair", "lab", "--packages", pid, pid, "--skip-accept", inventory=str(no_key))
    assert r.exit_code == 3 and "needs api_key_file" in r.stderr, r.output
    ok = _setup(
        tmp_path,
        ["--tools", "get_info"],
        {"allow_flags": {"--tools": "sandboxed bench host"}, "api_key_file": str(key)},
    )
    r = cli("deploy", "--pair", "lab", "--packages", pid, pid, "--skip-accept", inventory=str(ok))
    assert r.exit_code == 4, r.output  # past preflight (the package's --help offers --tools), then the host
