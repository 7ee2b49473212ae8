"""Issue 7, end to end: the MMVF candidate package builds from the patch, and the packaged kernel
harness passes all six cases on the lab pair through RPC against the CPU reference, and fails
when a case's reference is perturbed on purpose. Real sshd hosts, real ggml-rpc-server and
harness from packages `pairctl build` made; the live pair keeps running throughout.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.build.patching import apply_patch_commit
from orchestrator.build.store import PackageStore
from orchestrator.config.kernels import load_cases, load_kernel
from orchestrator.evidence.store import EvidenceStore
from orchestrator.paths import KERNELS, Home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

from tests.plugins.packages import build_package  # noqa: E402
from tests.plugins.pairs import PAIR, lab_status  # noqa: E402

MMVF = KERNELS / "mmvf-warp-per-row"
HARNESS = "tests/bin/ggml-kernel-cases"
CASES = load_cases(MMVF).names()


def _check(cli, *args: str):
    r = cli("--json", "kernels", "check", "--pair", PAIR, *args)
    out = json.loads(r.stdout) if r.stdout.strip().startswith("{") else None
    return r, out


def _receipt(home: Path, sha: str):
    return EvidenceStore(Path(home) / "evidence").load(sha)


def _services(st) -> dict[str, object]:
    return {h: (v.get("running"), v.get("pid")) for h, v in st["hosts"].items()}


def test_package_carries_the_kernel_harness(lab_packages):
    assert HARNESS in lab_packages.manifest.files, (
        "pairctl build must add the kernel harness to the package's test files"
    )
    assert lab_packages.manifest.files[HARNESS].kind == "test"
    assert (lab_packages.path / HARNESS).is_file()


def _rpc_address(deployed_lab) -> str:
    """The lab's RPC host address (127.0.0.3 by default; a worker's own under xdist)."""
    inv = deployed_lab.inventory
    return inv.host(inv.pair(deployed_lab.pair).rpc).address


def test_cases_pass_through_rpc_against_the_cpu_reference(deployed_lab, cli):
    rpc = _rpc_address(deployed_lab)
    before = lab_status(cli)
    r, out = _check(cli)
    assert r.exit_code == 0, r.stderr + r.stdout
    assert out["passed"] and not out["problems"]
    for host in out["hosts"]:
        assert host["exit_status"] == 0 and host["package"] == deployed_lab.package_id
        rows = host["rows"]
        assert sorted(row["case"] for row in rows) == sorted(CASES)  # one non-CPU backend: the RPC device
        for row in rows:
            assert row["backend"].startswith("RPC") and row["backend"].endswith(f"[{rpc}:50053]"), row
            assert row["passed"] and row["nmse"] is not None and row["nmse"] <= 5e-4 and not row["perturbed"]
            assert row["us_per_run"] > 0 and row["runs"] >= 1
    # the second rpc-server ran on rpc_port + 1 bound to the RPC address, and was stopped
    assert out["plan"]["rpc_server"]["endpoint"] == f"{rpc}:50053"
    assert not _listening(rpc, 50053)
    # the live pair was never touched: same processes, still healthy
    after = lab_status(cli)
    assert _services(after) == _services(before) and after.get("health") == "ok"
    rec = _receipt(deployed_lab.home, out["receipt"])
    assert rec.outcome == "passed"
    names = {s.name for s in rec.steps}
    assert {
        "kernels.plan",
        "kernels.rpc_server.start",
        "kernels.harness.native",
        "kernels.harness.rpc",
        "kernels.rpc_server.stop",
    } <= names
    _, meta = load_kernel(MMVF)
    assert rec.inputs["patch"] == meta.patch_sha256


def _listening(address: str, port: int) -> bool:
    from orchestrator.hosts.probes import PROC_NET_TCP, parse_proc_net_tcp

    text = "".join(Path(p).read_text() for p in PROC_NET_TCP if Path(p).exists())
    return (address, port) in parse_proc_net_tcp(text)


def test_perturbed_reference_fails_exactly_that_case(deployed_lab, cli):
    r, out = _check(cli, "--perturb", "w4-kpad")
    assert r.exit_code == 1, r.stderr + r.stdout
    assert not out["passed"]
    for host in out["hosts"]:
        failed = {row["case"] for row in host["rows"] if not row["passed"]}
        assert failed == {"w4-kpad"}, host["rows"]
        bad = next(row for row in host["rows"] if row["case"] == "w4-kpad")
        assert bad["perturbed"] and bad["nmse"] > 5e-4
    assert "w4-kpad" in r.stderr and "receipt" in r.stderr
    assert _receipt(deployed_lab.home, out["receipt"]).outcome == "failed"
    assert not _listening(_rpc_address(deployed_lab), 50053)  # stopped after a failure too


def test_check_refuses_the_live_rpc_port(deployed_lab, cli):
    r, _ = _check(cli, "--port", "50052")
    assert r.exit_code == 3 and "rpc port" in r.stderr


def test_candidate_package_builds_from_the_patch(lab_source, pairctl_home):
    """`pairctl build --patch kernels/mmvf-warp-per-row`: an exact patched commit, built (CPU target)."""
    expected = apply_patch_commit(lab_source, "baseline", MMVF)  # reproducible: the build must land on this commit
    pkg = build_package(pairctl_home, "baseline", extra=("--patch", str(MMVF)))
    m = pkg.manifest
    assert m.revision == expected
    assert m.patch is not None and m.patch.sha256 == load_kernel(MMVF)[1].patch_sha256
    assert (
        m.patch.base_revision
        == subprocess.run(
            ["git", "-C", str(lab_source), "rev-parse", "baseline"], capture_output=True, text=True
        ).stdout.strip()
    )
    changed = subprocess.run(
        ["git", "-C", str(lab_source), "diff", "--name-only", "baseline", m.revision], capture_output=True, text=True
    ).stdout.split()
    assert changed == ["ggml/src/ggml-cuda/mmvf.cu"]
    assert PackageStore(Home.resolve(pairctl_home).store).verify(pkg.id).ok


def test_harness_built_against_the_package_build_tree_passes_and_can_fail(lab_packages, pairctl_home, tmp_path):
    """`build_harness` on the very build tree `pairctl build` used (no hand-made link line), run
    against the package's own ggml-rpc-server: the six cases pass, a perturbed one fails."""
    import fcntl
    import socket
    import time

    from orchestrator.build.harness import build_harness
    from orchestrator.config.targets import load_target

    work = Home.resolve(pairctl_home).build_cache / "work" / "cpu-lab"
    with open(work.parent / "cpu-lab.lock", "w") as lock:  # the builder's per-target lock: no build meanwhile
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            (harness,) = build_harness(work / "build", work / "src", tmp_path / "bin", load_target("cpu-lab"))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(lab_packages.path / "bin" / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        argv = [str(harness)] + [a for c in load_cases(MMVF).cases for a in ("--case", c.harness_spec())]
        argv += ["--rpc", f"127.0.0.1:{port}", "--no-local"]
        env = {"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"}
        ok = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        assert ok.returncode == 0, ok.stderr
        rows = [json.loads(line) for line in ok.stdout.splitlines()]
        assert rows[-1] == {"summary": True, "passed": 6, "failed": 0, "backends": 1, "cases": 6}
        bad = subprocess.run(argv + ["--perturb", "w4"], capture_output=True, text=True, timeout=600, env=env)
        assert bad.returncode == 1
        failed = [json.loads(line)["case"] for line in bad.stdout.splitlines()[:-1] if not json.loads(line)["passed"]]
        assert failed == ["w4"]
    finally:
        server.terminate()
        server.wait(timeout=10)


def _live_files(pair) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of what the check may write on the pair's hosts: bin/, secrets/, the route."""
    out = {}
    for root in pair.roots().values():
        for sub in ("bin", "secrets"):
            for f in Path(root, sub).rglob("*"):
                if f.is_file():
                    out[str(f)] = (f.stat().st_mtime_ns, f.stat().st_size)
        route = Path(root, "run", "route.json")
        out[str(route)] = (route.stat().st_mtime_ns, route.stat().st_size)
    return out


def test_a_check_on_its_own_refuses_a_pair_another_run_holds(deployed_lab, cli):
    """`kernels check` on its own wrote live files (the route key, the guard under bin/) without the
    pair's leases: beside a deploy of another operator (or home) it raced it. It holds the leases
    as accept does: with the real leases held on both lab hosts (over SSH) it is refused (exit 5,
    the holder named) and writes nothing; once they are free, it takes and releases them."""
    from orchestrator.hosts.leases import hold_pair_leases, targets_of
    from orchestrator.remote.pool import TransportPool

    inv = deployed_lab.inventory
    with TransportPool(inv) as pool:
        with hold_pair_leases(
            targets_of(inv, pool, PAIR), owner="other@operator", purpose="pairctl deploy lab (another home)", ttl_s=600
        ):
            before = _live_files(deployed_lab)
            r, _ = _check(cli)
            assert r.exit_code == 5, r.stderr + r.stdout
            assert "other@operator" in r.stderr, r.stderr
            assert _live_files(deployed_lab) == before
    r, out = _check(cli)
    assert r.exit_code == 0, r.stderr + r.stdout
    rec = _receipt(deployed_lab.home, out["receipt"])
    assert [s.name for s in rec.steps][:2] == ["lease", "kernels.plan"]
    # renewed while it runs and stale after two missed renewals: a killed check frees the pair in
    # minutes, not after the whole TTL
    lease = rec.steps[0].data
    assert 0 < lease["heartbeat_s"] and len(lease["leases"]) == 2, lease
    assert all(x["stale_after_s"] == int(2 * lease["heartbeat_s"]) for x in lease["leases"]), lease
    with TransportPool(inv) as pool, hold_pair_leases(targets_of(inv, pool, PAIR), owner="t", purpose="t", ttl_s=60):
        pass  # the check released both
