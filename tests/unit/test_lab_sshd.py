"""Pure parts of the lab hosts: sshd config, known_hosts merging, process identity, host plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.errors import ConfigError, PairctlError
from orchestrator.lab.keys import KnownHost, merge_known_hosts
from orchestrator.lab.lab import host_plans
from orchestrator.lab.sshd import HostPlan, SshdHost, config_arg, is_lab_sshd, listening_inodes, render_sshd_config
from orchestrator.paths import Home
from orchestrator.remote.known_hosts import known_hosts_name

PLAN = HostPlan(name="lab-native", address="127.0.0.2", port=2222, user="root", dir=Path("/h/lab/hosts/lab-native"))


def test_sshd_config_is_key_only_and_bound_to_one_address():
    lines = set(render_sshd_config(PLAN).splitlines())
    for want in (
        "ListenAddress 127.0.0.2:2222",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "UseDNS no",
        "PermitUserEnvironment no",
        "StrictModes no",
        "Subsystem sftp internal-sftp",
        "AuthorizedKeysFile /h/lab/hosts/lab-native/authorized_keys",
        "PidFile /h/lab/hosts/lab-native/sshd.pid",
        "HostKey /h/lab/hosts/lab-native/ssh_host_ed25519_key",
    ):
        assert want in lines
    assert not any(line.startswith("AcceptEnv") for line in lines)


def test_known_hosts_name():
    assert known_hosts_name("127.0.0.2", 2222) == "[127.0.0.2]:2222"
    assert known_hosts_name("127.0.0.2", 22) == "127.0.0.2"


def test_merge_known_hosts_replaces_own_lines_and_keeps_others():
    old = "[127.0.0.2]:2222 ssh-ed25519 OLD\n[127.0.0.12]:2222 ssh-ed25519 LAB3\n# note\n"
    new = merge_known_hosts(old, [KnownHost("127.0.0.2", 2222, "ssh-ed25519 NEW")])
    assert new.splitlines() == ["[127.0.0.12]:2222 ssh-ed25519 LAB3", "# note", "[127.0.0.2]:2222 ssh-ed25519 NEW"]
    assert merge_known_hosts(new, [KnownHost("127.0.0.2", 2222, "ssh-ed25519 NEW")]) == new


def test_process_identity_needs_sshd_exe_and_our_config(tmp_path):
    proc = tmp_path / "proc"
    (proc / "10").mkdir(parents=True)
    (proc / "10" / "exe").symlink_to("/usr/sbin/sshd")
    (proc / "10" / "cmdline").write_bytes(
        b"sshd: /usr/sbin/sshd -f " + str(PLAN.config).encode() + b" [listener] 0 of 64\0"
    )
    (proc / "11").mkdir()
    (proc / "11" / "exe").symlink_to("/usr/bin/sleep")
    (proc / "11" / "cmdline").write_bytes(str(PLAN.config).encode() + b"\0")
    assert is_lab_sshd(10, PLAN.config, proc=proc)
    assert not is_lab_sshd(10, Path("/other/sshd_config"), proc=proc)
    assert not is_lab_sshd(11, PLAN.config, proc=proc)
    assert not is_lab_sshd(12, PLAN.config, proc=proc)


def test_non_loopback_addresses_are_refused():
    with pytest.raises(PairctlError, match="127.0.0.0/8"):
        SshdHost(HostPlan(name="x", address="10.0.0.2", port=2222, user="root", dir=Path("/x")))


def test_host_plans_follow_the_lab_inventories(tmp_path):
    home = Home.resolve(tmp_path)
    inv = load_inventory("lab3", {"PAIRCTL_HOME": str(home.root)})
    plans = host_plans(home, inv)
    assert [p.address for p in plans] == [f"127.0.0.{n}" for n in range(12, 18)]
    assert all(p.root == home.lab / "hosts" / p.name / "root" for p in plans)


def test_host_plans_refuse_an_install_root_outside_the_lab(tmp_path):
    inv_file = tmp_path / "inv.yaml"
    inv_file.write_text(
        "hosts:\n"
        "  n: {address: 127.0.0.9, port: 2222, install_root: /opt/elsewhere, role: native}\n"
        "  r: {address: 127.0.0.10, port: 2222, install_root: /opt/elsewhere2, role: rpc}\n"
    )
    with pytest.raises(ConfigError, match="install_root"):
        host_plans(Home.resolve(tmp_path), load_inventory(str(inv_file)))


TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0200007F:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0
   1: 0300007F:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4343 1 0
   2: 0200007F:08AE 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4444 1 0
"""


def test_listening_inodes_from_proc_net_tcp():
    assert listening_inodes("127.0.0.2", 2222, TCP) == {"4242"}  # the ESTABLISHED line is not a listener
    assert listening_inodes("127.0.0.3", 2222, TCP) == {"4343"}
    assert listening_inodes("127.0.0.4", 2222, TCP) == set()


def test_config_arg_from_a_listener_title():
    title = (
        b"sshd: /usr/sbin/sshd -f /h/lab/hosts/n/sshd_config -E /h/lab/hosts/n/sshd.log "
        b"[listener] 0 of 64-128 startups\0"
    )
    assert config_arg(title) == "/h/lab/hosts/n/sshd_config"
    assert config_arg(b"/usr/sbin/sshd\0-D\0") is None
