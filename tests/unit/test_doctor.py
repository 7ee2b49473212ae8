"""`pairctl doctor` names what is missing and how to fix it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


def _inventory(tmp_path: Path, known_hosts: str) -> Path:
    key = tmp_path / "op"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inv = {
        "known_hosts": known_hosts,
        "hosts": {
            "n": {
                "address": "127.0.0.2",
                "port": 2222,
                "user": "root",
                "key": str(key),
                "install_root": "/srv/p",
                "role": "native",
            },
            "r": {
                "address": "127.0.0.3",
                "port": 2222,
                "user": "root",
                "key": str(key),
                "install_root": "/srv/p",
                "role": "rpc",
            },
        },
        "pairs": {"p": {"native": "n", "rpc": "r"}},
    }
    p = tmp_path / "inv.yaml"
    p.write_text(yaml.safe_dump(inv))
    return p


def test_doctor_names_missing_known_hosts_entries(cli, tmp_path):
    pub = tmp_path / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(pub)], check=True)
    kh = tmp_path / "known_hosts"
    kh.write_text("[127.0.0.2]:2222 " + " ".join((tmp_path / "hostkey.pub").read_text().split()[:2]) + "\n")
    inv = _inventory(tmp_path, str(kh))
    r = cli("--json", "doctor", inventory=str(inv))
    assert r.exit_code == 1, r.output
    assert "known_host:r" in r.output and "[127.0.0.3]:2222" in r.output
    import json

    doc = json.loads(r.stdout)  # a failed run's list output comes under `result`, beside `error`
    assert doc["error"]["exit_code"] == 1
    rows = {f["check"]: f for f in doc["result"]}
    assert rows["known_host:n"]["ok"] is True
    assert rows["known_host:r"]["ok"] is False and "known_hosts" in rows["known_host:r"]["fix"]
    assert rows["key:n"]["ok"] is True


def test_doctor_flags_a_world_readable_key(cli, tmp_path):
    inv = _inventory(tmp_path, str(tmp_path / "none"))
    (tmp_path / "op").chmod(0o644)
    r = cli("--json", "doctor", inventory=str(inv))
    assert r.exit_code == 1 and "chmod 600" in r.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_doctor_says_cuda13_cannot_build_v100(cli):
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    if "release 13" not in out:
        pytest.skip("nvcc here is not CUDA 13")
    r = cli("doctor", "--no-inventory", "-t", "v100")
    assert r.exit_code == 1
    assert "CUDA 12.x" in r.output
