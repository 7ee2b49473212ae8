"""Config models reject bad input with file, field and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import Inventory
from orchestrator.config.loader import load_model
from orchestrator.config.profiles import RouteProfile, load_profile, per_slot_context, unknown_flags
from orchestrator.config.targets import Target
from orchestrator.errors import ConfigError

LAB_PROFILE = yaml.safe_load((Path(__file__).parents[2] / "manifests/profiles/lab.yaml").read_text())
LAB_INV = yaml.safe_load((Path(__file__).parents[2] / "manifests/inventories/lab.yaml").read_text())


def write(tmp_path: Path, name: str, data) -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_per_slot_context_matches_llama_server():
    assert per_slot_context(266240, 2) == 133120
    assert per_slot_context(266240, 1, n_ctx_train=262144) == 262144
    assert per_slot_context(4000, 3) == 1536  # pad(4096/3=1365 -> 1536)


def test_profiles_in_repo_load():
    assert load_profile("production").per_slot_ctx() == 133120
    assert load_profile("lab").per_slot_ctx() == 2048


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"ctx_size": "lots"}, "ctx_size", "valid integer"),
        ({"near_full_slack": 5000}, "", "smaller than the per-slot context"),
        ({"cache_type_v": "q8_0", "flash_attn": "off"}, "", "needs flash_attn: on"),
        ({"ubatch_size": 4096}, "", "larger than batch_size"),
        ({"extra_args": ["--rpc", "x"]}, "", "may not set --rpc"),
    ],
)
def test_bad_profile_is_named(tmp_path, change, field, reason):
    p = write(tmp_path, "bad.yaml", {**LAB_PROFILE, **change})
    with pytest.raises(ConfigError) as ei:
        load_model(RouteProfile, p)
    msg = str(ei.value)
    assert str(p) in msg and reason in msg
    if field:
        assert f"'{field}'" in msg


def test_rpc_bind_any_needs_opt_in(tmp_path):
    """ggml-rpc-server on every address is refused; the old opt-in is refused too (issue 16 item 4)."""
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["pairs"]["lab"]["rpc_bind"] = "0.0.0.0"
    with pytest.raises(ConfigError, match="every address"):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))
    inv["pairs"]["lab"]["allow_rpc_bind_any"] = True
    with pytest.raises(ConfigError, match="allow_rpc_bind_any is not honoured"):
        load_model(Inventory, write(tmp_path, "inv2.yaml", inv))


def test_pair_names_unknown_host(tmp_path):
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["pairs"]["lab"]["rpc"] = "nowhere"
    with pytest.raises(ConfigError, match="'nowhere' is not in hosts"):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))


def test_cuda_target_needs_arch(tmp_path):
    with pytest.raises(ConfigError, match="cuda_arch"):
        load_model(Target, write(tmp_path, "t.yaml", {"name": "x", "backend": "cuda"}))


def test_unknown_flags_against_help():
    help_text = "-c,    --ctx-size N   size\n--spec-draft-n-max N\n-np, --parallel N"
    assert unknown_flags(["--ctx-size", "5", "--draft-max", "3", "-np", "2"], help_text) == ["--draft-max"]


def test_config_check_cli(cli, tmp_path):
    r = cli("config", "check")
    assert r.exit_code == 0, r.output
    bad = write(tmp_path, "bad.yaml", {**LAB_PROFILE, "parallel": 0})
    r = cli("config", "check", "--kind", "profile", str(bad))
    assert r.exit_code == 3
    assert "parallel" in r.output


def test_config_schema_cli(cli):
    r = cli("config", "schema", "profile")
    assert r.exit_code == 0 and '"ctx_size"' in r.stdout
    assert cli("config", "schema", "nope").exit_code == 3


def test_api_key_is_read_one_way(tmp_path):
    from orchestrator.config.inventory import PairSpec, read_api_key

    def pair(path):
        return PairSpec(native="n", rpc="r", api_key_file=str(path))

    assert read_api_key("p", PairSpec(native="n", rpc="r")) is None
    f = tmp_path / "key"
    f.write_text("\ns3cret-one\nsecond\n")
    k = read_api_key("p", pair(f))
    assert k.value == "s3cret-one" and k.file_bytes == f.read_bytes() and "s3cret" not in repr(k)
    f.write_text("  \n")  # llama-server would take "  " as a key
    with pytest.raises(ConfigError, match="line 1 has spaces"):
        read_api_key("p", pair(f))
    f.write_text("\n\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_api_key("p", pair(f))
    with pytest.raises(ConfigError, match="cannot read"):
        read_api_key("p", pair(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("state_dir", "why"),
    [
        ("/srv/root/run-state", "must lie outside install_root"),
        ("/srv", "must lie outside install_root"),
        ("/srv/root", "must lie outside install_root"),
        ("relative/state", "state_dir must be an absolute path"),
        ("/var/lib/../pairctl", "state_dir '/var/lib/../pairctl' is not canonical"),
    ],
)
def test_state_dir_lies_outside_the_install_root(state_dir, why):
    """Issue 49: run/ links to the host's state_dir so a read-only root still lets a start write;
    inside the root (or holding it) it would go read-only with it."""
    host = {"address": "10.0.0.1", "role": "native", "install_root": "/srv/root"}
    Inventory.model_validate({"hosts": {"n": {**host, "state_dir": "/var/lib/pairctl/n"}}})
    with pytest.raises(ValueError, match=why):
        Inventory.model_validate({"hosts": {"n": {**host, "state_dir": state_dir}}})


def test_state_dir_is_judged_again_as_expanded_and_never_shared_on_one_machine():
    """`${R}/pairctl` and `/home/op/pairctl/s` read apart but expand into one another; two roots
    on one machine sharing a state_dir would share pidfiles (one's stop kills the other's server)."""
    host = {"address": "10.0.0.1", "role": "native", "install_root": "${R}/pairctl", "state_dir": "/home/op/pairctl/s"}
    inv = Inventory.model_validate({"hosts": {"n": host}})
    with pytest.raises(ConfigError, match=r"hosts\.n\.state_dir: .*must lie outside install_root.*as expanded"):
        inv.resolved({"R": "/home/op"})
    with pytest.raises(ConfigError, match=r"hosts\.n\.state_dir: state_dir expands to 'rel'"):
        Inventory.model_validate({"hosts": {"n": {**host, "state_dir": "${S}"}}}).resolved({"R": "/h", "S": "rel"})
    two = {"a": {**host, "state_dir": "/var/lib/p"}, "b": {**host, "install_root": "/srv/b", "state_dir": "/var/lib/p"}}
    with pytest.raises(ValueError, match="hosts 'a' and 'b' share state_dir /var/lib/p on 10.0.0.1"):
        Inventory.model_validate({"hosts": two})
    Inventory.model_validate({"hosts": {**two, "b": {**two["b"], "address": "10.0.0.2"}}})  # another machine
    # two names for one root (tests/integration/test_prune's inventory) share its state as they share the root
    Inventory.model_validate({"hosts": {**two, "b": {**two["a"]}}})


def test_a_host_without_state_dir_gets_one_beside_its_root():
    """An operator's own inventory names no state_dir: run/ must still live outside the root, or a
    root that turned read-only leaves a rollback unable to start anything (issue 49). The default
    is computed from the root as expanded (ROOT.state), so every reader names the same path."""
    host = {"address": "10.0.0.1", "role": "native", "install_root": "${R}/pairctl"}
    inv = Inventory.model_validate({"hosts": {"n": host}}).resolved({"R": "/srv"})
    assert inv.hosts["n"].state_dir == "/srv/pairctl.state"
    inv = Inventory.model_validate({"hosts": {"n": {**host, "state_dir": "/var/lib/p"}}}).resolved({"R": "/srv"})
    assert inv.hosts["n"].state_dir == "/var/lib/p"
