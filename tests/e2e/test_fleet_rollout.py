"""A rollout of one revision over the three lab3 pairs (six real sshd hosts, real servers), issue 19.

Canary lab1, serial 1, max-fail 1, lab2's profile broken (llama-server cannot load): lab1 goes to
REV and is accepted, lab2 rolls back to the baseline, lab3 is not started, and the fleet receipt
says all of it; after the profile is fixed the same command skips lab1 and finishes the rollout.
Hooks receive every event on stdin; a failing hook changes nothing. Only lab3 (127.0.0.12-17).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.build.manifest import package_id
from orchestrator.build.store import PackageStore
from orchestrator.cli.outputs import validate_output
from orchestrator.lab.source import BASELINE_TAG
from orchestrator.paths import Home
from tests.plugins.packages import REV_B_TAG, build_package
from tests.plugins.pairs import broken_binary, deploy_baseline, lab_status

pytestmark = pytest.mark.e2e

CHECKS = "identity,cached_continuation"
PAIRS = ("lab1", "lab2", "lab3")
HOOK = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(json.load(sys.stdin)) + '\\n')"


def _inventory(src: Path, dest: Path, log: Path, *, lab2_profile: str) -> str:
    inv = yaml.safe_load(src.read_text())
    inv["pairs"]["lab2"]["profile"] = lab2_profile
    inv["hooks"] = [
        {
            "on": ["deploy.passed", "deploy.rolled_back", "deploy.rollback_failed", "fleet.finished", "fleet.paused"]
            + ["accept.scheduled_skipped", "accept.scheduled_failed"],
            "argv": [sys.executable, "-c", HOOK, str(log)],
            "timeout_s": 20,
        },
        {"on": ["fleet.finished"], "argv": [sys.executable, "-c", "import sys; sys.exit(3)"], "timeout_s": 5},
    ]
    dest.write_text(yaml.safe_dump(inv, sort_keys=False))
    return str(dest)


def _active(cli, pair: str, inv: str) -> list[str] | None:
    return (lab_status(cli, pair, inv).get("route") or {}).get("active_packages")


def test_rollout_canary_serial_max_fail_then_continue(cli, lab3, lab_packages, lab_packages_b, pairctl_home, tmp_path):
    base, cand = lab_packages.id, lab_packages_b.id
    log = tmp_path / "hooks.jsonl"
    inv = _inventory(lab3.inventory_path, tmp_path / "lab3-fleet.yaml", log, lab2_profile="lab-unloadable")
    for p in PAIRS:
        if deploy_baseline(cli, base, pair=p, inventory=inv) is not None:  # a single-pair deploy fires hooks too
            assert json.loads(log.read_text().splitlines()[-1])["event"] == "deploy.passed"
    log.unlink(missing_ok=True)
    store = PackageStore(Home.resolve(pairctl_home).store)
    broken_id = package_id("lab-unloadable", lab_packages_b.manifest.revision, "cpu-lab")
    if store.exists(broken_id):  # left by an earlier session: this test shows the refusal first
        store.remove(broken_id)
    rollout = ("deploy", "--rev", REV_B_TAG, "--all", "--canary", "lab1", "--serial", "1", "--max-fail", "1")
    rollout += ("--checks", CHECKS)

    # 1. a package of REV missing for lab2's profile: refused before anything starts, naming the build
    r = cli("--json", *rollout, inventory=inv)
    assert r.exit_code == 6, r.output
    err = json.loads(r.stdout)["error"]
    want = f"pairctl build --rev {REV_B_TAG} --target cpu-lab --profile lab-unloadable"
    assert want in err["hint"], err
    assert "lab2" in err["message"] and "nothing was started" in err["message"]
    assert all(_active(cli, p, inv) == [base, base] for p in PAIRS)
    broken = build_package(pairctl_home, REV_B_TAG, profile="lab-unloadable")  # the hint's command (cache hit)

    # 2. dry run: waves, skips, packages; nothing changes
    r = cli("--json", *rollout, "--dry-run", inventory=inv)
    assert r.exit_code == 0, r.output
    dry = json.loads(r.stdout)
    assert dry["dry_run"] and dry["plan"]["waves"] == [["lab1"], ["lab2"], ["lab3"]]
    assert dry["plan"]["packages"] == {"lab1": [cand, cand], "lab2": [broken.id, broken.id], "lab3": [cand, cand]}
    assert dry["receipt"] is None and _active(cli, "lab1", inv) == [base, base]
    text = cli(*rollout, "--dry-run", inventory=inv)
    assert text.exit_code == 0 and "wave 1: lab1" in text.stdout and "wave 3: lab3" in text.stdout, text.output
    assert f"{broken.id} + {broken.id} (lab-unloadable)" in text.stdout

    # 3. the rollout: canary passes, lab2 rolls back, lab3 is never started (--max-fail 1)
    r = cli("--json", *rollout, inventory=inv)
    assert r.exit_code == 7, r.output
    out = json.loads(r.stdout)
    validate_output("deploy-fleet", out)
    got = {p["pair"]: p for p in out["pairs"]}
    assert {p: got[p]["outcome"] for p in PAIRS} == {"lab1": "passed", "lab2": "rolled-back", "lab3": "not-started"}
    assert "--max-fail 1" in got["lab3"]["reason"] and got["lab3"]["receipt"] is None
    assert _active(cli, "lab1", inv) == [cand, cand]  # the canary stays on REV
    assert _active(cli, "lab2", inv) == [base, base]  # rolled back, verified
    assert _active(cli, "lab3", inv) == [base, base]  # untouched
    fleet = json.loads(cli("--json", "receipts", "show", out["receipt"]).stdout)
    assert fleet["command"] == "fleet deploy" and fleet["outcome"] == "failed" and fleet["exit_code"] == 7
    assert fleet["plan"]["waves"] == [["lab1"], ["lab2"], ["lab3"]] and fleet["plan"]["canary"] == "lab1"
    recorded = {p["pair"]: p for p in fleet["pairs"]}
    for p in ("lab1", "lab2"):  # each pair's own deploy receipt, named by the fleet receipt
        assert recorded[p]["receipt"] == got[p]["receipt"]
        own = json.loads(cli("--json", "receipts", "show", got[p]["receipt"]).stdout)
        assert own["command"] == "deploy" and own["pair"] == p
        assert own["outcome"] == ("passed" if p == "lab1" else "failed")
    # hooks: one JSON document per event on stdin; the failing hook is recorded, the outcome unchanged
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["event"], e.get("pair")) for e in events] == [
        ("deploy.passed", "lab1"),
        ("deploy.rolled_back", "lab2"),
        ("fleet.finished", None),
    ]
    assert events[1]["receipt"] == got["lab2"]["receipt"] and events[2]["exit_code"] == 7
    assert [h["ok"] for h in out["hooks"]] == [True, False] and "exit 3" in out["hooks"][1]["error"]

    # 4. the profile fixed, the same command continues: lab1 skipped, lab2 and lab3 deployed
    _inventory(lab3.inventory_path, tmp_path / "lab3-fleet.yaml", log, lab2_profile="lab")
    r = cli("--json", *rollout, inventory=inv)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    got = {p["pair"]: p for p in out["pairs"]}
    assert {p: got[p]["outcome"] for p in PAIRS} == {"lab1": "skipped", "lab2": "passed", "lab3": "passed"}
    assert "already on" in got["lab1"]["reason"] and out["plan"]["waves"] == [["lab2"], ["lab3"]]
    assert all(_active(cli, p, inv) == [cand, cand] for p in PAIRS)

    # 5. rollback --all in one wave: every pair back on the baseline, one fleet receipt
    r = cli("--json", "rollback", "--all", "--serial", "3", inventory=inv)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["plan"]["waves"] == [["lab1", "lab2", "lab3"]]
    assert {p["outcome"] for p in out["pairs"]} == {"passed"}
    assert all(_active(cli, p, inv) == [base, base] for p in PAIRS)

    # 6. the same rollback again: every pair was last changed by a passed rollback, so all are skipped
    r = cli("--json", "rollback", "--all", "--serial", "3", inventory=inv)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {p["outcome"] for p in out["pairs"]} == {"skipped"} and out["plan"]["waves"] == []
    assert all(_active(cli, p, inv) == [base, base] for p in PAIRS)


def test_rollout_skips_a_leased_pair_and_scheduled_accept_hook(cli, lab3, lab_packages, lab_packages_b, tmp_path):
    """A pair leased by someone else is skipped (exit 5), the others finish; a scheduled acceptance
    that finds it leased fires accept.scheduled_skipped, one that fails accept.scheduled_failed; the
    way back waits --pause between its waves."""
    base, cand = lab_packages.id, lab_packages_b.id
    log = tmp_path / "hooks.jsonl"
    inv = _inventory(lab3.inventory_path, tmp_path / "lab3-fleet.yaml", log, lab2_profile="lab")
    took = cli("--json", "lease", "take", "lab1", "--purpose", "maintenance by another operator", inventory=inv)
    assert took.exit_code == 0, took.output
    nonce = json.loads(took.stdout)["nonce"]
    try:
        r = cli("--json", "deploy", "--rev", REV_B_TAG, "--all", "--serial", "3", "--checks", CHECKS, inventory=inv)
        assert r.exit_code == 5, r.output
        got = {p["pair"]: p for p in json.loads(r.stdout)["pairs"]}
        assert got["lab1"]["outcome"] == "leased" and got["lab1"]["exit_code"] == 5
        assert got["lab2"]["outcome"] in ("passed", "skipped") and got["lab3"]["outcome"] in ("passed", "skipped")
        assert _active(cli, "lab1", inv) != [cand, cand] and _active(cli, "lab2", inv) == [cand, cand]
        s = cli("--json", "accept", "--pair", "lab1", "--scheduled", "--checks", "identity", inventory=inv)
        assert s.exit_code == 11, s.output
        events = [json.loads(line) for line in log.read_text().splitlines()]
        assert ("accept.scheduled_skipped", "lab1") in [(e["event"], e.get("pair")) for e in events]
    finally:
        cli("lease", "release", "lab1", "--nonce", nonce, inventory=inv)
    # a scheduled acceptance that fails (a profile wanting twice the slots lab2 has) fires accept.scheduled_failed
    from orchestrator.config.profiles import load_profile

    big = load_profile("lab").model_dump(mode="json")
    big.update(name="lab-big-slots", ctx_size=8192)
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    s = cli(
        "accept",
        "--pair",
        "lab2",
        "--scheduled",
        "--checks",
        "identity,one_lane_near_full",
        "--profile",
        str(tmp_path / "big.yaml"),
        inventory=inv,
    )
    assert s.exit_code == 1, s.output
    failed = [json.loads(line) for line in log.read_text().splitlines()][-1]
    assert failed["event"] == "accept.scheduled_failed" and failed["pair"] == "lab2", failed
    assert failed["failed"] and failed["receipt"], failed
    # everything back on the baseline, by revision, in waves of two with --pause 1 between them
    r = cli(
        "--json", "deploy", "--rev", BASELINE_TAG, "--all", "--serial", "2", "--pause", "1", "--skip-accept",
        inventory=inv,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["plan"]["pause_s"] == 1 and len(out["plan"]["waves"]) == 2, out["plan"]  # [lab1?, lab2], [lab3]
    outside_waves = out["wall_s"] - out["timings"]["status_s"] - sum(out["timings"]["waves_s"])
    assert outside_waves >= 1.0, out["timings"]  # the pause between the two waves
    assert all(_active(cli, p, inv) == [base, base] for p in PAIRS)


def _release_kept_leases(env, pair: str) -> None:
    """A failed rollback keeps the pair's leases; the test (as the operator would) releases them by nonce."""
    from orchestrator.hosts.leases import LEASE_FILE, LEASES_DIR, LOCK_DIR, release_lease
    from orchestrator.remote.pool import TransportPool

    p = env.inventory.pair(pair)
    with TransportPool(env.inventory) as pool:
        for h in (p.native, p.rpc):
            root = env.inventory.host(h).install_root
            lease = Path(root) / LEASES_DIR / LOCK_DIR / LEASE_FILE
            if lease.exists():
                release_lease(pool.get(h), root, json.loads(lease.read_text())["nonce"])


def test_rollout_whose_rollback_fails_exits_8(cli, lab3, lab_packages, lab_packages_b, pairctl_home, tmp_path):
    """Fleet exit 8: lab2's candidate cannot load (lab-unloadable) and the pair to restore cannot
    start either (its llama-server binary on the native host replaced by one that exits at once;
    the running process keeps its inode). `deploy --rev --pair lab2 --pair lab3 --serial 1
    --max-fail 1`: lab2 is rollback-failed (its own exit 8, hosts stopped, leases kept), lab3 is not
    started, the run exits 8 and deploy.rollback_failed reaches the hook. Restored afterwards."""

    base = lab_packages.id
    log = tmp_path / "hooks.jsonl"
    inv = _inventory(lab3.inventory_path, tmp_path / "lab3-fleet.yaml", log, lab2_profile="lab-unloadable")
    for p in ("lab2", "lab3"):
        deploy_baseline(cli, base, pair=p, inventory=inv)
    log.unlink(missing_ok=True)
    broken_pkg = build_package(pairctl_home, REV_B_TAG, profile="lab-unloadable")  # the ccache makes it cheap
    native = lab3.inventory.pair("lab2").native
    binary = Path(lab3.inventory.host(native).install_root) / "releases" / base / "bin" / "llama-server"
    try:
        with broken_binary(binary, tmp_path):
            rollout = ("--json", "deploy", "--rev", REV_B_TAG, "--pair", "lab2", "--pair", "lab3", "--serial", "1")
            r = cli(*rollout, "--max-fail", "1", "--checks", CHECKS, inventory=inv)
            assert r.exit_code == 8, r.output[-3000:]
            out = json.loads(r.stdout)
            validate_output("deploy-fleet", out)
            got = {p["pair"]: p for p in out["pairs"]}
            assert got["lab2"]["outcome"] == "rollback-failed" and got["lab2"]["exit_code"] == 8, got["lab2"]
            assert got["lab2"]["packages"] == [broken_pkg.id, broken_pkg.id]
            assert got["lab3"]["outcome"] == "not-started" and out["exit_code"] == 8
            st = lab_status(cli, "lab2", inv)
            assert all(not h["running"] for h in st["hosts"].values()), st  # stopped, not half-running
            assert all(h["leases"] and h["leases"][0]["state"] == "held" for h in st["hosts"].values()), st
            assert _active(cli, "lab3", inv) == [base, base]  # never started
            fleet = json.loads(cli("--json", "receipts", "show", out["receipt"]).stdout)
            assert fleet["command"] == "fleet deploy" and fleet["exit_code"] == 8
            events = [json.loads(line) for line in log.read_text().splitlines()]
            assert [(e["event"], e.get("pair")) for e in events] == [
                ("deploy.rollback_failed", "lab2"),
                ("fleet.finished", None),
            ], events
            assert events[0]["exit_code"] == 8 and events[1]["exit_code"] == 8
    finally:
        _release_kept_leases(lab3, "lab2")
    deploy_baseline(cli, base, pair="lab2", inventory=inv)
    assert _active(cli, "lab2", inv) == [base, base]
    # rollback names pairs the same way: a dry run plans lab2 and lab3 in one wave, changing nothing
    r = cli("--json", "rollback", "--pair", "lab2", "--pair", "lab3", "--serial", "2", "--dry-run", inventory=inv)
    assert r.exit_code == 0, r.output[-2000:]
    dry = json.loads(r.stdout)
    assert dry["dry_run"] and dry["receipt"] is None, dry
    planned = [p for wave in dry["plan"]["waves"] for p in wave] + list(dry["plan"].get("skipped") or {})
    assert set(planned) == {"lab2", "lab3"}, dry["plan"]


def test_rollout_waves_pause_then_continue_where_it_stopped(
    cli, lab3, lab_packages, lab_packages_b, pairctl_home, tmp_path
):
    """`--waves 1` (Argo's pause and promote) on the real pairs, acceptance skipped, lab2's profile
    broken: the first run deploys lab1 and pauses (exit 0; lab2, lab3 `paused`, untouched); the
    same command again skips lab1 and starts at lab2, which fails and rolls back, so lab3 is
    `not-started` (no longer `paused`), and lab1 stays on REV. Two pair deploys and one rollback."""
    base, cand = lab_packages.id, lab_packages_b.id
    log = tmp_path / "hooks.jsonl"
    inv = _inventory(lab3.inventory_path, tmp_path / "lab3-fleet.yaml", log, lab2_profile="lab-unloadable")
    for p in PAIRS:
        deploy_baseline(cli, base, pair=p, inventory=inv)
    log.unlink(missing_ok=True)
    broken = build_package(pairctl_home, REV_B_TAG, profile="lab-unloadable")  # cache hit after the first session
    rollout = ("deploy", "--rev", REV_B_TAG, "--all", "--serial", "1", "--waves", "1", "--skip-accept")

    # 1. the pause: one wave runs, the rest wait with the way to continue (the operator's text output)
    r = cli(*rollout, inventory=inv)
    assert r.exit_code == 0, r.output
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.startswith("  lab")}
    assert lines["lab1"].split()[1] == "passed", r.stdout
    for p in ("lab2", "lab3"):
        assert lines[p].split()[1] == "paused" and "run the same command again" in lines[p], r.stdout
    assert "paused after wave 1 of 3" in r.stdout, r.stdout
    assert _active(cli, "lab1", inv) == [cand, cand]
    assert _active(cli, "lab2", inv) == [base, base] and _active(cli, "lab3", inv) == [base, base]
    fleet_hash = r.stdout.split("fleet receipt ")[1].split(";")[0]
    fleet = json.loads(cli("--json", "receipts", "show", fleet_hash).stdout)
    assert fleet["command"] == "fleet deploy" and fleet["outcome"] == "passed", fleet
    assert fleet["reason"].startswith("paused after wave 1 of 3"), fleet["reason"]
    assert {p["pair"]: p["outcome"] for p in fleet["pairs"]} == {"lab1": "passed", "lab2": "paused", "lab3": "paused"}
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["event"], e.get("pair")) for e in events] == [("deploy.passed", "lab1"), ("fleet.paused", None)]
    assert events[1]["receipt"] == fleet_hash and events[1]["exit_code"] == 0

    # 2. what the same command would do now: lab1 skipped, the remaining waves from lab2 on
    r = cli("--json", *rollout, "--dry-run", inventory=inv)
    assert r.exit_code == 0, r.output
    dry = json.loads(r.stdout)
    assert dry["plan"]["waves"] == [["lab2"], ["lab3"]] and "already on" in dry["plan"]["skipped"]["lab1"], dry

    # 3. the same command again: continues at lab2, which fails and rolls back; the rollout stops there
    r = cli("--json", *rollout, inventory=inv)
    assert r.exit_code == 7, r.output
    out = json.loads(r.stdout)
    validate_output("deploy-fleet", out)
    got = {p["pair"]: p for p in out["pairs"]}
    assert {p: got[p]["outcome"] for p in PAIRS} == {"lab1": "skipped", "lab2": "rolled-back", "lab3": "not-started"}
    assert got["lab2"]["packages"] == [broken.id, broken.id] and "--max-fail 1" in got["lab3"]["reason"]
    assert out["outcome"] == "failed" and out["plan"]["waves"] == [["lab2"], ["lab3"]]
    assert _active(cli, "lab1", inv) == [cand, cand]  # the earlier wave is kept
    assert _active(cli, "lab2", inv) == [base, base]  # rolled back, verified
    assert _active(cli, "lab3", inv) == [base, base]  # never started
    st2 = lab_status(cli, "lab2", inv)
    assert st2["health"] == "ok" and not st2["problems"], st2
    events = [json.loads(line) for line in log.read_text().splitlines()][2:]
    assert [(e["event"], e.get("pair")) for e in events] == [("deploy.rolled_back", "lab2"), ("fleet.finished", None)]
