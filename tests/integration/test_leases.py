"""Leases on the lab's REAL sshd hosts, through the library and through `pairctl lease`.

Each test uses private install roots under tmp_path on the same sshd hosts (a copy of the
inventory), so these tests never collide with a deploy holding the lab pair's real leases.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import Inventory
from orchestrator.errors import LeaseError, LeaseHeldError
from orchestrator.hosts import leases as L
from orchestrator.remote.pool import TransportPool, open_transport

pytestmark = pytest.mark.integration


def private_inventory(lab, tmp_path: Path) -> Inventory:
    hosts = {}
    for name, spec in lab.inventory.hosts.items():
        root = tmp_path / "roots" / name
        root.mkdir(parents=True)
        hosts[name] = spec.model_copy(update={"install_root": str(root)})
    return lab.inventory.model_copy(update={"hosts": hosts})


def write_inventory(inv: Inventory, path: Path) -> Path:
    path.write_text(yaml.safe_dump(inv.model_dump(mode="json")))
    return path


@pytest.fixture
def inv(lab, tmp_path) -> Inventory:
    return private_inventory(lab, tmp_path)


def test_second_taker_refused_with_holder_info(inv) -> None:
    root = inv.host("lab-native").install_root
    # two separate SSH connections: two operators
    with TransportPool(inv) as a, TransportPool(inv) as b:
        ta, tb = a.get("lab-native"), b.get("lab-native")
        lease = L.take_lease(ta, root, "alice@ops", "deploy B", 3600)
        with pytest.raises(LeaseHeldError) as ei:
            L.take_lease(tb, root, "bob@ops", "qualify", 600)
        msg = str(ei.value)
        assert "alice@ops" in msg and "deploy B" in msg and re.search(r"until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", msg)
        assert ei.value.exit_code == 5
        assert L.read_lease(tb, root).nonce == lease.nonce  # the holder's lease is untouched
        # what is on the host: lock dir 0755, lease.json 0644, canonical JSON
        st_dir = os.stat(f"{root}/leases/host.lock")
        st_file = os.stat(f"{root}/leases/host.lock/lease.json")
        assert (st_dir.st_mode & 0o777, st_file.st_mode & 0o777) == (0o755, 0o644)
        assert json.loads(Path(f"{root}/leases/host.lock/lease.json").read_text())["owner"] == "alice@ops"


def test_wrong_nonce_refused_then_release_verified(inv) -> None:
    root = inv.host("lab-rpc").install_root
    t = open_transport(inv, "lab-rpc")
    try:
        lease = L.take_lease(t, root, "op", "deploy", 600)
        with pytest.raises(LeaseError, match="wrong nonce"):
            L.release_lease(t, root, "0" * 32)
        assert L.lease_state(t, root).state == "held"
        L.release_lease(t, root, lease.nonce)
        assert L.lease_state(t, root).state == "free"
        assert not Path(f"{root}/leases/host.lock").exists()
        with pytest.raises(LeaseError, match="no lease is held"):
            L.release_lease(t, root, lease.nonce)
    finally:
        t.close()


def test_break_expired_over_ssh(inv) -> None:
    root = inv.host("lab-native").install_root
    t = open_transport(inv, "lab-native")
    try:
        L.take_lease(t, root, "gone@ops", "crashed deploy", 1)
        time.sleep(1.2)
        with pytest.raises(LeaseHeldError, match="EXPIRED"):
            L.take_lease(t, root, "op", "deploy", 600)
        lease = L.take_lease(t, root, "op", "deploy", 600, break_expired=True)
        assert lease.broken["lease"]["owner"] == "gone@ops" and lease.broken["state"] == "expired"
        assert sorted(os.listdir(f"{root}/leases")) == ["host.lock"]  # the broken one is gone
        L.release_lease(t, root, lease.nonce)
    finally:
        t.close()


def test_half_made_lease_over_ssh(inv) -> None:
    root = inv.host("lab-native").install_root
    os.makedirs(f"{root}/leases/host.lock")
    t = open_transport(inv, "lab-native")
    try:
        with pytest.raises(LeaseHeldError, match="holder unknown"):
            L.take_lease(t, root, "op", "deploy", 600, break_expired=True)
        old = time.time() - 3600
        os.utime(f"{root}/leases/host.lock", (old, old))
        lease = L.take_lease(t, root, "op", "deploy", 600, break_expired=True)
        assert lease.broken["state"] == "half-made"
    finally:
        t.close()


def test_hold_pair_leases_over_ssh(inv) -> None:
    with TransportPool(inv) as pool:
        targets = [(pool.get(h), inv.host(h).install_root) for h in ("lab-rpc", "lab-native")]
        with pytest.raises(RuntimeError):
            with L.hold_pair_leases(targets, owner="op", purpose="deploy", ttl_s=600) as held:
                assert [l.host for l in held.leases] == ["lab-native", "lab-rpc"]
                for tr, root in targets:
                    assert L.lease_state(tr, root).state == "held"
                raise RuntimeError("deploy failed")
        for tr, root in targets:
            assert L.lease_state(tr, root).state == "free"


def test_cli_take_show_release_pair(lab, inv, tmp_path, cli) -> None:
    path = write_inventory(inv, tmp_path / "inv.yaml")
    r = cli("lease", "take", "lab", "--purpose", "cli test", "--ttl", "10m", "--owner", "tester@ops", inventory=str(path))
    assert r.exit_code == 0, r.output
    nonce = re.search(r"nonce: ([0-9a-f]{32})", r.stdout).group(1)

    r2 = cli("lease", "take", "lab-rpc", "--purpose", "other", inventory=str(path))
    assert r2.exit_code == 5 and "tester@ops" in r2.stderr and "cli test" in r2.stderr

    r3 = cli("--json", "lease", "show", "lab", inventory=str(path))
    assert r3.exit_code == 0, r3.output
    shown = json.loads(r3.stdout)
    assert [s["host"] for s in shown] == ["lab-native", "lab-rpc"]
    assert all(s["state"] == "held" and s["lease"]["owner"] == "tester@ops" for s in shown)
    assert nonce not in r3.stdout  # show never reveals the nonce

    r4 = cli("lease", "release", "lab", "--nonce", "f" * 32, inventory=str(path))
    assert r4.exit_code == 1 and "wrong nonce" in r4.stderr

    r5 = cli("--json", "lease", "release", "lab", "--nonce", nonce, inventory=str(path))
    assert r5.exit_code == 0, r5.output
    out = json.loads(r5.stdout)
    assert [s["state"] for s in out["after"]] == ["free", "free"]
    # the receipt records the release and never the nonce
    receipts = list((lab.home.evidence).rglob("*"))
    assert not any(nonce in p.read_text(errors="ignore") for p in receipts if p.is_file() and p.stat().st_size < 1_000_000)


def test_cli_pair_take_gives_back_first_if_second_held(lab, inv, tmp_path, cli) -> None:
    path = write_inventory(inv, tmp_path / "inv.yaml")
    t = open_transport(inv, "lab-rpc")
    try:
        L.take_lease(t, inv.host("lab-rpc").install_root, "holder@ops", "busy", 600)
        r = cli("lease", "take", "lab", "--purpose", "x", inventory=str(path))
        assert r.exit_code == 5 and "holder@ops" in r.stderr
        assert L.lease_state(open_transport(inv, "lab-native"), inv.host("lab-native").install_root).state == "free"
    finally:
        t.close()


def test_cli_break_expired_is_recorded(lab, inv, tmp_path, cli) -> None:
    path = write_inventory(inv, tmp_path / "inv.yaml")
    t = open_transport(inv, "lab-native")
    try:
        L.take_lease(t, inv.host("lab-native").install_root, "gone@ops", "crashed", 1)
    finally:
        t.close()
    time.sleep(1.2)
    r = cli("lease", "take", "lab-native", "--purpose", "x", inventory=str(path))
    assert r.exit_code == 5 and "--break-expired" in r.stderr
    r = cli("--json", "lease", "take", "lab-native", "--purpose", "x", "--break-expired", inventory=str(path))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    broken = out["leases"][0]["broken"]
    assert broken["lease"]["owner"] == "gone@ops"
    from orchestrator.evidence.store import EvidenceStore

    rec = EvidenceStore(lab.home.evidence).load(out["receipt"])
    text = json.dumps(rec.model_dump(mode="json") if hasattr(rec, "model_dump") else rec.__dict__, default=str)
    assert "gone@ops" in text and "broken" in text
    assert out["nonce"] not in text
