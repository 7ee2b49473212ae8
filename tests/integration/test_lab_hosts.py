"""The lab's hosts are real sshd processes: key login with strict host keys works, anything
else is refused, and `lab down` leaves nothing running."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import paramiko
import pytest

from orchestrator.lab.keys import ensure_ed25519
from orchestrator.lab.sshd import is_lab_sshd, pid_alive, port_answers, terminate
from tests.plugins.workers import link_session_models, spare_addresses

pytestmark = pytest.mark.integration


def _client(known_hosts: Path | None) -> paramiko.SSHClient:
    c = paramiko.SSHClient()
    if known_hosts is not None:
        c.load_host_keys(str(known_hosts))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    return c


def _connect(c: paramiko.SSHClient, host, key: Path) -> None:
    c.connect(
        host.address,
        port=host.port,
        username=host.user,
        key_filename=str(key),
        allow_agent=False,
        look_for_keys=False,
        timeout=10,
        banner_timeout=10,
        auth_timeout=10,
    )


def _run(c: paramiko.SSHClient, cmd: str) -> tuple[int, str]:
    _, out, _ = c.exec_command(cmd, timeout=10)
    text = out.read().decode()
    return out.channel.recv_exit_status(), text


def test_lab_hosts_accept_operator_key_with_strict_host_keys(lab):
    assert len(lab.inventory.hosts) == 2
    for name, host in lab.inventory.hosts.items():
        c = _client(lab.known_hosts)
        try:
            _connect(c, host, lab.operator_key)
            code, out = _run(c, "id -u")
        finally:
            c.close()
        assert (code, out.strip()) == (0, "0"), name


def test_each_host_has_its_own_host_key_and_install_root(lab):
    keys = set()
    for name, host in lab.inventory.hosts.items():
        c = _client(lab.known_hosts)
        try:
            _connect(c, host, lab.operator_key)
            keys.add(c.get_transport().get_remote_server_key().get_base64())
            code, out = _run(c, "stat -c %a " + host.install_root)
        finally:
            c.close()
        assert (code, out.strip()) == (0, "755"), name
    assert len(keys) == 2


def test_unknown_host_key_is_refused(lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = lab.inventory.hosts["lab-native"]
    c = _client(empty)
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _connect(c, host, lab.operator_key)
    c.close()


def test_wrong_host_key_is_refused(lab, tmp_path):
    """known_hosts names lab-native with lab-rpc's key: a changed key must stop the login."""
    native = lab.inventory.hosts["lab-native"]
    rpc_key = lab.home.lab.joinpath("hosts", "lab-rpc", "ssh_host_ed25519_key.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{native.address}]:{native.port} {rpc_key[0]} {rpc_key[1]}\n")
    c = _client(kh)
    with pytest.raises(paramiko.BadHostKeyException):
        _connect(c, native, lab.operator_key)
    c.close()


def test_unauthorized_user_key_is_refused(lab, tmp_path):
    other = tmp_path / "other_key"
    ensure_ed25519(other, "not-the-operator")
    c = _client(lab.known_hosts)
    with pytest.raises(paramiko.AuthenticationException):
        _connect(c, lab.inventory.hosts["lab-rpc"], other)
    c.close()


def test_sftp_put_get_in_install_root(lab, tmp_path):
    """fabric's put/get ride on SFTP: the lab's internal-sftp subsystem must serve it."""
    host = lab.inventory.hosts["lab-rpc"]
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(4096))
    remote = f"{host.install_root}/.sftp-probe-{os.getpid()}"
    c = _client(lab.known_hosts)
    try:
        _connect(c, host, lab.operator_key)
        sftp = c.open_sftp()
        sftp.put(str(src), remote)
        sftp.get(remote, str(tmp_path / "back.bin"))
        sftp.remove(remote)
        sftp.close()
    finally:
        c.close()
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_lab_status_reports_running_hosts(lab, cli):
    r = cli("lab", "status", "--json", inventory=str(lab.inventory_path))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert {h["host"]: (h["running"], h["answering"]) for h in data["hosts"]} == {
        "lab-native": (True, True),
        "lab-rpc": (True, True),
    }
    assert data["models_ok"] is True


# --- a throwaway lab on other addresses: up is idempotent, down leaves nothing running ---------

TW = spare_addresses()  # 127.0.0.40 and .41, or an xdist worker's own two
THROWAWAY = f"""\
known_hosts: ${{PAIRCTL_HOME}}/lab/known_hosts
hosts:
  tw-native: {{address: {TW[0]}, port: 2222, user: root, key: "${{PAIRCTL_HOME}}/lab/keys/operator",
              install_root: "${{PAIRCTL_HOME}}/lab/hosts/tw-native/root", role: native}}
  tw-rpc: {{address: {TW[1]}, port: 2222, user: root, key: "${{PAIRCTL_HOME}}/lab/keys/operator",
           install_root: "${{PAIRCTL_HOME}}/lab/hosts/tw-rpc/root", role: rpc}}
pairs:
  tw: {{native: tw-native, rpc: tw-rpc}}
"""


@pytest.fixture
def throwaway(tmp_path, cli, pairctl_home):
    home = tmp_path / "home"
    inv = tmp_path / "throwaway.yaml"
    inv.write_text(THROWAWAY)
    link_session_models(home, pairctl_home)  # these tests are about sshd, not about making models
    yield home, inv
    cli("lab", "down", home=home)  # never leave the throwaway running, even on failure


def _fake_service(root: Path, name: str, pid_name: str) -> subprocess.Popen:
    """A long sleep whose argv[0] ends in /<name>, recorded in root/run/<pid_name>.pid."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "run").mkdir(parents=True, exist_ok=True)
    exe = root / "bin" / name
    if not exe.exists():
        exe.symlink_to("/bin/sleep")
    p = subprocess.Popen([str(exe), "300"], start_new_session=True)
    (root / "run" / f"{pid_name}.pid").write_text(f"{p.pid}\n")
    return p


def test_lab_up_idempotent_and_down_leaves_nothing_running(throwaway, cli):
    home, inv = throwaway
    r = cli("lab", "up", "--no-source", "--json", "--inventory", str(inv), home=home)
    assert r.exit_code == 0, r.output
    first = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert all(h["started"] and h["answering"] for h in first.values())
    pids = {n: h["pid"] for n, h in first.items()}

    again = cli("lab", "up", "--no-source", "--json", "--inventory", str(inv), home=home)
    assert again.exit_code == 0, again.output
    second = {h["host"]: h for h in json.loads(again.stdout)["hosts"]}
    assert {n: h["pid"] for n, h in second.items()} == pids
    assert not any(h["started"] for h in second.values())

    roots = {n: home / "lab" / "hosts" / n / "root" for n in pids}
    server = _fake_service(roots["tw-native"], "llama-server", "llama-server")
    rpc = _fake_service(roots["tw-rpc"], "ggml-rpc-server", "ggml-rpc-server")
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # pid file, but not a server
    (roots["tw-rpc"] / "run" / "bystander.pid").write_text(f"{bystander.pid}\n")
    try:
        d = cli("lab", "down", "--json", home=home)
        assert d.exit_code == 0, d.output
        for p in (server, rpc):
            p.wait(timeout=10)  # reaps it; raises if lab down did not stop it
        for n, pid in pids.items():
            assert not pid_alive(pid), f"sshd {n} pid {pid} still running"
        assert not port_answers(TW[0], 2222) and not port_answers(TW[1], 2222)
        assert bystander.poll() is None, "lab down killed a process it did not start"
        stopped = json.loads(d.stdout)["stopped"]
        assert sorted(p for s in stopped for p in s["pids"]) == sorted([*pids.values(), server.pid, rpc.pid])
    finally:
        bystander.kill()
        bystander.wait()

    st = cli("lab", "status", "--json", "--inventory", str(inv), home=home)
    assert [h["running"] for h in json.loads(st.stdout)["hosts"]] == [False, False]


def test_lab_up_replaces_a_stale_pid_file(throwaway, cli):
    """A pid file naming a live process that is not this host's sshd must not count as running."""
    home, inv = throwaway
    assert cli("lab", "up", "--no-source", "--inventory", str(inv), home=home).exit_code == 0
    assert cli("lab", "down", home=home).exit_code == 0
    pid_file = home / "lab" / "hosts" / "tw-native" / "sshd.pid"
    decoy = subprocess.Popen(["sleep", "300"], start_new_session=True)
    pid_file.write_text(f"{decoy.pid}\n")
    try:
        r = cli("lab", "up", "--no-source", "--json", "--inventory", str(inv), home=home)
        assert r.exit_code == 0, r.output
        h = {x["host"]: x for x in json.loads(r.stdout)["hosts"]}["tw-native"]
        assert h["started"] and h["answering"] and h["pid"] != decoy.pid
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


def test_lab_up_refuses_a_port_taken_by_another_lab(throwaway, cli, tmp_path, pairctl_home):
    home, inv = throwaway
    assert cli("lab", "up", "--no-source", "--inventory", str(inv), home=home).exit_code == 0
    other = tmp_path / "other-home"
    link_session_models(other, pairctl_home)
    r = cli("lab", "up", "--no-source", "--inventory", str(inv), home=other)
    assert r.exit_code == 4, r.output  # ExitCode.HOST
    assert "already in use" in r.stderr
    cli("lab", "down", home=other)


def test_lab_up_stops_an_orphaned_lab_sshd_whose_home_was_deleted(throwaway, cli, pairctl_home):
    """`rm -rf` of a home while its lab runs leaves an sshd nobody can find by pid file; the next
    `lab up` on that address recognises it (its config file is gone) and replaces it."""
    import shutil

    home, inv = throwaway
    r = cli("lab", "up", "--no-source", "--json", "--inventory", str(inv), home=home)
    assert r.exit_code == 0, r.output
    old = {h["host"]: h["pid"] for h in json.loads(r.stdout)["hosts"]}
    configs = {n: str(home / "lab" / "hosts" / n / "sshd_config") for n in old}
    shutil.rmtree(home)
    link_session_models(home, pairctl_home)
    try:
        r = cli("lab", "up", "--no-source", "--json", "--inventory", str(inv), home=home)
        assert r.exit_code == 0, r.output
        new = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
        for name, pid in old.items():
            assert not pid_alive(pid), f"orphan {name} pid {pid} still running"
            assert new[name]["started"] and new[name]["answering"] and new[name]["pid"] != pid
    finally:  # never leak the orphans this test made, even when it fails
        terminate([pid for n, pid in old.items() if pid_alive(pid) and is_lab_sshd(pid, Path(configs[n]))])


def test_lab3_hosts_accept_logins_and_share_known_hosts_with_lab(lab, lab3):
    """Six more hosts; bringing them up keeps the two-host lab's known_hosts entries valid."""
    assert len(lab3.inventory.hosts) == 6
    assert lab3.known_hosts == lab.known_hosts
    for name, host in [*lab3.inventory.hosts.items(), *lab.inventory.hosts.items()]:
        c = _client(lab3.known_hosts)
        try:
            _connect(c, host, lab3.operator_key)
            code, out = _run(c, "echo $((6*7))")
        finally:
            c.close()
        assert (code, out.strip()) == (0, "42"), name
