"""Pruning releases on the lab's REAL sshd hosts (private install roots, so no deploy of the
lab pair is disturbed): what is kept, what is removed, the receipt, and an interrupted prune."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import Inventory
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts import prune as P
from orchestrator.hosts.layout import HostLayout, install_helper, switch_links
from orchestrator.hosts.probes import read_facts
from orchestrator.hosts.route import RouteEntry, next_record
from orchestrator.paths import Home
from orchestrator.remote.pool import TransportPool

pytestmark = pytest.mark.integration

RELEASES = [f"rel-{i}" for i in range(7)]  # rel-0 oldest (names break the 1 s SFTP mtime ties)


def _inventory(lab, tmp_path: Path) -> Inventory:
    """The lab pair on private roots, plus a pair `other` (its own native root on the lab's
    native sshd) sharing lab-rpc, keep_releases 3."""
    hosts = {}
    for name, spec in lab.inventory.hosts.items():
        # a root of its own, and so the default state dir beside it (the lab's is filled in by now)
        hosts[name] = spec.model_copy(update={"install_root": str(tmp_path / "roots" / name), "state_dir": None})
    hosts["other-native"] = hosts["lab-native"].model_copy(update={"install_root": str(tmp_path / "roots" / "other")})
    other = lab.inventory.pair("lab").model_copy(
        update={"native": "other-native", "server_port": 8091, "rpc_port": 50091}
    )
    return lab.inventory.model_copy(
        update={"hosts": hosts, "pairs": {**lab.inventory.pairs, "other": other}, "keep_releases": 3}
    )


def _entry(pid: str) -> RouteEntry:
    return RouteEntry.build(
        native_package=pid,
        rpc_package=pid,
        package_revision="0" * 40,
        profile={"name": "lab"},
        native_argv=["x"],
        rpc_argv=["y"],
    )


def _seed(inv: Inventory, pool: TransportPool) -> None:
    for host in ("lab-native", "lab-rpc", "other-native"):
        t, lay = pool.get(host), HostLayout(inv.host(host).install_root)
        install_helper(t, lay)
        for pid in RELEASES:
            t.makedirs(posixpath.join(lay.release(pid), "bin"))
            t.put_bytes(b"x" * 1000, posixpath.join(lay.release(pid), "bin", "llama-server"))
        switch_links(t, lay, "rel-6", "rel-5")
    # lab's own record names rel-1 as previous; pair other's record (on its own root) names rel-2
    lab_rec = next_record(None, pair="lab", active=_entry("rel-6"), previous=_entry("rel-1"), run_id="t")
    pool.get("lab-native").put_bytes(lab_rec.to_bytes(), HostLayout(inv.host("lab-native").install_root).route)
    other_rec = next_record(None, pair="other", active=_entry("rel-2"), previous=None, run_id="t")
    pool.get("other-native").put_bytes(other_rec.to_bytes(), HostLayout(inv.host("other-native").install_root).route)
    # a prune killed between its rename and its removal left a tomb behind
    rpc = HostLayout(inv.host("lab-rpc").install_root)
    pool.get("lab-rpc").makedirs(posixpath.join(rpc.releases, ".rel-x.tomb-dead0001", "bin"))


def test_prune_keeps_links_routes_and_newest(lab, cli, tmp_path):
    inv = _inventory(lab, tmp_path)
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(yaml.safe_dump(inv.model_dump(mode="json")))
    with TransportPool(inv) as pool:
        _seed(inv, pool)
    store = EvidenceStore(Home.resolve(lab.home.root).evidence)
    before = len(store.hashes())

    r = cli("--json", "releases", "list", "--pair", "lab", inventory=str(inv_path))
    assert r.exit_code == 0, r.output
    listed = {h["host"]: h["plan"] for h in json.loads(r.stdout)["hosts"]}
    assert len(store.hashes()) == before  # a read writes no receipt
    assert listed["lab-rpc"]["leftover_tombs"] == [".rel-x.tomb-dead0001"]

    r = cli("--json", "releases", "prune", "--pair", "lab", inventory=str(inv_path))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    by_host = {h["host"]: h for h in out["hosts"]}
    native, rpc = by_host["lab-native"], by_host["lab-rpc"]
    assert sorted(native["plan"]["keep"]) == ["rel-1", "rel-5", "rel-6"]  # links + this pair's route previous
    assert native["plan"]["protected"]["rel-1"] == "named by pair lab's route (previous)"
    # on lab-rpc both pairs' routes count: lab's previous (rel-1) and other's active (rel-2), so it
    # keeps four, more than keep_releases
    assert sorted(rpc["plan"]["keep"]) == ["rel-1", "rel-2", "rel-5", "rel-6"]
    assert rpc["plan"]["protected"]["rel-2"] == "named by pair other's route (active)"
    assert [x["release"] for x in rpc["removed"]] == ["rel-0", "rel-3", "rel-4"]
    assert [x["release"] for x in native["removed"]] == ["rel-0", "rel-2", "rel-3", "rel-4"]
    assert all(x["bytes"] >= 1000 for x in native["removed"] + rpc["removed"])
    assert out["bytes_freed"] == native["bytes_freed"] + rpc["bytes_freed"] >= 7000
    assert rpc["leftover_tombs_removed"] == 1

    with TransportPool(inv) as pool:
        kept_on = {"lab-native": {"rel-1", "rel-5", "rel-6"}, "lab-rpc": {"rel-1", "rel-2", "rel-5", "rel-6"}}
        for host, kept in kept_on.items():
            lay = HostLayout(inv.host(host).install_root)
            assert set(pool.get(host).listdir(lay.releases)) == kept  # no tomb, no half-removed release
        assert pool.get("other-native").listdir(HostLayout(inv.host("other-native").install_root).releases) == RELEASES

    receipt = store.load(out["receipt"])
    assert receipt.outcome == "passed" and receipt.command == "releases prune"
    assert (receipt.model_extra or {})["prune"]["bytes_freed"] == out["bytes_freed"]


def test_interrupted_prune_leaves_a_tomb_never_a_half_release(lab, tmp_path):
    """The removal exec fails after the rename: the release is gone from what deploy reads
    (facts), and the next prune deletes the tomb."""
    inv = _inventory(lab, tmp_path)
    with TransportPool(inv) as pool:
        _seed(inv, pool)
        t, lay = pool.get("lab-native"), HostLayout(inv.host("lab-native").install_root)
        plan = P.host_plan(inv, pool.get, "lab-native", "lab")
        assert plan.remove == ("rel-0", "rel-2", "rel-3", "rel-4")

        class Cut:  # the connection drops when the removal exec starts
            def __getattr__(self, name):
                return getattr(t, name)

            def run(self, *a, **kw):
                raise ConnectionError("cut")

        with pytest.raises(ConnectionError):
            P.execute(Cut(), lay, plan)  # type: ignore[arg-type]
        names = t.listdir(lay.releases)
        assert sorted(n for n in names if not n.startswith(".")) == ["rel-1", "rel-5", "rel-6"]
        assert len([n for n in names if P.TOMB.match(n)]) == 4
        assert set(read_facts(t, lay, ()).releases) == {"rel-1", "rel-5", "rel-6"}  # what deploy sees

        again = P.execute(t, lay, P.host_plan(inv, pool.get, "lab-native", "lab"))
        assert again.leftover_tombs_removed == 4 and again.removed == []
        assert t.listdir(lay.releases) == ["rel-1", "rel-5", "rel-6"]


def test_a_releases_link_never_lets_prune_delete_outside_the_root(lab, cli, tmp_path):
    """Issue 32 #8 as it was run: `releases -> /elsewhere` on a real host; `releases prune`
    removed five directories there (rc=0). Now the link is refused (exit 6, host and path named)
    before anything is renamed, by `releases list`, `releases prune` and the prune deploy runs."""
    import os
    import shutil

    inv = _inventory(lab, tmp_path)
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(yaml.safe_dump(inv.model_dump(mode="json")))
    with TransportPool(inv) as pool:
        _seed(inv, pool)
    lay = HostLayout(inv.host("lab-native").install_root)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(lay.releases, elsewhere)
    os.symlink(elsewhere, lay.releases)
    before = sorted(os.listdir(elsewhere))
    for args in (("releases", "list"), ("releases", "prune")):
        r = cli(*args, "--pair", "lab", inventory=str(inv_path))
        assert r.exit_code == 6, (args, r.exit_code, r.output)
        assert "lab-native" in r.stderr and f"{lay.releases} is a link" in r.stderr, r.stderr
    assert sorted(os.listdir(elsewhere)) == before  # nothing renamed or removed there
    with TransportPool(inv) as pool:  # and the helper's own guard, were it reached through a link
        out = pool.get("lab-native").run(
            P.Cmd(("sh", "-c", P.REMOVE_SH, "pairctl-prune", lay.releases, ".rel-0.tomb-00")), check=False
        )
    assert out.exit_status == 2 and "refused" in out.stderr
    assert sorted(os.listdir(elsewhere)) == before
