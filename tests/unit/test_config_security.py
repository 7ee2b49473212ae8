"""Issue 16, config side: hostile profiles and inventories are refused by the validators
`config check` and preflight use (items 1, 4, 5, 12). Pure logic, no hosts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from orchestrator.config.flags import (
    check_extra_args,
    inet_addr,
    parse_args,
    parse_help,
    rpc_bind_problem,
    server_bind_problem,
)
from orchestrator.config.inventory import Inventory, PairSpec, read_api_key
from orchestrator.config.loader import load_model
from orchestrator.config.profiles import RouteProfile, load_profile
from orchestrator.errors import ConfigError, ExitCode

ROOT = Path(__file__).parents[2]
LAB_PROFILE = yaml.safe_load((ROOT / "manifests/profiles/lab.yaml").read_text())
LAB_INV = yaml.safe_load((ROOT / "manifests/inventories/lab.yaml").read_text())

# The shape of llama-server --help (common_arg::to_string): aliases ", ", value hints, padding.
HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
-c,    --ctx-size N                     size of the prompt context (default: 4096, 0 = loaded from model)
--cors-origins ORIGINS                  comma-separated list of allowed origins for CORS (default: *)
--cors-methods METHODS                  comma-separated list of allowed methods for CORS
--path PATH                             path to serve static files from (default: )
--tools TOOL1,TOOL2,...                 experimental: whether to enable built-in tools for AI agents - do not
                                        enable in untrusted environments (default: no tools)
-ag,   --agent, -no-ag, --no-agent      whether to enable CORS proxy and all built-in tools - do not enable
                                        in untrusted environments (default: disabled)
--control-vector-layer-range START END
                                        layer range to apply the control vector(s) to, start and end inclusive
--new-exec-thing CMD                    experimental: run CMD - do not enable in untrusted environments
--no-slots                              disables slots monitoring endpoint
--host HOST                             IP addresses to listen on, comma-separated
"""


def write(tmp_path: Path, name: str, data) -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


# -- item 1: flag policy -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--tools", "exec_shell_command"],
        ["--tools=all"],
        ["--tools", "all", "--no-slots"],
        ["--agent"],
        ["-ag"],
        ["--path", "/"],
        ["--path=/"],
        ["--mcp_servers_config", "/tmp/m.json"],
        ["--mcp-servers-json", "{}"],
        ["--webui-mcp-proxy"],
        ["--ui_mcp_proxy"],
        ["--media-path", "/"],
        ["--slot-save-path", "/tmp"],
        ["--models-preset", "/x.ini"],
        ["--models-dir", "/"],
        ["-hf", "a/b"],
        ["--tools-runtime", "ssh:root@x"],
        ["--props"],
        ["--ui-config-file", "/etc/shadow"],
        ["--log-prompts-dir", "/tmp"],
        # other spellings an attacker would try
        ["--agent=1"],
        ["--media_path", "/"],
        ["--models_preset", "/x"],
        ["-hfr", "a/b"],
        ["--hf_repo_draft", "x"],
        ["--mcp-servers-json={}"],
        ["--reuse_port"],
        ["--tools-runtime=ssh:x"],
        ["--ui_config_file", "/etc/shadow"],
    ],
)
def test_risky_flags_refused_in_every_spelling(args):
    problems = check_extra_args(args)
    assert problems and "refused" in problems[0], (args, problems)


def test_risky_flag_found_through_help_aliases_and_untrusted_warning():
    # with the package's --help: -ag is an alias of --agent; a new option whose help warns about
    # untrusted environments is refused although no table names it
    assert check_extra_args(["-ag"], help_text=HELP)
    assert "refused" in check_extra_args(["--new-exec-thing", "id"], help_text=HELP)[0]
    assert check_extra_args(["--no-agent", "-no-ag"], help_text=HELP) == []
    # a value is consumed as the binary does: --cors-methods takes one, so "--tools" here is its value
    assert check_extra_args(["--cors-methods", "--tools"], help_text=HELP) == []
    # an option the help does not list is named
    assert "not an option" in check_extra_args(["--draft-max", "3"], help_text=HELP)[0]


def test_managed_flags_refused_in_every_spelling():
    for args in (["--host=0.0.0.0"], ["--host", "0"], ["-m", "x"], ["--api_key", "k"], ["--api-key=k"], ["--rpc=a:1"]):
        assert "may not set" in check_extra_args(args)[0], args


def test_parse_help_value_counts():
    spec = parse_help(HELP)
    assert spec.get("-c").n_values == 1 and spec.get("--agent").n_values == 0
    assert spec.get("--control-vector-layer-range").n_values == 2
    assert set(spec.get("-ag").names) == {"-ag", "--agent", "-no-ag", "--no-agent"}
    parsed, problems = parse_args(["--control-vector-layer-range", "1", "2", "-c", "5"], spec)
    assert [(p.flag, p.values) for p in parsed] == [("--control-vector-layer-range", ("1", "2")), ("-c", ("5",))]
    assert problems == []


def test_allowed_risky_flag_needs_reason_and_api_key(tmp_path):
    assert check_extra_args(["--tools", "all"], allowed={"tools": "sandbox host"}, api_key=True) == []
    assert "no api_key_file" in check_extra_args(["--tools", "all"], allowed={"--tools": "r"}, api_key=False)[0]
    with pytest.raises(ValueError, match="needs a reason"):
        PairSpec.model_validate({"native": "a", "rpc": "b", "allow_flags": {"--tools": " "}, "api_key_file": "/k"})
    with pytest.raises(ValueError, match="needs api_key_file"):
        PairSpec.model_validate({"native": "a", "rpc": "b", "allow_flags": {"--tools": "why"}})
    with pytest.raises(ValueError, match="not a flag pairctl refuses"):
        PairSpec.model_validate({"native": "a", "rpc": "b", "allow_flags": {"--ctx-size": "why"}, "api_key_file": "/k"})


def test_profile_with_tools_refused_unless_pair_allows(tmp_path):
    p = write(tmp_path, "tools.yaml", {**LAB_PROFILE, "name": "tools", "extra_args": ["--tools", "exec_shell_command"]})
    with pytest.raises(ConfigError, match="--tools is refused") as ei:
        load_model(RouteProfile, p)
    assert ei.value.exit_code == ExitCode.CONFIG
    allowed = PairSpec.model_validate(
        {"native": "a", "rpc": "b", "api_key_file": "/k", "allow_flags": {"--tools": "isolated test host"}}
    )
    assert load_profile(str(p), pair=allowed).extra_args == ["--tools", "exec_shell_command"]
    other = PairSpec.model_validate({"native": "a", "rpc": "b"})
    with pytest.raises(ConfigError, match="--tools is refused"):
        load_profile(str(p), pair=other)


# -- item 4: addresses judged as the binaries resolve them -----------------------------------


@pytest.mark.parametrize(
    "spelling",
    ["0", "0x0", "0.0.0.00", "00", "0.0", "0x0.0", "000.000.000.000", "0 trailing", "0x00000000", "0\t", "00.0x0.0.0"],
)
def test_rpc_bind_every_spelling_of_any_refused(spelling):
    assert inet_addr(spelling) is not None and inet_addr(spelling).is_unspecified
    assert "every address" in rpc_bind_problem(spelling)


@pytest.mark.parametrize(
    "spelling",
    ["::0", "::", "[::]", "*", "", " 127.0.0.3", "lab-rpc", "256.0.0.1", "1.2.3.4.", "255.255.255.255", "224.0.0.1"],
)
def test_rpc_bind_not_one_unicast_ipv4_refused(spelling):
    assert rpc_bind_problem(spelling) is not None


def test_rpc_bind_inet_addr_forms():
    assert str(inet_addr("0177.0.0.03")) == "127.0.0.3"
    assert str(inet_addr("127.3")) == "127.0.0.3"
    assert str(inet_addr("0x7f000003")) == "127.0.0.3"
    assert str(inet_addr("2130706435")) == "127.0.0.3"
    assert inet_addr("08.0.0.1") is None  # not octal
    assert rpc_bind_problem("127.0.0.3") is None


@pytest.mark.parametrize(
    "spelling",
    [
        "0.0.0.0",
        "0",
        "0x0",
        "::",
        "::0",
        "[::]",
        "0:0::0",
        "127.0.0.1,0.0.0.0",
        "10.1.2.3",
        "example.org",
        "::ffff:0.0.0.0",
        "0000::",
        "::0.0.0.0",
        "127.0.0.1 , 0.0.0.0",
        "[::ffff:0.0.0.0]",
        "LOCALHOST",
    ],
)
def test_server_bind_open_needs_api_key(spelling):
    assert server_bind_problem(spelling, api_key=False) is not None
    assert server_bind_problem(spelling, api_key=True) is None


def test_server_bind_loopback_without_key():
    for s in ("127.0.0.2", "::1", "127.1", "0177.0.0.1", "/run/x.sock"):
        assert server_bind_problem(s, api_key=False) is None, s
    assert server_bind_problem("localhost", api_key=False)  # resolved by the host's /etc/hosts


def test_inventory_binds_refused(tmp_path):
    for key, value, match in (
        ("rpc_bind", "0", "every address"),
        ("rpc_bind", "0x0", "every address"),
        ("rpc_bind", "::0", "not an IPv4"),
        ("server_bind", "0.0.0.0", "no API key"),
        ("server_bind", "0", "no API key"),
    ):
        inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
        inv["pairs"]["lab"][key] = value
        with pytest.raises(ConfigError, match=match):
            load_model(Inventory, write(tmp_path, "inv.yaml", inv))
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["hosts"]["lab-rpc"]["address"] = "0"
    with pytest.raises(ConfigError, match="rpc host's address"):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))


# -- item 5: API key --------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["kéy\n".encode(), b"key\x00x\n", "\u200bkey\n".encode(), b"k\x1bey", b"\xff\xfe"])
def test_api_key_not_printable_ascii_refused(tmp_path, content):
    f = tmp_path / "key"
    f.write_bytes(content)
    os.chmod(f, 0o600)
    with pytest.raises(ConfigError, match="not printable ASCII") as ei:
        read_api_key("lab", PairSpec.model_validate({"native": "a", "rpc": "b", "api_key_file": str(f)}))
    assert ei.value.exit_code == ExitCode.CONFIG == 3
    assert "key" not in str(ei.value).split("api_key_file")[0]  # the key itself is never in the message


def test_api_key_readable_by_others_warns(tmp_path, capsys):
    from orchestrator.config.inventory import warn_if_readable_by_others

    f = tmp_path / "key"
    f.write_text("secret-key\n")
    os.chmod(f, 0o644)
    assert "mode 0644" in warn_if_readable_by_others(f, what="key")
    os.chmod(f, 0o600)
    assert warn_if_readable_by_others(f, what="key") is None


# -- item 12: bad input with clear messages -------------------------------------------------


@pytest.mark.parametrize(
    "root", ["/.", "/var/..", "//", "/srv/pairctl/", "/srv//x", "/srv/./x", "/a/b/..", "${PAIRCTL_HOME}/../x"]
)
def test_install_root_not_canonical_refused(tmp_path, root):
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["hosts"]["lab-native"]["install_root"] = root
    with pytest.raises(ConfigError, match="install_root"):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))


@pytest.mark.parametrize("name", ["lab;$(id)", "lab x", "-lab", "../lab", "lab\n", "läb", ""])
def test_pair_and_host_names_restricted(tmp_path, name):
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["pairs"][name] = inv["pairs"].pop("lab")
    with pytest.raises(ConfigError, match="pair name"):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["hosts"][name] = inv["hosts"].pop("lab-rpc")
    inv["pairs"]["lab"]["rpc"] = name
    with pytest.raises(ConfigError):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))


@pytest.mark.parametrize("where,key", [("host", "port"), ("pair", "server_port"), ("pair", "rpc_port")])
def test_bool_is_not_a_port(tmp_path, where, key):
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    (inv["hosts"]["lab-native"] if where == "host" else inv["pairs"]["lab"])[key] = True
    with pytest.raises(ConfigError, match="found the boolean true"):
        load_model(Inventory, write(tmp_path, "inv.yaml", inv))


def test_bool_is_not_a_profile_number(tmp_path):
    with pytest.raises(ConfigError, match="boolean"):
        load_model(RouteProfile, write(tmp_path, "p.yaml", {**LAB_PROFILE, "parallel": True}))
    load_model(RouteProfile, write(tmp_path, "p.yaml", {**LAB_PROFILE, "metrics": False}))  # a real bool stays fine


def test_duplicate_yaml_key_refused(tmp_path):
    text = (
        (ROOT / "manifests/inventories/lab.yaml")
        .read_text()
        .replace("pairs:\n  lab:\n", "pairs:\n  lab:\n    server_bind: 127.0.0.2\n    server_bind: 0.0.0.0\n", 1)
    )
    assert text.count("server_bind") == 2
    with pytest.raises(ConfigError, match="duplicate key 'server_bind'"):
        load_model(Inventory, write(tmp_path, "inv.yaml", text))


def test_deeply_nested_yaml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_model(Inventory, write(tmp_path, "inv.yaml", "[" * 100_000))


def test_yaml_path_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_model(Inventory, tmp_path)


def test_rendered_pair_argv_policy():
    from orchestrator.config.flags import check_rpc_args, server_policy_problems

    assert check_rpc_args(["-H", "127.0.0.3", "-p", "50052"]) == []
    assert any("every address" in p for p in check_rpc_args(["-H", "127.0.0.3", "-H", "0x0", "-p", "1"]))  # last wins
    assert any("-c is refused" in p for p in check_rpc_args(["-H", "127.0.0.3", "-c"]))
    assert any("not one of its options" in p for p in check_rpc_args(["-H", "127.0.0.3", "--host=0"]))
    pol = server_policy_problems(
        {}, [], ["--model", "m", "--host", "0", "--port", "1"], ["-H", "127.0.0.3"], help_text=None, api_key=False
    )
    assert any("no API key" in p for p in pol.problems)
    pol = server_policy_problems(
        {"tools": "isolated host"},
        ["--tools", "read_file"],
        ["--host", "127.0.0.2"],
        ["-H", "127.0.0.3"],
        help_text=HELP,
        api_key=True,
    )
    assert pol.problems == [] and pol.allowed == {"--tools": "isolated host"}


def test_config_check_inventory_judges_each_pairs_profile(tmp_path):
    from orchestrator.cli.config_registry import check_file

    prof = write(tmp_path, "tools.yaml", {**LAB_PROFILE, "name": "tools", "extra_args": ["--agent"]})
    inv = yaml.safe_load(yaml.safe_dump(LAB_INV))
    inv["pairs"]["lab"]["profile"] = str(prof)
    res = check_file(write(tmp_path, "inv.yaml", inv), kind="inventory")
    assert any("--agent is refused" in p for p in res.problems)
    key = tmp_path / "key"
    key.write_text("k3y\n")
    key.chmod(0o600)  # as an operator keeps it (config check names a 0644 key file)
    inv["pairs"]["lab"].update(api_key_file=str(key), allow_flags={"--agent": "agent test bench"})
    res = check_file(write(tmp_path, "inv.yaml", inv), kind="inventory")
    assert res.problems == (), res


def test_a_manifest_larger_than_any_is_refused_before_it_is_parsed(tmp_path):
    """Issue 49 item 7: every local file is bounded in size; a 17 MB 'inventory' is exit 3 naming it."""
    from orchestrator.config.loader import MAX_CONFIG_BYTES, read_yaml
    from orchestrator.errors import ConfigError

    big = tmp_path / "inventory.yaml"
    big.write_bytes(b"# " + b"x" * MAX_CONFIG_BYTES + b"\n")
    with pytest.raises(ConfigError, match=f"{big}: more than {MAX_CONFIG_BYTES} bytes") as ei:
        read_yaml(big)
    assert ei.value.exit_code == 3 and "\n" not in ei.value.message
