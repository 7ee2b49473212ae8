"""Config is believed by owner and mode, never by where it was found (issue 32, item 1).

The attack as it was run: a `pairctl/` folder owned by another user (`nobody`) and world-writable,
planted in a parent of the operator's working directory, with its own inventory (a hook running
`id`), targets (a CMake include) and a playbook without verify and acceptance. These tests plant
real directories with real owners (the suite runs as root, so chown works) and run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.config import search, trust
from orchestrator.paths import MANIFESTS, PLAYBOOKS

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv(search.CONFIG_ENV, "")
    monkeypatch.delenv(search.CONFIG_ENV)
    monkeypatch.setattr(search, "user_config_dir", lambda: tmp_path / "no-user-config")
    return tmp_path


def _plant(root: Path, *, owner: int = NOBODY, mode: int = 0o777) -> Path:
    """A config dir as the attacker left it: an inventory whose hook runs `id`, a cpu-lab target
    with a CMake include, a deploy playbook with neither verify nor accept."""
    inv = yaml.safe_load((MANIFESTS / "inventories" / "lab.yaml").read_text())
    inv["hooks"] = [{"on": ["deploy.passed"], "argv": ["id"]}]
    tgt = yaml.safe_load((MANIFESTS / "targets" / "cpu-lab.yaml").read_text())
    tgt.setdefault("cmake_flags", {})
    pb = yaml.safe_load((PLAYBOOKS / "deploy.yaml").read_text())
    pb["steps"] = [s for s in pb["steps"] if s["action"] not in ("verify", "accept")]
    files = {"inventories/lab.yaml": inv, "targets/cpu-lab.yaml": tgt, "playbooks/deploy.yaml": pb}
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(data))
    for p in (root, *root.rglob("*")):
        os.chown(p, owner, owner)
        os.chmod(p, mode if p.is_dir() else mode & 0o666)
    return root


def _pairctl(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an operator runs it from CWD (no inventory named: a test lab's
    PAIRCTL_INVENTORY, set for a second lab or an xdist worker, would skip the config search)."""
    e = {k: v for k, v in os.environ.items() if k not in (search.CONFIG_ENV, "PAIRCTL_INVENTORY")}
    e["XDG_CONFIG_HOME"] = str(cwd / ".no-xdg")
    e.update(env or {})
    exe = Path(sys.executable).parent / "pairctl"
    return subprocess.run([str(exe), *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)


def test_planted_parent_dir_owned_by_nobody_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)  # like /tmp: anyone may add, nobody may replace another's entry
    planted = _plant(shared / "pairctl")
    work = shared / "alice" / "proj"
    work.mkdir(parents=True)
    for args in (["config", "show"], ["config", "check"], ["status", "--pair", "lab"]):
        r = _pairctl(work, "--home", str(tmp_path / "home"), *args)
        assert r.returncode == 3, (args, r.stdout, r.stderr)
        first = r.stderr.strip().splitlines()[0]
        assert f"refusing config directory {planted}" in first and "uid 65534" in first, r.stderr
        assert "Traceback" not in r.stderr
        assert "hint:" in r.stderr and "chown" in r.stderr


def test_planted_dir_refused_even_with_pairctl_config_set(tmp_path):
    """PAIRCTL_CONFIG as the README advises does not shadow a planted targets/cpu-lab.yaml: the
    planted layer is refused, not searched after the operator's."""
    ops = tmp_path / "ops"
    (ops / "inventories").mkdir(parents=True)
    planted = _plant(tmp_path / "pairctl", mode=0o755)  # not even writable by others: owned by nobody
    r = _pairctl(tmp_path, "--home", str(tmp_path / "home"), "config", "show", env={search.CONFIG_ENV: str(ops)})
    assert r.returncode == 3 and f"refusing config directory {planted}" in r.stderr, r.stderr


def test_world_writable_dir_of_my_own_is_refused(tmp_path):
    mine = _plant(tmp_path / "pairctl", owner=0, mode=0o777)
    r = _pairctl(tmp_path, "--home", str(tmp_path / "home"), "config", "show")
    assert r.returncode == 3 and f"refusing config directory {mine}" in r.stderr and "writable by others" in r.stderr


def test_foreign_file_in_my_dir_is_refused_where_it_is_loaded(tmp_path, clean_env, cli):
    ops = _plant(tmp_path / "ops", owner=0, mode=0o755)
    tgt = ops / "targets" / "cpu-lab.yaml"
    os.chown(tgt, NOBODY, NOBODY)
    r = cli("--config", str(ops), "config", "check", str(tgt))
    assert r.exit_code == 3 and f"refusing {tgt}" in r.stdout + r.stderr and "uid 65534" in r.output
    os.chown(tgt, 0, 0)
    os.chmod(tgt, 0o664)
    r = cli("--config", str(ops), "config", "check", str(tgt))
    assert r.exit_code == 3 and "writable by its group" in r.output


def test_link_through_a_directory_others_can_replace_is_refused(tmp_path):
    """A safe dir reached through a link in a world-writable, non-sticky dir: whoever can
    replace the link chooses the config."""
    real = _plant(tmp_path / "real", owner=0, mode=0o755)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    (open_dir / "cfg").symlink_to(real)
    why = trust.unsafe_reason(open_dir / "cfg")
    assert why is not None and str(open_dir) in why and "writable by others" in why
    r = _pairctl(
        tmp_path, "--home", str(tmp_path / "home"), "config", "show", env={search.CONFIG_ENV: str(open_dir / "cfg")}
    )
    assert r.returncode == 3 and "refusing config directory" in r.stderr
    assert trust.unsafe_reason(real) is None


def test_walk_up_stops_at_a_directory_owned_by_someone_else(tmp_path):
    """git's rule: discovery does not cross into another user's tree. From a directory inside
    nobody's folder, nobody's `pairctl/` beside it is never a candidate (no error, not used)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _plant(theirs / "pairctl", mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    work = theirs / "mine"
    work.mkdir()
    assert search.find_upwards(work) is None
    r = _pairctl(work, "--home", str(tmp_path / "home"), "--json", "config", "show")
    assert r.returncode == 0, r.stderr
    assert "./pairctl" not in r.stdout


def test_safe_dirs_still_work(clean_env, monkeypatch):
    ops = clean_env / "proj" / "pairctl"
    (ops / "profiles").mkdir(parents=True)
    (ops / "profiles" / "mine.yaml").write_text(yaml.safe_dump({"name": "mine", "ctx_size": 4096, "parallel": 2}))
    monkeypatch.chdir(clean_env / "proj")
    assert [lay.origin for lay in search.current_layers()] == ["./pairctl", "bundled"]
    assert search.resolve("profile", "mine") == ops.resolve() / "profiles" / "mine.yaml"


@pytest.mark.parametrize("dropped", ["verify", "accept", "preflight", "route-accepted"])
def test_deploy_playbook_without_a_required_step_fails_config_check(tmp_path, clean_env, cli, dropped):
    """The operator's own config repo: a deploy.yaml that drops verify, accept or preflight
    fails `config check` and every deploy (exit 3) instead of running without them."""
    ops = _plant(tmp_path / "ops", owner=0, mode=0o755)
    pb_path = ops / "playbooks" / "deploy.yaml"
    pb = yaml.safe_load((PLAYBOOKS / "deploy.yaml").read_text())
    pb["steps"] = [s for s in pb["steps"] if s["action"] != dropped]
    pb_path.write_text(yaml.safe_dump(pb))
    r = cli("--config", str(ops), "config", "check", str(pb_path))
    assert r.exit_code == 3 and f"lacks the step action: {dropped}" in r.stdout, r.output
    r = cli("--config", str(ops), "deploy", "--pair", "lab", "--native", "a", "--rpc", "b")
    assert r.exit_code == 3 and "lacks the step action" in r.output and "Traceback" not in r.output


def test_deploy_playbook_that_softens_verify_or_renames_itself_fails(tmp_path, clean_env, cli):
    ops = _plant(tmp_path / "ops", owner=0, mode=0o755)
    pb_path = ops / "playbooks" / "deploy.yaml"
    pb = yaml.safe_load((PLAYBOOKS / "deploy.yaml").read_text())
    for s in pb["steps"]:
        if s["action"] == "verify":
            s["on_failure"] = "continue"
    pb_path.write_text(yaml.safe_dump(pb))
    r = cli("--config", str(ops), "config", "check", str(pb_path))
    assert r.exit_code == 3 and "action: verify (host: both, on_failure: rollback)" in r.stdout
    pb = yaml.safe_load((PLAYBOOKS / "deploy.yaml").read_text())
    pb["name"], pb["steps"] = "mine", pb["steps"][:3]
    pb_path.write_text(yaml.safe_dump(pb))
    r = cli("--config", str(ops), "config", "check", str(pb_path))
    assert r.exit_code == 3 and "loads this file as the 'deploy' playbook" in r.stdout
    r = cli("--config", str(ops), "deploy", "--pair", "lab", "--native", "a", "--rpc", "b")
    assert r.exit_code == 3 and "loads this file as the 'deploy' playbook" in r.output


def test_bundled_playbooks_have_their_required_steps():
    from orchestrator.engine.actions import load_playbook
    from orchestrator.engine.playbook import required_steps

    for name in required_steps():
        assert load_playbook(name).name == name


def test_a_target_or_playbook_override_is_said_on_stderr(tmp_path):
    """A config repo's targets/ and playbooks/ change build flags and steps: resolving one is said
    on stderr by every command that uses it, not only by `config show`."""
    ops = _plant(tmp_path / "ops", owner=0, mode=0o755)
    code = (
        "from orchestrator.config import search; search.resolve('target', 'cpu-lab'); search.resolve('profile', 'lab')"
    )
    env = {k: v for k, v in os.environ.items() if k != search.CONFIG_ENV}
    env.update({search.CONFIG_ENV: str(ops), "XDG_CONFIG_HOME": str(tmp_path / "x")})
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"target 'cpu-lab' comes from {ops.resolve() / 'targets' / 'cpu-lab.yaml'}" in p.stderr, p.stderr
    assert "overrides the bundled one" in p.stderr and "profile" not in p.stderr


def test_override_notice_names_the_file(tmp_path, clean_env, monkeypatch, capsys):
    ops = _plant(tmp_path / "ops", owner=0, mode=0o755)
    monkeypatch.setenv(search.CONFIG_ENV, str(ops))
    search._said.clear()
    said: list[str] = []
    monkeypatch.setattr(search, "_say_override", lambda k, n, p, o: said.append(f"{k} {n} {p} {o}"))
    search.resolve("target", "cpu-lab")
    search.resolve("profile", "lab")
    assert said == [f"target cpu-lab {ops.resolve() / 'targets' / 'cpu-lab.yaml'} {search.CONFIG_ENV}"]


def test_a_deploy_playbook_naming_route_repair_is_refused(tmp_path, clean_env, cli):
    """route-repair (a signed route write and relinks, decided by `pairctl repair`) was in the
    registry every playbook loads from: an operator's own deploy.yaml could run it. Refused with
    the step named (exit 3, no traceback); the bundled repair playbook still loads."""
    from orchestrator.engine.actions import load_playbook

    ops = _plant(tmp_path / "ops", owner=0, mode=0o755)
    pb_path = ops / "playbooks" / "deploy.yaml"
    pb = yaml.safe_load((PLAYBOOKS / "deploy.yaml").read_text())
    pb["steps"].insert(-1, {"name": "sneak", "host": "both", "action": "route-repair", "on_failure": "rollback"})
    pb_path.write_text(yaml.safe_dump(pb))
    want = "step 'sneak': action 'route-repair' runs only in the 'repair' playbook"
    r = cli("--config", str(ops), "config", "check", str(pb_path))
    assert r.exit_code == 3 and want in r.stdout, r.output
    r = cli("--config", str(ops), "deploy", "--pair", "lab", "--native", "a", "--rpc", "b")
    assert r.exit_code == 3 and want in r.output and "Traceback" not in r.output
    assert any(s.action == "route-repair" for s in load_playbook("repair").steps)
