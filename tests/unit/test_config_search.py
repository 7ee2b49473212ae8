"""The config search path, `config check` (kind from content, one pass, cross-references),
`config show` and `pairctl init`, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import config_registry as registry
from orchestrator.config import search
from orchestrator.config.profiles import load_profile
from orchestrator.errors import ConfigError
from orchestrator.paths import MANIFESTS


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No PAIRCTL_CONFIG, a working directory with no ./pairctl, an empty user config dir."""
    monkeypatch.setenv(search.CONFIG_ENV, "")  # recorded, so the CLI's own setting is undone after the test
    monkeypatch.delenv(search.CONFIG_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(search, "user_config_dir", lambda: tmp_path / "no-user-config")
    return tmp_path


def _profile(root: Path, name: str, ctx: int = 4096) -> Path:
    p = root / "profiles" / f"{name}.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump({"name": name, "ctx_size": ctx, "parallel": 2}))
    return p


def test_search_path_order_and_override_by_name(clean_env, monkeypatch):
    explicit, up, user = clean_env / "explicit", clean_env / "proj" / "pairctl", clean_env / "user"
    _profile(explicit, "lab", 16384)
    _profile(up, "lab", 8192)
    _profile(up, "mine")
    _profile(user, "theirs")
    deep = clean_env / "proj" / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    monkeypatch.setattr(search, "user_config_dir", lambda: user)
    monkeypatch.setenv(search.CONFIG_ENV, str(explicit))
    assert [lay.origin for lay in search.current_layers()] == [search.CONFIG_ENV, "./pairctl", "user", "bundled"]
    assert search.resolve("profile", "lab") == explicit / "profiles" / "lab.yaml"
    assert load_profile("lab").ctx_size == 16384  # the operator's file wins over ./pairctl and bundled
    assert search.resolve("profile", "mine") == up.resolve() / "profiles" / "mine.yaml"
    assert search.resolve("profile", "theirs") == user.resolve() / "profiles" / "theirs.yaml"
    assert search.resolve("profile", "production") == MANIFESTS / "profiles" / "production.yaml"
    lab = search.names("profile")["lab"]
    assert lab.origin == search.CONFIG_ENV and len(lab.shadows) == 2
    monkeypatch.delenv(search.CONFIG_ENV)
    assert load_profile("lab").ctx_size == 8192


def test_unknown_name_says_where_it_looked(clean_env):
    with pytest.raises(ConfigError) as e:
        search.resolve("profile", "nosuch")
    assert "no profile named 'nosuch'" in str(e.value) and "config show" in str(e.value)


def test_missing_config_dir_is_refused(cli, tmp_path):
    r = cli("--config", str(tmp_path / "nope"), "config", "show")
    assert r.exit_code == 3 and "no such directory" in r.stderr


def test_check_missing_file_says_file_not_found(cli):
    r = cli("config", "check", "/nope.yaml")
    assert r.exit_code == 3
    assert "/nope.yaml: file not found" in r.stdout and "--kind" not in r.output


def test_kind_is_inferred_from_content(clean_env):
    models = registry.schemas()
    assert registry.infer_kind({"hosts": {}, "pairs": {}}, models) == "inventory"
    assert registry.infer_kind({"name": "x", "ctx_size": 1, "parallel": 1}, models) == "profile"
    assert registry.infer_kind({"name": "x", "backend": "cpu"}, models) == "target"
    assert registry.infer_kind({"name": "x"}, models) is None  # ties: ask for --kind
    assert registry.infer_kind(["not", "a", "mapping"], models) is None


def test_every_problem_in_one_pass_with_file_field_and_fix(cli, clean_env):
    p = clean_env / "mine.yaml"  # outside any manifest folder: kind from the keys
    p.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "a": {"address": "10.0.0.1", "install_root": "/x", "role": "native", "prot": 22},
                    "b": {"address": "10.0.0.2", "install_root": "relative", "role": "rpc"},
                },
                "pairs": {"p": {"native": "a", "rpc": "c", "profile": "nosuch", "target_native": "v99"}},
            }
        )
    )
    r = cli("--json", "config", "check", str(p))
    assert r.exit_code == 3
    doc = json.loads(r.stdout)  # a failed command's list output sits under `result`, beside `error`
    [res] = doc["result"]
    assert doc["error"]["exit_code"] == 3
    assert res["kind"] == "inventory"
    problems = "\n".join(res["problems"])
    assert len(res["problems"]) == 5, problems
    assert f"{p}: field 'hosts.a.prot': unknown key" in problems and "did you mean 'port'" in problems
    assert "field 'hosts.b.install_root': install_root must be an absolute path" in problems
    assert "field 'pairs.p.rpc': host 'c' is not in hosts" in problems  # a field error did not hide it
    assert "field 'pairs.p.profile': no profile named 'nosuch'" in problems
    assert "field 'pairs.p.target_native': no target named 'v99'" in problems
    assert "Value error" not in r.output


def test_profile_model_roles_are_cross_checked(cli, clean_env):
    inv = yaml.safe_load((MANIFESTS / "inventories" / "lab.yaml").read_text())
    del inv["pairs"]["lab"]["models"]["draft_other"]
    p = clean_env / "inv.yaml"
    p.write_text(yaml.safe_dump(inv))
    r = cli("config", "check", str(p))
    assert r.exit_code == 0, r.output  # the lab profile drafts with draft_perturbed only
    del inv["pairs"]["lab"]["models"]["draft_perturbed"]
    p.write_text(yaml.safe_dump(inv))
    r = cli("config", "check", str(p))
    assert r.exit_code == 3 and "uses model role 'draft_perturbed'" in r.stdout


def test_init_scaffold_passes_check_and_show_names_it(cli, clean_env, monkeypatch):
    repo = clean_env / "ops"
    monkeypatch.setenv("HOME", str(clean_env / "user"))
    key = clean_env / "user" / ".config" / "pairctl" / "prod.key"  # the template's api_key_file, as written
    key.parent.mkdir(parents=True)
    key.write_text("k3y\n")
    key.chmod(0o600)
    r = cli("init", str(repo))
    assert r.exit_code == 0, r.output
    for rel in ("README.md", "inventories/site.yaml", "profiles/production.yaml", "fixtures/site.yaml"):
        assert (repo / rel).is_file(), rel
    inv = (repo / "inventories" / "site.yaml").read_text()
    assert "role: native" in inv and "Tesla V100" in inv and "RTX 5060 Ti" in inv and "# " in inv
    r = cli("--config", str(repo), "config", "check")
    assert r.exit_code == 0, r.output
    assert str(repo / "inventories" / "site.yaml") in r.stdout
    r = cli("--config", str(repo), "--json", "config", "show")
    shown = json.loads(r.stdout)
    assert shown["names"]["inventory"]["site"]["origin"] == search.CONFIG_ENV
    assert shown["names"]["profile"]["production"]["overrides"] == [str(MANIFESTS / "profiles" / "production.yaml")]
    assert shown["names"]["profile"]["lab"]["origin"] == "bundled"
    r = cli("init", str(repo))
    assert r.exit_code == 3 and "would overwrite" in r.stderr  # never clobbers an operator's files


def test_init_inventory_is_checked_like_any_other(cli, clean_env):
    """The check can fail on the scaffold: a renamed profile is named."""
    repo = clean_env / "ops"
    assert cli("init", str(repo)).exit_code == 0
    inv = repo / "inventories" / "site.yaml"
    inv.write_text(inv.read_text().replace("profile: production", "profile: prodution"))
    r = cli("--config", str(repo), "config", "check", str(inv))
    assert r.exit_code == 3 and "no profile named 'prodution'" in r.stdout
