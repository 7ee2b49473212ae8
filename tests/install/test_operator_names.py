"""Issue 34, items 2 and 8, from the installed wheel in a directory outside the checkout:
`build --patch` takes the kernel names `pairctl kernels list` shows (bare or as kernels/NAME,
the README's form) and finds the bundled patch; a missing one is named plainly (no Python
repr); `build --profile` refuses a profile that does not exist."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.plugins.wheel import Installed


def _git_repo(path: Path) -> None:
    path.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for argv in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "base"]):
        subprocess.run(["git", *argv], cwd=path, check=True, env={**env, "PATH": "/usr/bin:/bin"})


def test_build_patch_by_name_from_an_installed_tool(installed_pairctl: Installed, tmp_path: Path):
    cwd, home, src = tmp_path / "elsewhere", tmp_path / "home", tmp_path / "src"
    cwd.mkdir()
    _git_repo(src)
    listed = json.loads(installed_pairctl.run(cwd, home, "--json", "kernels", "list").stdout)
    name = next(r["name"] for r in listed if "error" not in r)
    for ref in (f"kernels/{name}", name):
        r = installed_pairctl.run(
            cwd, home, "build", "--rev", "HEAD", "-t", "cpu-lab", "--patch", ref, "--source", str(src)
        )
        # found and read: the bundled patch's own base check is what refuses this toy repository
        assert f"patch {name}:" in r.stderr and "cannot apply" in r.stderr, (ref, r.stderr)
        assert "not found" not in r.stderr and "PosixPath" not in r.stderr, r.stderr
    for ref in ("no-such-kernel", "kernels/no-such-kernel"):
        r = installed_pairctl.run(
            cwd, home, "build", "--rev", "HEAD", "-t", "cpu-lab", "--patch", ref, "--source", str(src)
        )
        assert r.returncode == 3, r.stderr
        assert f"kernel patch '{ref}' not found" in r.stderr and "pairctl kernels list" in r.stderr, r.stderr
        assert "PosixPath" not in r.stderr and "Traceback" not in r.stderr


def test_build_refuses_a_profile_that_does_not_exist(installed_pairctl: Installed, tmp_path: Path):
    cwd, home, src = tmp_path / "elsewhere", tmp_path / "home", tmp_path / "src"
    cwd.mkdir()
    _git_repo(src)
    r = installed_pairctl.run(
        cwd, home, "build", "--rev", "HEAD", "-t", "cpu-lab", "--profile", "prodution", "--source", str(src)
    )
    assert r.returncode == 3, r.stderr
    assert "no profile named 'prodution'" in r.stderr and "production" in r.stderr, r.stderr


def test_preflight_checks_the_operators_own_config_and_key(installed_pairctl: Installed, tmp_path: Path):
    """Item 6: inside the directory `pairctl init` made (not on the search path), `config check`
    checks its files and says how to use them; `config check` and `doctor` name a missing or
    0644 api_key_file; init's template does not mention the retired allow_rpc_bind_any."""
    home, user = tmp_path / "home", tmp_path / "user"
    ops = tmp_path / "ops-config"
    r = installed_pairctl.run(tmp_path, home, "init", str(ops), HOME=str(user))
    assert r.returncode == 0, r.stderr
    assert "allow_rpc_bind_any" not in (ops / "inventories" / "site.yaml").read_text()
    key = user / ".config" / "pairctl" / "prod.key"

    r = installed_pairctl.run(ops, home, "config", "check", HOME=str(user))
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"{ops}/inventories/site.yaml" in r.stdout and f"api_key_file {key} does not exist" in r.stdout, r.stdout
    assert "not on the search path" in r.stderr and f"PAIRCTL_CONFIG={ops}" in r.stderr, r.stderr

    key.parent.mkdir(parents=True)
    key.write_text("k3y-0123\n")
    key.chmod(0o644)
    r = installed_pairctl.run(ops, home, "config", "check", HOME=str(user))
    assert r.returncode == 3 and "mode 0644" in r.stdout and f"chmod 600 {key}" in r.stdout, r.stdout
    env = {"HOME": str(user), "PAIRCTL_CONFIG": str(ops)}
    r = installed_pairctl.run(ops, home, "-i", "site", "--json", "doctor", **env)
    found = {f["check"]: f for f in json.loads(r.stdout)["result"]}
    assert found["api_key_file:prod"]["ok"] is False and "0644" in found["api_key_file:prod"]["detail"], found

    key.chmod(0o600)
    r = installed_pairctl.run(ops, home, "config", "check", HOME=str(user))
    assert r.returncode == 0, r.stdout[-3000:]
    r = installed_pairctl.run(ops, home, "-i", "site", "--json", "doctor", **env)
    found = {f["check"]: f for f in json.loads(r.stdout)["result"]}
    assert found["api_key_file:prod"]["ok"] is True, found
