"""Leases on the lab's REAL sshd hosts, through the library and through `pairctl lease`.

Each test uses private install roots under tmp_path on the same sshd hosts (a copy of the
inventory), so these tests never collide with a deploy holding the lab pair's real leases.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import Inventory
from orchestrator.errors import LeaseError, LeaseHeldError
from orchestrator.hosts import leases as L
from orchestrator.remote.local import LocalTransport
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
        # what is on the host: lock dir 0700, lease.json 0600 (the nonce releases it), canonical JSON
        st_dir = os.stat(f"{root}/leases/host.lock")
        st_file = os.stat(f"{root}/leases/host.lock/lease.json")
        assert (st_dir.st_mode & 0o777, st_file.st_mode & 0o777) == (0o700, 0o600)
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


def an_hour_ago(transport, leases_dir: str) -> datetime:
    """The host's clock an hour back: a lease taken with it has long expired by the host's now."""
    return L.host_now(transport, leases_dir) - timedelta(hours=1)


def test_break_expired_over_ssh(inv, monkeypatch) -> None:
    root = inv.host("lab-native").install_root
    t = open_transport(inv, "lab-native")
    try:
        L.take_lease(t, root, "gone@ops", "crashed deploy", 60, clock=an_hour_ago)
        # the operator's clock an hour behind sees it as live; the host's clock decides
        monkeypatch.setattr(L, "utcnow", lambda: datetime.now(UTC) - timedelta(hours=1))
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
                assert [lease.host for lease in held.leases] == ["lab-native", "lab-rpc"]
                for tr, root in targets:
                    assert L.lease_state(tr, root).state == "held"
                raise RuntimeError("deploy failed")
        for tr, root in targets:
            assert L.lease_state(tr, root).state == "free"


def test_cli_take_show_release_pair(lab, inv, tmp_path, cli) -> None:
    path = write_inventory(inv, tmp_path / "inv.yaml")
    r = cli(
        "lease", "take", "lab", "--purpose", "cli test", "--ttl", "10m", "--owner", "tester@ops", inventory=str(path)
    )
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
    assert not any(
        nonce in p.read_text(errors="ignore") for p in receipts if p.is_file() and p.stat().st_size < 1_000_000
    )


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
        L.take_lease(t, inv.host("lab-native").install_root, "gone@ops", "crashed", 60, clock=an_hour_ago)
    finally:
        t.close()
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


def _known_hosts_with_rpc_key_changed(lab, tmp_path: Path) -> Path:
    """known_hosts where lab-rpc's entry carries lab-native's key: the RPC host's key "changed"."""
    lines = Path(lab.inventory.known_hosts).read_text().splitlines()
    native, rpc = (f"[{lab.inventory.host(h).address}]" for h in ("lab-native", "lab-rpc"))
    line = next(ln for ln in lines if ln.startswith(native))
    changed = [(f"{rpc}:2222 " + line.split(" ", 1)[1]) if ln.startswith(rpc) else ln for ln in lines]
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(changed) + "\n")
    return path


def test_cli_lease_take_and_release_check_every_host_key_first(lab, inv, tmp_path, cli) -> None:
    """Issue 16 item 9: with the RPC host's key changed, `lease take lab` took (and gave back) the
    native lease and `lease release lab` released it before refusing; now neither changes a host."""
    good = write_inventory(inv, tmp_path / "good.yaml")
    bad_inv = inv.model_copy(update={"known_hosts": str(_known_hosts_with_rpc_key_changed(lab, tmp_path))})
    bad = write_inventory(bad_inv, tmp_path / "bad.yaml")
    native_root = inv.host("lab-native").install_root
    r = cli("lease", "take", "lab", "--purpose", "x", inventory=str(bad))
    assert r.exit_code == 4, r.output
    assert not Path(f"{native_root}/leases").exists()  # the native host was never written to
    r = cli("lease", "take", "lab-native", "--purpose", "held", inventory=str(good))
    assert r.exit_code == 0, r.output
    nonce = re.search(r"nonce: ([0-9a-f]{32})", r.stdout).group(1)
    r = cli("lease", "release", "lab", "--nonce", nonce, inventory=str(bad))
    assert r.exit_code == 4, r.output
    t = open_transport(inv, "lab-native")
    try:
        assert L.lease_state(t, native_root).state == "held"  # untouched
        L.release_lease(t, native_root, nonce)
    finally:
        t.close()


def test_another_operator_frees_a_dead_runs_lease_by_its_heartbeat(lab, inv, tmp_path, cli) -> None:
    """Issue 21: a run of another home (no evidence of it here) whose heartbeat on both hosts is
    older than the bound it promised is proven over by the hosts: `lease release --dead-run`
    frees it with a receipt; while the heartbeat is fresh it is refused and nothing changes."""
    path = write_inventory(inv, tmp_path / "inv.yaml")
    run = "20261203T120000Z-4242-1"
    with TransportPool(inv) as pool:
        targets = L.targets_of(inv, pool, "lab")
        L.take_leases(targets, "other@elsewhere", f"pairctl deploy lab (run {run})", 7200, stale_after_s=600)
        r = cli("lease", "release", "lab", "--dead-run", run, inventory=str(path))
        assert r.exit_code == 5 and "not proven over" in r.stderr and "heartbeat" in r.stderr, r.output
        assert all(L.lease_state(t.transport, t.install_root).state == "held" for t in targets)
        for t in targets:  # the holder dies: its last heartbeat was an hour ago (host time)
            L.release_lease(t.transport, t.install_root, L.read_lease(t.transport, t.install_root).nonce)
            L.take_lease(
                t.transport,
                t.install_root,
                "other@elsewhere",
                f"pairctl deploy lab (run {run})",
                7200,
                stale_after_s=600,
                clock=an_hour_ago,
            )
        shown = cli("--json", "lease", "show", "lab", inventory=str(path))
        assert all(s["stale"] for s in json.loads(shown.stdout)), shown.stdout
        r = cli("--json", "lease", "release", "lab", "--dead-run", run, inventory=str(path))
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["run"]["state"] == "stale" and "exceed its 600 s bound" in out["run"]["why"]
        assert [s["state"] for s in out["after"]] == ["free", "free"] and out["receipt"]
        assert all(b["heartbeat_age_s"] >= 3600 for b in out["released"])


def test_cli_lease_names_its_target_with_pair_or_host_like_every_command(lab, inv, tmp_path, cli) -> None:
    """Issue 34: `lease take|show|release --pair P` / `--host H` (the positional form still works)."""
    path = write_inventory(inv, tmp_path / "inv.yaml")
    r = cli("--json", "lease", "take", "--pair", "lab", "--purpose", "flags", "--ttl", "10m", inventory=str(path))
    assert r.exit_code == 0, r.output
    nonce = json.loads(r.stdout)["nonce"]
    try:
        shown = json.loads(cli("--json", "lease", "show", "--pair", "lab", inventory=str(path)).stdout)
        assert [(s["host"], s["state"]) for s in shown] == [("lab-native", "held"), ("lab-rpc", "held")]
        one = json.loads(cli("--json", "lease", "show", "--host", "lab-rpc", inventory=str(path)).stdout)
        assert [s["host"] for s in one] == ["lab-rpc"]
        positional = json.loads(cli("--json", "lease", "show", "lab", inventory=str(path)).stdout)
        assert [(s["host"], s["lease"]) for s in positional] == [(s["host"], s["lease"]) for s in shown]
        for bad in (["--pair", "lab-rpc"], ["--host", "lab"], ["--pair", "lab", "--host", "lab-rpc"], []):
            code = cli("lease", "show", *bad, inventory=str(path)).exit_code
            assert code in (2, 3), (bad, code)  # a usage error, or a name the inventory does not define
    finally:
        r = cli("--json", "lease", "release", "--pair", "lab", "--nonce", nonce, inventory=str(path))
    assert r.exit_code == 0 and [s["state"] for s in json.loads(r.stdout)["after"]] == ["free", "free"], r.output


def test_the_file_system_of_a_state_dir_is_read_over_sftp(inv) -> None:
    """layout.fs_type (a state_dir on tmpfs is warned of) reads /proc/self/mounts over real SFTP:
    a file whose size reads 0, never a process on the host."""
    from orchestrator.hosts.layout import fs_type

    with TransportPool(inv) as pool:
        t = pool.get("lab-native")
        assert fs_type(t, "/dev/shm/pairctl") == "tmpfs"
        root = inv.host("lab-native").install_root  # a loopback host: the same mounts as here
        assert fs_type(t, root) == fs_type(LocalTransport("here"), root) is not None
