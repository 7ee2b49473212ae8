"""Issue 4, end to end: real sshd hosts, real llama-server + ggml-rpc-server from packages that
`pairctl build` made, deployed, verified, broken on purpose and rolled back.

Packages: `lab_packages` (baseline, "A") and `lab_packages_b` (revision lab-b, "B"); in the lab
one cpu-lab package serves both the native and the RPC host.

The pair under test is `lab` (manifests/inventories/lab.yaml, the `deployed_lab` pair) unless
PAIRCTL_DEPLOY_E2E_INVENTORY / PAIRCTL_DEPLOY_E2E_PAIR name another lab pair (e.g. lab3 / lab1),
so these tests, which deploy other packages, can run beside tests that use `deployed_lab`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.loader import read_yaml
from orchestrator.evidence.store import EvidenceStore
from orchestrator.hosts.leases import CLOCK_PROBE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

from tests.plugins.lab import lab_inventory_file  # noqa: E402
from tests.plugins.pairs import broken_binary, deploy_baseline, hooked_deploy, is_active, wait_paused  # noqa: E402
from tests.plugins.pairs import lab_status as _lab_status  # noqa: E402

INV = os.environ.get("PAIRCTL_DEPLOY_E2E_INVENTORY", "lab")
PAIR = os.environ.get("PAIRCTL_DEPLOY_E2E_PAIR", "lab")
INV_ARG = None if INV == "lab" else INV
# the lab's own file (a developer's second lab or an xdist worker's copy), else the bundled INV
INV_FILE = lab_inventory_file() if INV == "lab" else lab_inventory_file(INV)


def lab_status(cli) -> dict[str, Any]:
    return _lab_status(cli, PAIR, INV_ARG)


@dataclass(frozen=True)
class PairUnderTest:
    package_id: str
    home: Path
    inventory: Any
    native: str
    rpc: str

    def roots(self) -> dict[str, str]:
        return {
            "native": self.inventory.host(self.native).install_root,
            "rpc": self.inventory.host(self.rpc).install_root,
        }


@pytest.fixture
def deployed_lab(request, lab_packages, cli) -> PairUnderTest:
    """The baseline active and verified on the pair under test."""
    env = request.getfixturevalue("lab" if INV == "lab" else "lab3")
    deploy_baseline(cli, lab_packages.id, PAIR, INV_ARG)
    assert is_active(lab_status(cli), lab_packages.id)
    p = env.inventory.pair(PAIR)
    return PairUnderTest(lab_packages.id, env.home.root, env.inventory, p.native, p.rpc)


@pytest.fixture
def restore_baseline(lab_packages, cli):
    yield
    deploy_baseline(cli, lab_packages.id, PAIR, INV_ARG)


def _deploy(cli, *args: str, inventory: str | None = None):
    r = cli("--json", "deploy", "--pair", PAIR, *args, inventory=inventory or INV_ARG)
    out = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r, out


def _receipt(home: Path, sha: str):
    return EvidenceStore(Path(home) / "evidence").load(sha)


def _latest_receipt(home: Path):
    return EvidenceStore(Path(home) / "evidence").latest(PAIR)


def _host_links(st) -> dict[str, tuple[str | None, str | None]]:
    return {h: (v["current"], v["previous"]) for h, v in st["hosts"].items()}


def test_deploy_a_then_b_over_a_then_rollback(deployed_lab, lab_packages_b, cli, restore_baseline):
    a, b = deployed_lab.package_id, lab_packages_b.id
    assert a != b
    before = lab_status(cli)
    r, out = _deploy(cli, "--packages", b, b, "--skip-accept")
    assert r.exit_code == 0, r.stderr
    assert out["outcome"] == "passed" and out["active"]["native_package"] == b
    st = lab_status(cli)
    assert is_active(st, b), st
    for host, (cur, prev) in _host_links(st).items():
        assert (cur, prev) == (b, a), host  # A became previous
    assert st["route"]["revision"] == before["route"]["revision"] + 1
    assert st["route"]["previous"].startswith(f"{a} + {a}")
    rec = _receipt(deployed_lab.home, out["receipt"])
    assert rec.outcome == "passed"
    assert {s.name for s in rec.steps} >= {
        "preflight",
        "connect",
        "facts",
        "lease",
        "prepare",
        "upload",
        "stop-native",
        "restart-rpc",
        "switch-native",
        "start-server",
        "verify",
        "route",
        "release-lease",
    }
    assert all(s.outcome in ("passed", "skipped") for s in rec.steps)
    assert rec.inputs["package:native"] == b and "profile" in rec.inputs and "playbook:deploy" in rec.inputs
    assert {i.host for i in rec.identities} == {deployed_lab.native, deployed_lab.rpc}

    # pairctl rollback: A back, verified, route names A again, B is previous
    rb = cli("--json", "rollback", "--pair", PAIR, inventory=INV_ARG)
    assert rb.exit_code == 0, rb.stderr
    st2 = lab_status(cli)
    assert is_active(st2, a), st2
    assert all(links == (a, b) for links in _host_links(st2).values())
    assert st2["route"]["revision"] == st["route"]["revision"] + 1


def test_failed_deploy_restores_a(deployed_lab, lab_packages_b, cli, tmp_path, restore_baseline):
    a, b = deployed_lab.package_id, lab_packages_b.id
    before = lab_status(cli)
    # manifests/profiles/lab-unloadable.yaml: the lab route plus an --override-kv naming no architecture
    r, out = _deploy(cli, "--packages", b, b, "--profile", "lab-unloadable", "--skip-accept")
    assert r.exit_code == 7, (r.exit_code, r.stderr)
    assert "rolled back" in r.stderr and "start-server" in r.stderr
    assert "ggml-rpc-server.out ends" in r.stderr  # the RPC peer's output, where a crash there shows
    st = lab_status(cli)
    assert is_active(st, a), st  # A restored, verified (status compares running binaries to manifests) and serving
    assert all(
        links == before_links
        for links, before_links in zip(_host_links(st).values(), _host_links(before).values(), strict=True)
    )
    # the deploy failed before its route step, so the back-out leaves the record as it was (it
    # names A already; a read-only root could not take it again): issue 33
    assert st["route"]["revision"] == before["route"]["revision"]
    rec = _latest_receipt(deployed_lab.home)
    assert rec.outcome == "failed"
    steps = [(s.name, s.outcome) for s in rec.steps]
    assert ("start-server", "failed") in steps
    failed_at = steps.index(("start-server", "failed"))
    after = [n for n, o in steps[failed_at + 1 :] if o == "passed"]
    assert {"stop-native", "restart-rpc", "switch-native", "start-server", "verify", "route", "release-lease"} <= set(
        after
    )
    extra = rec.extra_fields()
    assert extra["failure"]["step"] == "start-server"
    assert extra["final_state"]["state"] == "restored" and extra["final_state"]["active"].startswith(a)
    for host, v in st["hosts"].items():
        assert v["leases"] == [], f"{host} still leased"


def test_second_deploy_refused_while_lease_held(deployed_lab, lab_packages_b, cli):
    from orchestrator.hosts.leases import release_lease, take_lease
    from orchestrator.remote.pool import TransportPool

    b = lab_packages_b.id
    before = lab_status(cli)
    root = deployed_lab.roots()["rpc"]
    with TransportPool(deployed_lab.inventory) as pool:
        t = pool.get(deployed_lab.rpc)
        lease = take_lease(t, root, "other-operator@elsewhere", "a concurrent deploy", 600)
        try:
            r, _ = _deploy(cli, "--packages", b, b, "--skip-accept")
            assert r.exit_code == 5, (r.exit_code, r.stderr)
            assert "other-operator@elsewhere" in r.stderr and "until" in r.stderr
            st = lab_status(cli)
            assert st["route"] == before["route"] and _host_links(st) == _host_links(before)
            assert is_active(st, deployed_lab.package_id)
            assert st["hosts"][deployed_lab.native]["leases"] == []  # our half of the pair was released
        finally:
            release_lease(t, root, lease.nonce)


def test_two_revisions_refused_before_any_host(deployed_lab, lab_packages_b, cli, tmp_path):
    a, b = deployed_lab.package_id, lab_packages_b.id
    # an inventory whose hosts cannot be reached: touching a host would fail with exit 4, not 6
    inv = read_yaml(INV_FILE)
    for h in inv["hosts"].values():
        h["port"] = 1
    path = tmp_path / "unreachable.yaml"
    path.write_text(json.dumps(inv))
    before = lab_status(cli)
    r, _ = _deploy(cli, "--packages", a, b, "--skip-accept", inventory=str(path))
    assert r.exit_code == 6, (r.exit_code, r.stderr)
    assert "two revisions" in r.stderr
    rec = _latest_receipt(deployed_lab.home)
    assert [s.name for s in rec.steps] == ["preflight"] and rec.outcome == "failed"
    assert lab_status(cli)["route"] == before["route"]


def test_changed_host_key_refused_before_any_host(deployed_lab, lab_packages_b, cli, tmp_path):
    b = lab_packages_b.id
    known = (deployed_lab.home / "lab" / "known_hosts").read_text().splitlines()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    fake = (tmp_path / "k.pub").read_text().split()[:2]
    rpc_addr = deployed_lab.inventory.host(deployed_lab.rpc).address
    changed = [(" ".join([line.split()[0], *fake]) if line.startswith(f"[{rpc_addr}]") else line) for line in known]
    assert changed != known
    (tmp_path / "known_hosts").write_text("\n".join(changed) + "\n")
    inv = read_yaml(INV_FILE)
    inv["known_hosts"] = str(tmp_path / "known_hosts")
    path = tmp_path / "badkey.yaml"
    path.write_text(json.dumps(inv))
    before = lab_status(cli)
    r, _ = _deploy(cli, "--packages", b, b, "--skip-accept", inventory=str(path))
    assert r.exit_code == 4, (r.exit_code, r.stderr)
    assert "SHA256:" in r.stderr  # the fingerprint the host presented
    st = lab_status(cli)
    assert st["route"] == before["route"] and _host_links(st) == _host_links(before)
    assert all(v["leases"] == [] for v in st["hosts"].values())
    rec = _latest_receipt(deployed_lab.home)
    assert "lease" not in [s.name for s in rec.steps]


def test_dry_run_prints_every_step_and_changes_nothing(deployed_lab, lab_packages_b, cli):
    b = lab_packages_b.id
    before = lab_status(cli)
    r = cli("deploy", "--pair", PAIR, "--packages", b, b, "--dry-run", inventory=INV_ARG)
    assert r.exit_code == 0, r.stderr
    for name in ("lease", "upload", "stop-native", "restart-rpc", "switch-native", "start-server", "verify", "route"):
        assert name in r.stdout
    rpc_bind = deployed_lab.inventory.rpc_bind(PAIR)
    assert deployed_lab.native in r.stdout and deployed_lab.rpc in r.stdout and f"-H {rpc_bind}" in r.stdout
    st = lab_status(cli)
    assert st["route"] == before["route"] and _host_links(st) == _host_links(before)
    assert [h["releases"] for h in st["hosts"].values()] == [h["releases"] for h in before["hosts"].values()]


def _release_kept_leases(pt: PairUnderTest) -> None:
    """A failed rollback keeps the leases; the test (as the operator would) releases them by nonce."""
    from orchestrator.hosts.leases import LEASE_FILE, LEASES_DIR, LOCK_DIR, release_lease
    from orchestrator.remote.pool import TransportPool

    with TransportPool(pt.inventory) as pool:
        for h in (pt.native, pt.rpc):
            root = pt.inventory.host(h).install_root
            lease = Path(root) / LEASES_DIR / LOCK_DIR / LEASE_FILE
            if lease.exists():
                release_lease(pool.get(h), root, json.loads(lease.read_text())["nonce"])


def test_failed_rollback_leaves_hosts_stopped_and_leases_kept(
    deployed_lab, lab_packages_b, cli, tmp_path, restore_baseline
):
    """The pair to restore cannot start either (its llama-server binary on the native host was
    replaced by one that exits at once; the running process keeps its own inode, and a rollback
    renders argv from the inventory now, so a vanished model file of the old argv no longer
    breaks it): exit 8, nothing runs, both leases are still held, and the message says where
    to look."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    binary = Path(deployed_lab.roots()["native"]) / "releases" / a / "bin" / "llama-server"
    try:
        with broken_binary(binary, tmp_path):
            r, _ = _deploy(cli, "--packages", b, b, "--profile", "lab-unloadable", "--skip-accept")
            assert r.exit_code == 8, (r.exit_code, r.stderr)
            assert "rollback failed" in r.stderr and "leases are kept" in r.stderr and "run/" in r.stderr
            st = lab_status(cli)
            assert all(not v["running"] for v in st["hosts"].values()), st  # stopped, not half-running
            assert all(v["leases"] and v["leases"][0]["state"] == "held" for v in st["hosts"].values())
            rec = _latest_receipt(deployed_lab.home)
            assert rec.outcome == "failed" and rec.extra_fields()["final_state"]["state"] == "stopped (rollback failed)"
            again, _ = _deploy(cli, "--packages", a, a, "--skip-accept")
            assert again.exit_code == 5  # nobody deploys onto the unknown state while the leases are kept
    finally:
        _release_kept_leases(deployed_lab)


def test_deploy_runs_the_acceptance_suite(deployed_lab, lab_packages_b, cli, restore_baseline):
    """Without --skip-accept, deploy's accept step runs orchestrator.checks.suite (here only its
    identity check, which compares verify_identity before and after the suite)."""
    b = lab_packages_b.id
    r, out = _deploy(cli, "--packages", b, b, "--checks", "identity")
    assert r.exit_code == 0, r.stderr
    rec = _receipt(deployed_lab.home, out["receipt"])
    steps = {s.name: s for s in rec.steps}
    assert steps["accept"].outcome == "passed" and steps["accept"].data["checks"] == ["identity"]
    assert steps["check:identity"].outcome == "passed"
    assert rec.extra_fields()["acceptance"]["passed"] is True


def test_dead_run_lease_released_only_once_the_run_is_over(deployed_lab, cli, lab_packages_b, tmp_path):
    """A deploy killed after taking its leases leaves them with no nonce anyone has.
    `lease release --dead-run` refuses while the run lives (and for an unknown run), and frees
    both hosts once the evidence proves it over; `status` names the stale leases meanwhile."""
    import signal

    from orchestrator.hosts.leases import parse_run_of

    a, b = deployed_lab.package_id, lab_packages_b.id
    child = hooked_deploy(Path(deployed_lab.home), b, "upload:pause", tmp_path, inventory=INV_ARG)
    try:
        wait_paused(child, tmp_path, "upload")
        shown = json.loads(cli("--json", "lease", "show", PAIR, inventory=INV_ARG).stdout)
        runs = {parse_run_of(s["lease"]["purpose"]) for s in shown}
        assert len(shown) == 2 and len(runs) == 1 and None not in runs, shown
        run_id = runs.pop()

        live = cli("lease", "release", PAIR, "--dead-run", run_id, inventory=INV_ARG)
        assert live.exit_code == 5 and "not proven over" in live.stderr and "is running" in live.stderr, live.output
        unknown = cli("lease", "release", PAIR, "--dead-run", "20990101T000000Z-1-abcdef", inventory=INV_ARG)
        assert unknown.exit_code == 5 and "no run 20990101T000000Z-1-abcdef" in unknown.stderr, unknown.output
        both = cli("lease", "release", PAIR, "--dead-run", run_id, "--nonce", "0" * 32, inventory=INV_ARG)
        assert both.exit_code == 2 and "exactly one of --nonce or --dead-run" in both.output
        still = json.loads(cli("--json", "lease", "show", PAIR, inventory=INV_ARG).stdout)
        assert [s["state"] for s in still] == ["held", "held"]  # nothing changed on any host
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)

    st = lab_status(cli)  # seals the killed run as aborted, names what it left
    # killed before upload: the pair is untouched; the leases it left are the one problem (issue
    # 33: they keep the hosts' supervisors passive, so status exits 1 and names the release)
    held = [p for p in st["problems"] if "--dead-run" in p]
    assert len(held) == 2 and is_active({**st, "problems": [p for p in st["problems"] if p not in held]}, a), st
    assert sorted(s["host"] for s in st["stale_leases"]) == sorted([deployed_lab.native, deployed_lab.rpc])
    assert {s["run_id"] for s in st["stale_leases"]} == {run_id}
    human = cli("status", "--pair", PAIR, inventory=INV_ARG)
    assert f"--dead-run {run_id}" in human.stdout, human.output

    r = cli("--json", "lease", "release", PAIR, "--dead-run", run_id, inventory=INV_ARG)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["run"]["state"] == "ended" and "aborted" in out["run"]["why"]
    assert sorted(x["host"] for x in out["released"]) == sorted([deployed_lab.native, deployed_lab.rpc])
    assert [s["state"] for s in out["after"]] == ["free", "free"]
    rec = EvidenceStore(Path(deployed_lab.home) / "evidence").load(out["receipt"])
    assert rec.command == "lease release" and rec.outcome == "passed"
    assert not lab_status(cli)["stale_leases"]
    again = cli("lease", "release", PAIR, "--dead-run", run_id, inventory=INV_ARG)
    assert again.exit_code != 0 and "holds no lease" in again.stderr


def test_status_verify_files_sees_a_changed_file_the_process_hashes_cannot(deployed_lab, cli):
    """The running binaries can match their manifests while another file of the release (the
    kernel harness here; a shared library alike) has changed on disk: only --verify-files sees it."""
    root = Path(deployed_lab.roots()["rpc"]) / "run" / "current"
    victim = root / "tests" / "bin" / "ggml-kernel-cases"
    st = json.loads(cli("--json", "status", "--pair", PAIR, "--verify-files", inventory=INV_ARG).stdout)
    assert not st["problems"], st["problems"]
    assert all(h["release_files"]["verified"] is True and h["release_files"]["files"] > 3 for h in st["hosts"].values())
    mode = victim.stat().st_mode
    original = victim.read_bytes()
    victim.chmod(mode | 0o200)
    try:
        victim.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
        plain = cli("--json", "status", "--pair", PAIR, inventory=INV_ARG)
        assert plain.exit_code == 0 and not json.loads(plain.stdout)["problems"]  # the blind spot
        deep = cli("--json", "status", "--pair", PAIR, "--verify-files", inventory=INV_ARG)
        assert deep.exit_code == 1
        problems = json.loads(deep.stdout)["problems"]
        assert any(deployed_lab.rpc in p and "tests/bin/ggml-kernel-cases" in p for p in problems), problems
    finally:
        victim.write_bytes(original)
        victim.chmod(mode)
    human = cli("status", "--pair", PAIR, "--verify-files", inventory=INV_ARG)
    assert human.exit_code == 0 and "files of" in human.stdout and "match its manifest" in human.stdout


def test_model_files_are_hashed_and_a_wrong_declared_model_is_refused(
    deployed_lab, lab_packages_b, cli, tmp_path, restore_baseline
):
    """The weights are part of what serves: deploy hashes each inventory model file on the native
    host (cached there by stat) into the route entry, and a file whose sha256 is not the one the
    inventory declares refuses the deploy with nothing changed (exit 6)."""
    from orchestrator.hashing import sha256_file

    a, b = deployed_lab.package_id, lab_packages_b.id
    models = deployed_lab.inventory.pair(PAIR).models
    want = {name: sha256_file(m.path) for name, m in models.items()}  # the lab's hosts share this disk
    inv = read_yaml(INV_FILE)
    inv["pairs"][PAIR]["models"]["target"]["sha256"] = want["target"]
    good = tmp_path / "declared.yaml"
    good.write_text(json.dumps(inv))
    r, out = _deploy(cli, "--packages", b, b, "--skip-accept", inventory=str(good))
    assert r.exit_code == 0, r.stderr
    route = json.loads((Path(deployed_lab.roots()["native"]) / "run" / "route.json").read_text())
    assert route["active"]["models"] == want
    prepared = next(s for s in out["steps"] if s["name"] == "prepare")
    assert prepared["ok"]

    inv["pairs"][PAIR]["models"]["draft_perturbed"]["sha256"] = "0" * 64  # the lab profile's draft
    bad = tmp_path / "wrong-model.yaml"
    bad.write_text(json.dumps(inv))
    before = lab_status(cli)
    r, _ = _deploy(cli, "--packages", a, a, "--skip-accept", inventory=str(bad))
    assert r.exit_code == 6, (r.exit_code, r.stderr)
    assert (
        "model draft_perturbed" in r.stderr
        and "the inventory declares " + "0" * 64 in r.stderr
        and "nothing was changed" in r.stderr
    )
    st = lab_status(cli)
    assert st["route"] == before["route"] and _host_links(st) == _host_links(before) and is_active(st, b)
    assert all(v["leases"] == [] for v in st["hosts"].values())

    # status and acceptance's identity re-hash the model files against the route entry: a file
    # replaced under the running server (it keeps its mapped inode) is seen, and then fine again
    st = json.loads(cli("--json", "status", "--pair", PAIR, inventory=INV_ARG).stdout)
    assert st["route"]["models"] == want and st["route"]["models_verified"] is True and not st["problems"], st
    target = Path(models["target"].path)
    keep = target.with_name(target.name + ".keep")
    os.rename(target, keep)
    try:
        data = bytearray(keep.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
        r = cli("--json", "status", "--pair", PAIR, inventory=INV_ARG)
        problems = json.loads(r.stdout)["problems"]
        assert r.exit_code == 1 and any(
            "model target" in p and "changed since it was deployed" in p for p in problems
        ), problems
        acc = cli("--json", "accept", "--pair", PAIR, "--only", "identity", inventory=INV_ARG)
        assert acc.exit_code == 1 and "changed since it was deployed" in acc.stdout, acc.output
    finally:
        os.replace(keep, target)
    r = cli("--json", "status", "--pair", PAIR, inventory=INV_ARG)
    assert r.exit_code == 0 and json.loads(r.stdout)["route"]["models_verified"] is True, r.output


def _to_older_layout(deployed_lab) -> None:
    """The lab's roots as a pairctl before run/ left them: links (relative), route.json, leases/ in the root."""
    for root in map(Path, deployed_lab.roots().values()):
        run = root / "run"
        for name in ("current", "previous"):
            if (run / name).is_symlink():
                os.symlink("releases/" + os.readlink(run / name).rsplit("/", 1)[-1], root / name)
                (run / name).unlink()
        os.replace(run / "route.json", root / "route.json")
        (root / "leases").unlink()
        (root / "leases").mkdir(mode=0o700)


def test_an_older_layout_is_found_by_a_leased_command(deployed_lab, cli):
    """A command that holds the pair's leases (accept, releases prune, receipts prune) reads the
    links and the route record in run/ only: on a host still in the older layout, the lease it
    takes moves that layout there first, so accept finds the pair deployed (not exit 6)."""
    _to_older_layout(deployed_lab)
    acc = cli("--json", "accept", "--pair", PAIR, "--only", "identity", inventory=INV_ARG)
    assert acc.exit_code == 0, acc.output
    for root in map(Path, deployed_lab.roots().values()):
        assert os.readlink(root / "leases") == "run/leases" and (root / "run" / "route.json").exists()
        assert not os.path.lexists(root / "current") and (root / "run" / "current").is_symlink()


def test_an_older_layout_is_moved_into_run_by_the_next_deploy(deployed_lab, lab_packages_b, cli, restore_baseline):
    """Issue 49: hosts deployed before current/previous, route.json and leases/ moved into run/ (the
    state dir) keep them in the root itself. status still reads them there; the next deploy moves
    them under its lease (links re-pointed at absolute release paths, the record's bytes kept,
    leases/ made a link to run/leases) and leaves nothing set aside in the root."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    _to_older_layout(deployed_lab)
    record = (Path(deployed_lab.roots()["native"]) / "route.json").read_bytes()
    st = lab_status(cli)
    assert is_active(st, a) and not st["problems"], st
    r, out = _deploy(cli, "--packages", b, b, "--skip-accept")
    assert r.exit_code == 0, r.stderr
    st = lab_status(cli)
    assert is_active(st, b) and all(links == (b, a) for links in _host_links(st).values()), st
    assert st["route"]["revision"] == json.loads(record)["revision"] + 1
    for root in map(Path, deployed_lab.roots().values()):
        assert sorted(os.listdir(root)) == ["bin", "leases", "releases", "run", "secrets"], os.listdir(root)
        # no lease left held; a clock probe (leases.CLOCK_PROBE) a run killed earlier in the session
        # left behind is not one (the first clean-clone rehearsal found one there)
        held = [n for n in os.listdir(root / "leases") if not n.startswith(CLOCK_PROBE)]
        assert os.readlink(root / "leases") == "run/leases" and not held, held
        assert os.readlink(root / "run" / "current") == str(root / "releases" / b)


def test_recovery_runs_where_the_state_dir_cannot_be_made(deployed_lab, lab_packages_b, cli, restore_baseline):
    """Only a deploy refuses a host whose ROOT.state cannot be made (issue 49): a rollback and a
    stop there still run, with run/ the directory it was inside the root. The roots' parents made
    really unwritable (chattr +i: EPERM even for the lab's root login), run/ a directory in the
    root with ROOT.state gone, and the older layout, so the lease step moves it (install_helper)."""
    a, b = deployed_lab.package_id, lab_packages_b.id
    r, _ = _deploy(cli, "--packages", b, b, "--skip-accept")
    assert r.exit_code == 0, r.stderr
    roots = list(map(Path, deployed_lab.roots().values()))
    _to_older_layout(deployed_lab)
    for root in roots:
        state = Path(str(root) + ".state")
        (root / "run").unlink()
        shutil.copytree(state, root / "run", symlinks=True)
        shutil.rmtree(state)
    parents = [str(root.parent) for root in roots]
    if not shutil.which("chattr"):
        pytest.skip("no chattr on this machine (e2fsprogs)")
    made = subprocess.run(["chattr", "+i", *parents], capture_output=True, text=True)
    if made.returncode != 0:  # a filesystem without the immutable flag (tmpfs, some overlays)
        subprocess.run(["chattr", "-i", *parents], capture_output=True)
        pytest.skip(f"chattr +i refused here: {made.stderr.strip()}")
    try:
        rb = cli("--json", "rollback", "--pair", PAIR, inventory=INV_ARG)
        assert rb.exit_code == 0, rb.output
        assert is_active(lab_status(cli), a)
        _to_older_layout(deployed_lab)  # the lease step moves it again under stop's lease
        st = cli("--json", "stop", "--pair", PAIR, inventory=INV_ARG)
        assert st.exit_code == 0, st.output
        for root in roots:
            run = root / "run"
            assert run.is_dir() and not run.is_symlink() and not os.path.lexists(f"{root}.state")
        dep, _ = _deploy(cli, "--packages", a, a, "--skip-accept")  # a deploy is refused, naming state_dir
        assert dep.exit_code == 6 and "cannot be made" in dep.stderr and "state_dir" in dep.stderr, dep.output
    finally:
        subprocess.run(["chattr", "-i", *parents], check=True)


def _read_only_parents(roots: list[Path]) -> list[str]:
    """Each root's parent made a read-only mount, as a disk remounted after an error would be (a
    bind mount over it, remounted ro: EROFS even for the lab's root login), with the root itself
    bound read-write beneath it first, so it still takes its lease. The mount points made, in the
    order _unmount takes them off (a read-only parent of sshd's own log refuses every connection)."""
    made: list[str] = []
    try:
        for root in roots:
            for rw in (root, *root.parent.glob("*.log")):  # and the host's sshd.log, which sshd opens per connection
                subprocess.run(["mount", "--bind", str(rw), str(rw)], check=True)
                made.insert(0, str(rw))
            subprocess.run(["mount", "--rbind", str(root.parent), str(root.parent)], check=True)
            made.insert(0, str(root.parent))
            subprocess.run(["mount", "-o", "remount,bind,ro", str(root.parent)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        _unmount(made)
        pytest.skip(f"no read-only bind mount here: {exc}")
    return made


def _unmount(points: list[str]) -> None:
    for point in points:  # lazily: a service may hold a file or its cwd under it
        subprocess.run(["umount", "-l", point], check=True)


def _host_tree(root: Path) -> dict[str, str]:
    """What a deploy writes on a host, by path: links by target, files by their bytes (the logs the
    services write meanwhile by name only), releases by name; and the root's parent by name."""
    seen = {f"../{n}": "" for n in os.listdir(root.parent) if n.startswith(root.name)}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        for n in [*dirs, *files]:
            p = Path(d) / n
            key = os.path.join(rel, n)
            if p.is_symlink():
                seen[key] = "-> " + os.readlink(p)
            elif p.is_dir():
                seen[key] = "dir"
            else:
                logs = n.endswith((".log", ".out", ".prev"))
                seen[key] = "file" if logs else p.read_bytes().hex()
        if rel == "releases":
            dirs.clear()
    return seen


def _refusal(stderr: str) -> list[str]:
    """The refusal's line and its hint's."""
    return [ln for ln in stderr.splitlines() if "cannot be made" in ln or "state_dir to it" in ln]


def test_a_dry_run_refuses_where_the_state_dir_cannot_be_made(deployed_lab, cli):
    """Issue 49: `deploy --dry-run` printed a plan (exit 0) for a host whose ROOT.state cannot be
    made, which the real deploy refuses (exit 6). Now the dry run decides it from what it reads
    over SFTP (the parent's mount is read-only), refuses with the real deploy's message and exit
    code, and changes nothing on either host. run/ is a directory in the root with ROOT.state gone
    (what a rollback leaves where the state dir could not be made). Once the parent is writable
    again the dry run prints its plan and the deploy makes ROOT.state."""
    a = deployed_lab.package_id
    roots = list(map(Path, deployed_lab.roots().values()))
    for root in roots:
        state = Path(str(root) + ".state")
        if (root / "run").is_symlink():  # else an earlier run of this test left it so
            (root / "run").unlink()
            shutil.copytree(state, root / "run", symlinks=True)
            shutil.rmtree(state)
    before = {str(root): _host_tree(root) for root in roots}
    mounts = _read_only_parents(roots)
    try:
        dry = cli("deploy", "--pair", PAIR, "--packages", a, a, "--skip-accept", "--dry-run", inventory=INV_ARG)
        assert {str(root): _host_tree(root) for root in roots} == before  # nothing written by the dry run
        dep, _ = _deploy(cli, "--packages", a, a, "--skip-accept")
    finally:
        _unmount(mounts)
    said = _refusal(dry.stderr)
    native = f"{deployed_lab.native}: {roots[0]}.state cannot be made (Read-only file system)"
    rpc = f"; {deployed_lab.rpc}: {roots[1]}.state cannot be made (Read-only file system)"
    assert dry.exit_code == 6 and len(said) == 2 and native in said[0] and rpc in said[0], dry.output  # both hosts
    assert f"hosts.{deployed_lab.native}.state_dir" in said[1] and "install -d -o USER -m 0700" in said[1]
    assert f"hosts.{deployed_lab.rpc}.state_dir" in said[1]
    assert dep.exit_code == 6 and _refusal(dep.stderr) == said, dep.output  # the real deploy's own words
    st = lab_status(cli)  # the real deploy refused before any change: no lease held, the pair as it was
    assert is_active(st, a) and all(v["leases"] == [] for v in st["hosts"].values()), st
    dry = cli("deploy", "--pair", PAIR, "--packages", a, a, "--skip-accept", "--dry-run", inventory=INV_ARG)
    assert dry.exit_code == 0 and "upload" in dry.stdout, dry.output  # a writable parent: as before
    assert {str(root): _host_tree(root) for root in roots} == before
    dep, _ = _deploy(cli, "--packages", a, a, "--skip-accept")
    assert dep.exit_code == 0, dep.stderr
    for root in roots:
        assert os.readlink(root / "run") == f"{root}.state" and Path(f"{root}.state").is_dir()
