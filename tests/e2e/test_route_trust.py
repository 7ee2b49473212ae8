"""The host is untrusted input (issues 16 and 21), end to end on the lab pair `lab`.

Hostile route records, links and evidence, and an inventory changed between deploy and
rollback: each case is refused before anything changes (exit 6, or 10 for evidence) with the
host, path and repairing command named, or, for the inventory change, rolled back correctly.
Every test leaves the baseline (package A, profile lab, the lab inventory) active and verified.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.loader import read_yaml
from orchestrator.engine.plan import pair_view
from orchestrator.hashing import canonical_json
from orchestrator.hosts.route import argv_digest
from tests.plugins.lab import lab_inventory_file
from tests.plugins.pairs import hooked_deploy, is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PAIR = "lab"
INV_FILE = lab_inventory_file()


def _roots(pair) -> dict[str, Path]:
    return {k: Path(v) for k, v in pair.roots().items()}


def _deploy(cli, *args: str, inventory: str | None = None):
    r = cli("--json", "deploy", "--pair", PAIR, *args, inventory=inventory)
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def _baseline(cli, a: str) -> None:
    """A with profile lab under the lab inventory, whatever ran before."""
    r, _ = _deploy(cli, "--packages", a, a, "--profile", "lab", "--skip-accept")
    assert r.exit_code == 0, r.stderr
    assert is_active(lab_status(cli), a)


def _routes(pair) -> dict[str, bytes]:
    return {k: (r / "run" / "route.json").read_bytes() for k, r in _roots(pair).items()}


def _put_routes(pair, data: dict[str, bytes | None]) -> None:
    for k, r in _roots(pair).items():
        p = r / "run" / "route.json"
        if data[k] is None:
            p.unlink(missing_ok=True)
        else:
            p.write_bytes(data[k])


def _running(st: dict[str, Any]) -> dict[str, tuple[str | None, bool]]:
    return {h: (v["current"], v["running"]) for h, v in st["hosts"].items()}


@pytest.fixture
def b_over_a(deployed_lab, lab_packages_b, cli):
    """B active over A (route: active B, previous A); the baseline is put back afterwards."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    r, _ = _deploy(cli, "--packages", b, b, "--skip-accept")
    assert r.exit_code == 0, r.stderr
    yield a, b
    _baseline(cli, a)


def test_rollback_refuses_a_tampered_previous_entry_before_stopping_anything(deployed_lab, b_over_a, cli):
    """Issue 16 #3: flags added to the previous entry on the host were restored and reported
    healthy. Now the stale argv_sha256 and the signature both refuse it (exit 6), nothing stops."""
    a, b = b_over_a
    good = _routes(deployed_lab)
    before = _running(lab_status(cli))
    rec = json.loads(good["native"])
    rec["previous"]["native_argv"] += ["--tools", "exec_shell_command"]
    stale = canonical_json(rec) + b"\n"
    rec["previous"]["argv_sha256"] = argv_digest(rec["previous"]["native_argv"], rec["previous"]["rpc_argv"])
    resealed = canonical_json(rec) + b"\n"  # the digest recomputed: only the signature can tell
    try:
        for data, why in ((stale, "argv_sha256 does not match"), (resealed, "does not verify")):
            _put_routes(deployed_lab, {"native": data, "rpc": data})
            st = lab_status(cli)
            assert any(why in p for p in st["problems"]), st["problems"]
            rb = cli("rollback", "--pair", PAIR)
            assert rb.exit_code == 6, (rb.exit_code, rb.stderr)
            assert why in rb.stderr and "pairctl repair --pair lab" in rb.stderr and "nothing was changed" in rb.stderr
            assert _running(lab_status(cli)) == before  # B still current and running on both hosts
    finally:
        _put_routes(deployed_lab, good)
    assert is_active(lab_status(cli), b)


def test_rollback_across_an_inventory_change_renders_argv_now(deployed_lab, b_over_a, cli, tmp_path):
    """Issue 16 #2 and #11: the previous pair came back with its recorded argv (no --api-key-file
    after a key was added; the old rpc_port while waiting on the new one: exit 8, pair down).
    Now rollback renders argv from the inventory as it stands: the key is required and the RPC
    server listens on the new port, verified by identity and status."""
    a, b = b_over_a
    key = tmp_path / "api-key"
    key.write_text("route-trust-test-key-0123456789\n")
    key.chmod(0o600)
    inv = read_yaml(INV_FILE)
    inv["pairs"][PAIR]["rpc_port"] = inv["pairs"][PAIR]["rpc_port"] + 7
    inv["pairs"][PAIR]["api_key_file"] = str(key)
    changed = tmp_path / "changed.yaml"
    changed.write_text(json.dumps(inv))
    try:
        rb = cli("--json", "rollback", "--pair", PAIR, inventory=str(changed))
        assert rb.exit_code == 0, rb.stderr
        st = lab_status(cli, PAIR, str(changed))
        assert is_active(st, a), st
        route = json.loads((_roots(deployed_lab)["native"] / "run" / "route.json").read_text())
        native_argv = route["active"]["native_argv"]
        port = inv["pairs"][PAIR]["rpc_port"]
        assert "--api-key-file" in native_argv
        assert f"{deployed_lab.inventory.rpc_bind(PAIR)}:{port}" in native_argv
        assert str(port) in route["active"]["rpc_argv"]
        base_url = pair_view(deployed_lab.inventory, PAIR).base_url
        req = urllib.request.Request(
            f"{base_url}/completion",
            method="POST",
            data=b'{"prompt": "a", "n_predict": 1}',
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 401  # the key the inventory names now is enforced
    finally:
        _baseline(cli, a)


def test_deploy_killed_before_acceptance_is_not_recorded_active(deployed_lab, lab_packages_b, cli, tmp_path):
    """Issue 21 #1: the route step named the new pair active before acceptance; a deploy
    SIGKILLed there left status exit 0. Now the record says `activating` by that run until
    acceptance passed; once the run is over status names the problem and the resolving command."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    # killed before route-accepted settles the record (a --skip-accept deploy plans no accept
    # step since issue 29: nothing runs there, so nothing may say it passed)
    child = hooked_deploy(Path(deployed_lab.home), b, "route-accepted:kill", tmp_path)
    _, err = child.communicate(timeout=600)
    assert child.returncode == -signal.SIGKILL, err[-2000:]
    run = json.loads((_roots(deployed_lab)["native"] / "run" / "route.json").read_text())["updated_by"]
    try:
        r = cli("--json", "status", "--pair", PAIR)
        assert r.exit_code == 1, r.output
        st = json.loads(r.stdout)
        assert st["route"]["state"] == "activating" and st["route"]["active_packages"] == [b, b]
        text = " ".join(st["problems"])
        assert "never accepted" in text and "pairctl rollback --pair lab" in text, st["problems"]
        assert st["route"]["updated_by"] == run
        freed = cli("lease", "release", PAIR, "--dead-run", run)
        assert freed.exit_code == 0, freed.output
        rb = cli("rollback", "--pair", PAIR)
        assert rb.exit_code == 0, rb.stderr
        assert is_active(lab_status(cli), a)
    finally:
        cli("lease", "release", PAIR, "--dead-run", run)  # after a failed assertion: free the killed run's leases
        _baseline(cli, a)


def test_deploy_killed_between_its_two_route_writes_is_resolved_by_rollback(
    deployed_lab, lab_packages_b, cli, tmp_path
):
    """A deploy SIGKILLed between the hosts' `route` writes leaves the new `activating` record on one
    host and the settled record it was made from on the other: judged as records that differ, every
    later deploy and rollback refused (repair only). The two writes run at once, so the kill is
    placed after both and the native host's record put back as it was (the bytes pairctl wrote
    there before): the host a rollback reads its base from holds the older record. Now status names
    the interrupted activation and rollback puts the found pair back, one record on both hosts."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    before = _routes(deployed_lab)
    child = hooked_deploy(Path(deployed_lab.home), b, "route-accepted:kill", tmp_path)
    _, err = child.communicate(timeout=600)
    assert child.returncode == -signal.SIGKILL, err[-2000:]
    new = _routes(deployed_lab)
    run = json.loads(new["rpc"])["updated_by"]
    (_roots(deployed_lab)["native"] / "run" / "route.json").write_bytes(before["native"])
    try:
        r = cli("--json", "status", "--pair", PAIR)
        assert r.exit_code == 1, r.output
        st = json.loads(r.stdout)
        text = " ".join(st["problems"])
        assert "never accepted" in text and "differ" not in text, st["problems"]
        assert st["route"]["state"] == "activating" and st["route"]["updated_by"] == run
        assert cli("lease", "release", PAIR, "--dead-run", run).exit_code == 0
        rb = cli("rollback", "--pair", PAIR)
        assert rb.exit_code == 0, rb.stderr
        assert is_active(lab_status(cli), a)
        routes = _routes(deployed_lab)
        rec = json.loads(routes["native"])
        assert routes["native"] == routes["rpc"] and rec["revision"] == json.loads(new["rpc"])["revision"] + 1
        assert rec["previous"]["native_package"] == b and rec["previous_state"] == "identity-verified"
    finally:  # never the saved records put back: the killed run's receipt names a later revision
        cli("lease", "release", PAIR, "--dead-run", run)
        if lab_status(cli)["problems"]:
            cli("repair", "--pair", PAIR, "--yes")
        _baseline(cli, a)


def test_links_that_leave_the_install_root_are_refused(deployed_lab, lab_packages_b, cli, tmp_path):
    """Issue 16 #8: `current` outside the install root was shown as that release; a link without
    /releases/ crashed deploy/rollback with an internal ProbeError. Now both are exit 6 naming
    host and link in status, deploy, rollback and kernels check; `current` naming a missing
    release is named."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    current = _roots(deployed_lab)["native"] / "run" / "current"
    target = os.readlink(current)
    fake = tmp_path / "evil" / "releases" / a
    fake.mkdir(parents=True)
    try:
        for bad in ("/etc", str(fake), "releases/..", "releases/"):
            current.unlink()
            os.symlink(bad, current)
            for args in (
                ("status", "--pair", PAIR),
                ("deploy", "--pair", PAIR, "--packages", b, b, "--skip-accept"),
                ("rollback", "--pair", PAIR),
                ("kernels", "check", "--pair", PAIR),
            ):
                r = cli(*args)
                assert r.exit_code == 6, (bad, args, r.exit_code, r.output)
                assert "lab-native" in r.stderr and str(current) in r.stderr, r.stderr
                assert "internal error" not in r.stderr and "Traceback" not in r.stderr
        current.unlink()
        # run/ links are absolute (a relative one is refused above, with the other bad shapes)
        os.symlink(str(_roots(deployed_lab)["native"] / "releases" / ("0" * 12 + "-gone")), current)
        st = lab_status(cli)
        assert any("which is not in" in p and "lab-native" in p for p in st["problems"]), st["problems"]
        r, _ = _deploy(cli, "--packages", b, b, "--skip-accept")
        assert r.exit_code == 6 and "not in" in r.stderr, r.stderr
        # refused after `lease` (the hosts' state is judged once they are held): the leases are
        # given back, not left until their TTL for the next deploy to meet as exit 5
        held = [h for h, r in _roots(deployed_lab).items() if (r / "leases" / "host.lock").exists()]
        assert not held, f"the refused deploy left its leases on {held}: {lab_status(cli)['hosts']}"
    finally:
        current.unlink()
        os.symlink(target, current)
    assert is_active(lab_status(cli), a)


def test_missing_or_disagreeing_route_refused_then_repaired(deployed_lab, lab_packages_b, cli):
    """Issue 21 #6: route.json missing on both hosts restarted the record at revision 1 (and
    rollback then refused); a wrong record on one host was silently overwritten; invalid JSON
    gave exit 3 with no host or path. Now deploy and rollback refuse (exit 6) naming host, path
    and `pairctl repair`, which shows the record it rebuilds from the links and writes it with
    --yes, recorded in a receipt."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    good = _routes(deployed_lab)
    rev = json.loads(good["native"])["revision"]
    try:
        for damaged, where in (
            ({"native": None, "rpc": None}, "no route record on either host"),
            ({"native": good["native"], "rpc": b"{not json"}, "lab-rpc:"),
            ({"native": good["native"], "rpc": _with_revision(good["native"], 1000)}, "lab-rpc:"),
        ):
            _put_routes(deployed_lab, damaged)
            for args in (("deploy", "--pair", PAIR, "--packages", b, b, "--skip-accept"), ("rollback", "--pair", PAIR)):
                r = cli(*args)
                assert r.exit_code == 6, (args, r.exit_code, r.output)
                assert where in r.stderr and "pairctl repair --pair lab" in r.stderr, r.stderr
            assert _routes_or_none(deployed_lab) == damaged  # refused: nothing written
        shown = cli("--json", "repair", "--pair", PAIR)
        assert shown.exit_code == 0, shown.output
        out = json.loads(shown.stdout)
        assert not out["written"] and out["record"]["active"]["native_package"] == a
        assert _routes_or_none(deployed_lab) == damaged  # shown, not written
        done = cli("--json", "repair", "--pair", PAIR, "--yes")
        assert done.exit_code == 0, done.output
        out = json.loads(done.stdout)
        assert out["written"] and out["receipt"] and out["record"]["revision"] > rev
        routes = _routes(deployed_lab)
        assert routes["native"] == routes["rpc"]
        st = lab_status(cli)
        assert is_active(st, a), st
    finally:
        if not is_active(lab_status(cli), a):
            _put_routes(deployed_lab, good)


def _with_revision(data: bytes, revision: int) -> bytes:
    rec = json.loads(data)
    rec["revision"] = revision
    return canonical_json(rec) + b"\n"


def _routes_or_none(pair) -> dict[str, bytes | None]:
    return {
        k: (r / "run" / "route.json").read_bytes() if (r / "run" / "route.json").exists() else None
        for k, r in _roots(pair).items()
    }


def test_deleted_receipts_show_up_against_the_route_anchor(deployed_lab, b_over_a, cli, tmp_path):
    """Issue 16 #7: deleting the newest receipt (and moving the head back) or the whole chain
    went unnoticed. The route record names the run that wrote it and the chain head it followed:
    status names the gap and deploy refuses (exit 10) until the evidence is back."""
    a, b = b_over_a
    ev = Path(deployed_lab.home) / "evidence"
    route = json.loads((_roots(deployed_lab)["native"] / "run" / "route.json").read_text())
    head_file = ev / "heads" / PAIR
    head = head_file.read_text().strip()
    newest = json.loads((ev / "receipts" / f"{head}.json").read_text())
    assert newest["run_id"] == route["updated_by"]
    aside = tmp_path / "aside"
    aside.mkdir()
    shutil.move(str(ev / "receipts" / f"{head}.json"), aside / f"{head}.json")
    head_file.write_text(newest["previous"])
    try:
        st = lab_status(cli)
        assert any("not in pair lab's evidence chain" in p for p in st["problems"]), st["problems"]
        r, _ = _deploy(cli, "--packages", a, a, "--skip-accept")
        assert r.exit_code == 10 and route["updated_by"] in r.stderr, (r.exit_code, r.stderr)
    finally:
        refused = head_file.read_text().strip()  # the refused deploy's receipt, chained onto the gap
        if refused not in (head, newest["previous"]):
            for d in ("receipts", "index"):
                (ev / d / f"{refused}.json").unlink(missing_ok=True)
        shutil.move(str(aside / f"{head}.json"), ev / "receipts" / f"{head}.json")
        head_file.write_text(head)
    assert is_active(lab_status(cli), b)  # the evidence is whole again; b_over_a puts the baseline back


def _links(pair) -> dict[str, dict[str, str | None]]:
    return {
        k: {n: os.readlink(r / "run" / n) if os.path.islink(r / "run" / n) else None for n in ("current", "previous")}
        for k, r in _roots(pair).items()
    }


def _put_links(pair, links: dict[str, dict[str, str | None]]) -> None:
    for k, root in _roots(pair).items():
        r = root / "run"
        for n, target in links[k].items():
            if target is None:
                (r / n).unlink(missing_ok=True)
                continue
            tmp = r / f".{n}.replay"
            tmp.unlink(missing_ok=True)
            os.symlink(target, tmp)
            os.replace(tmp, r / n)


def test_a_host_restored_to_an_older_revision_is_refused(deployed_lab, lab_packages_b, cli):
    """Issue 32 #5, as it was run: the hosts' route records and links of the baseline's deploy
    (revision N) put back after B was deployed (revision N+1), from real receipts of real
    deploys. The older record is signed by this home and anchored at its own place in the chain,
    so only the newer revision in the later deploy's receipt shows the replay: status names it
    (exit 1), rollback and deploy refuse it (exit 6) before stopping anything."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    old_routes, old_links = _routes(deployed_lab), _links(deployed_lab)
    old_rev = json.loads(old_routes["native"])["revision"]
    r, _ = _deploy(cli, "--packages", b, b, "--skip-accept")
    assert r.exit_code == 0, r.stderr
    new_routes, new_links = _routes(deployed_lab), _links(deployed_lab)
    new_rev = json.loads(new_routes["native"])["revision"]
    assert new_rev > old_rev
    try:
        _put_routes(deployed_lab, old_routes)
        _put_links(deployed_lab, old_links)
        r = cli("--json", "status", "--pair", PAIR)
        assert r.exit_code == 1, r.output
        problems = json.loads(r.stdout)["problems"]
        assert any(f"revision {old_rev}" in p and f"wrote revision {new_rev}" in p for p in problems), problems
        for args in (("rollback", "--pair", PAIR), ("deploy", "--pair", PAIR, "--packages", a, a, "--skip-accept")):
            r = cli(*args)
            assert r.exit_code == 6, (args, r.exit_code, r.output)
            assert "an earlier record was put back" in r.stderr and "Traceback" not in r.stderr
            assert _routes(deployed_lab) == old_routes  # refused: nothing written
    finally:
        _put_routes(deployed_lab, new_routes)
        _put_links(deployed_lab, new_links)
    assert is_active(lab_status(cli), b)
    _baseline(cli, a)


def test_repair_takes_no_profile_from_an_unsigned_record(deployed_lab, cli):
    """Issue 32 #14, the last of its list: `repair` took the profile (and model hashes) from the
    host's route record even when this home had not signed it, so whoever writes route.json on a
    host chose which of the operator's profiles the repaired pair names. Here both hosts hold the
    real record with another loadable profile named and its mac left as it was (no longer valid):
    repair must name the profile this home's evidence used for those packages, and say why."""
    a = deployed_lab.package_id
    good = _routes(deployed_lab)
    planted = json.loads(good["native"])
    assert planted["active"]["native_package"] == a and planted["active"]["profile_name"] == "lab"
    planted["active"]["profile_name"] = "lab-no-slack"
    planted["active"]["models"] = {k: "0" * 64 for k in planted["active"].get("models") or {}}
    data = canonical_json(planted) + b"\n"
    try:
        _put_routes(deployed_lab, {"native": data, "rpc": data})
        shown = cli("--json", "repair", "--pair", PAIR)
        assert shown.exit_code == 0, shown.output
        out = json.loads(shown.stdout)
        active = out["record"]["active"]
        assert active["native_package"] == a
        assert active["profile_name"] == "lab", active["profile_name"]
        assert "0" * 64 not in json.dumps(active.get("models")), active.get("models")
        assert "not signed by this home" in json.dumps(out), out
        assert _routes(deployed_lab) == {"native": data, "rpc": data}  # shown, not written
    finally:
        _put_routes(deployed_lab, good)
    assert is_active(lab_status(cli), a)
