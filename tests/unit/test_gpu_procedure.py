"""The GPU procedure (benchmarks/gpu: carry.py, run.sh, report.py) where no GPU is needed: what a call
carries fits its 64 MiB, each mutant is judged by the check tests/mutants names, a call on a machine
without the earlier calls' state stops with its reason, and the report names the card it ran on and
leaves out phases that did not run (issue 43)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks/gpu"
MIB = 1 << 20


def module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_model_parts_fill_the_calls_evenly_within_the_limit() -> None:
    carry = module("carry")
    fixed, repo, total = [27 * MIB, 4096, 4096], int(4.6 * MIB), 92_871_040
    parts = carry.split_sizes(total, fixed, repo)
    assert sum(parts) == total and len(parts) == 3
    sent = [f + p + repo for f, p in zip(fixed, parts, strict=True)]
    assert max(sent) <= carry.CALL_LIMIT - carry.MARGIN
    assert max(sent) - min(sent) <= 3  # as even as the calls allow
    with pytest.raises(SystemExit, match="do not fit 2 calls"):
        carry.split_sizes(total, [27 * MIB, 0], repo)


def _mutant_checks() -> dict[str, str]:
    tree = ast.parse((ROOT / "tests/mutants/test_mutants.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "MUTANTS")
    assert node.value is not None
    return dict(ast.literal_eval(node.value))


def test_run_sh_judges_each_mutant_by_the_check_tests_mutants_names() -> None:
    text = (GPU / "run.sh").read_text()
    default = re.search(r"^MUTANTS=\$\{GPU_MUTANTS:-([^}]*)\}", text, re.M)
    assert default
    names = default.group(1).split()
    table = dict(re.findall(r"([a-z0-9-]+)\) echo ([a-z_]+) ;;", text))
    want = _mutant_checks()
    assert names and set(names) <= set(table)
    for name, check in table.items():
        assert want[name] == check, name
        assert (ROOT / "tests/mutants" / name / "patch.diff").is_file()


def test_run_sh_parses() -> None:
    for script in ("run.sh", "ccache"):
        subprocess.run(["bash", "-n", str(GPU / script)], check=True)


def _run(tmp: Path, call: str, carried: Path) -> tuple[int, list[str]]:
    env = {**os.environ, "GPU_STATE": str(tmp / "state"), "OUT": str(tmp / "out"), "GPU_CARRIED": str(carried)}
    proc = subprocess.run(["bash", str(GPU / "run.sh"), call], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    steps = (tmp / "state/raw/steps.log").read_text().splitlines()
    assert (tmp / "out/steps.log").is_file() and (tmp / "out/raw.tgz").is_file()  # what comes back, even then
    return proc.returncode, steps


@pytest.mark.parametrize("call", ["call2", "call3"])
def test_a_call_on_a_fresh_machine_stops_and_says_to_start_again(tmp_path: Path, call: str) -> None:
    rc, steps = _run(tmp_path, call, tmp_path / "carried")
    assert rc == 1
    assert steps[-1].endswith("STOP: run call 1 again, then call 2 and call 3, each within 30 s of the last one's end")


def test_call1_stops_on_a_missing_or_damaged_carry(tmp_path: Path) -> None:
    rc, steps = _run(tmp_path, "call1", tmp_path / "carried")
    assert rc == 1 and "STOP: nothing carried at .gpu/c1" in steps[-1]
    c1 = tmp_path / "carried/c1"
    c1.mkdir(parents=True)
    (c1 / "tree.tar.xz").write_bytes(b"x")
    (c1 / "SHA256SUMS").write_text("0" * 64 + "  tree.tar.xz\n")
    rc, steps = _run(tmp_path, "call1", tmp_path / "carried")
    assert rc == 1 and "STOP: .gpu/c1 does not match its SHA256SUMS" in steps[-1]


def test_mutant_verdict_and_active_status(tmp_path: Path) -> None:
    carry = module("carry")
    dep, rec = tmp_path / "deploy.json", tmp_path / "receipt.json"
    dep.write_text(json.dumps({"error": {"exit_code": 7, "receipt": "ab"}}))
    steps = [{"name": "accept", "outcome": "failed"}, {"name": "check:cancellation", "outcome": "failed"}]
    rec.write_text(json.dumps({"steps": steps, "final_state": {"state": "restored"}}))
    assert carry.verdict(dep, rec, "cancellation") == 0
    assert carry.verdict(dep, rec, "cached_continuation") == 2  # rejected, but not by the check meant
    st = tmp_path / "status.json"
    st.write_text(json.dumps({"problems": [], "health": "ok", "route": {"active_packages": ["b", "b"]}}))
    assert carry.active(st, "b") == 0 and carry.active(st, "m") == 1


def test_report_names_the_card_and_leaves_out_what_did_not_run(tmp_path: Path) -> None:
    report = module("report")
    old = tmp_path / "old"
    old.mkdir()
    with tarfile.open(ROOT / "docs/gpu-validation-raw.tgz") as tf:
        tf.extractall(old, filter="data")
    out = tmp_path / "old.md"
    report.main(out, report.Raw(sorted(p for p in old.iterdir() if p.is_dir())))
    text = out.read_text()
    assert text.startswith("# GPU validation on NVIDIA H200\n")
    assert "## GPU pair on one machine" in text and "baseline, candidate, mutants" not in text

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 9.0\n")
    (raw / "nvidia-smi.txt").write_text("| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |\n")
    (raw / "nvcc.txt").write_text("Cuda compilation tools, release 13.0, V13.0.88\n")
    (raw / "steps.log").write_text(
        "[2026-12-06T16:00:00Z] build base: start\n[2026-12-06T16:03:27Z] build base: ok\n"
        "[2026-12-06T16:03:30Z] build cache-off: start\n"
    )
    (raw / "build-base.err").write_text("rc=0 seconds=207.00\n")
    (raw / "build-base.pkg").write_text("gpu-9d37488533-h200\n")
    (raw / "build-cache-off.err").write_text("[12/300] compiling\n")
    (raw / "deploy-base.err").write_text("rc=0 seconds=30.5\n")
    checks = [{"name": "identity", "verdict": "passed", "duration_s": 0.4},
              {"name": "two_lane_near_full", "verdict": "passed", "duration_s": 1.5}]  # fmt: skip
    (raw / "accept-1.out").write_text(json.dumps({"checks": checks}))
    (raw / "accept-1.err").write_text("rc=0 seconds=8.1\n")
    (raw / "deploy-base-native-llama-server.log").write_text(
        "load_tensors:        CUDA0 model buffer size =    58.31 MiB\n"
        "llama_kv_cache: RPC0[127.0.0.1:50052] KV buffer size =     9.00 MiB\n"
    )
    out = tmp_path / "new.md"
    report.main(out, report.Raw([raw]), None)
    text = out.read_text()
    assert text.startswith("# GPU validation on NVIDIA H100 80GB HBM3\n")
    assert "driver 580.159.04, CUDA 13.0 (driver)" in text
    assert "| base | – | 0 | 207.0 |" in text and "| cache-off | tests/mutants/cache-off | still building |" in text
    assert "| two_lane_near_full | passed 1.5 s |" in text
    assert "| CUDA0 | 58.31 | 0.00 | 0.00 | 58.31 |" in text
    for absent in (
        "\n## Builds (`pairctl build",
        "MMVF candidate",
        "### Mutants",
        "## GPU pair on one",
        "H200",
        "– s.",
    ):
        assert absent not in text, absent


FAKE_PAIRCTL = r"""
import json, sys
from pathlib import Path
state = Path(sys.argv[1]); args = sys.argv[2:]
s = json.loads(state.read_text()) if state.exists() else {"active": None, "previous": None, "calls": []}
cmd = [a for a in args if not a.startswith("-")]
words = [a for a in args[4:] if a != "--json"]  # after --config DIR --inventory NAME
s["calls"].append(" ".join(words))
rc, out = 0, {}
if words[:1] == ["deploy"]:
    pkg = words[words.index("--packages") + 1]
    check = words[words.index("--checks") + 1] if "--checks" in words else None
    if pkg.startswith("mut-") and pkg not in s.get("accept_mutants", []):
        s["last_check"] = check
        rc, out = 7, {"error": {"exit_code": 7, "receipt": "r-" + pkg}}
    else:
        s["previous"], s["active"] = s["active"], pkg
        out = {"receipt": "r-" + pkg, "outcome": "passed"}
elif words[:1] == ["accept"]:
    n = sum(c.startswith("accept") for c in s["calls"])
    rc = 1 if n in s.get("fail_accepts", []) else 0
    out = {"passed": rc == 0, "checks": [{"name": "identity", "verdict": "passed" if rc == 0 else "failed",
                                          "duration_s": 0.1}]}
elif words[:1] == ["rollback"]:
    s["active"], s["previous"] = s["previous"], s["active"]
elif words[:2] == ["receipts", "show"]:
    out = {"steps": [{"name": "check:" + s["last_check"], "outcome": "failed"}], "final_state": {"state": "restored"}}
elif words[:1] == ["status"]:
    out = {"problems": [], "health": "ok", "route": {"active_packages": [s["active"]] * 2}}
state.write_text(json.dumps(s))
print(json.dumps(out))
if rc:
    print("pairctl: error: cause: fake failure", file=sys.stderr)
sys.exit(rc)
"""


def _call3(tmp: Path, **fake: object) -> tuple[int, list[str], dict]:
    """call3 on a machine where call 1 ran and every package is built, with pairctl replaced by a fake
    that deploys, accepts, rejects each mutant by the check it is given, and rolls back."""
    state = tmp / "state"
    raw = state / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for marker in ("call1.ok", "model.ok"):
        (state / marker).touch()
    text = (GPU / "run.sh").read_text()
    names = re.search(r"^MUTANTS=\$\{GPU_MUTANTS:-([^}]*)\}", text, re.M).group(1).split()  # type: ignore[union-attr]
    for n in ["base", "sm90", *names]:
        (raw / f"build-{n}.ok").write_text("rc=0 seconds=1\n")
        (raw / f"build-{n}.pkg").write_text(("pkg-" if n in ("base", "sm90") else "mut-") + n + "\n")
    (tmp / "fake.py").write_text(FAKE_PAIRCTL)
    fake_state = tmp / "fake.json"
    if not fake_state.exists():
        fake_state.write_text(json.dumps({"active": None, "previous": None, "calls": [], **fake}))
    env = {**os.environ, "GPU_STATE": str(state), "OUT": str(tmp / "out"), "GPU_CARRIED": str(tmp / "none"),
           "GPU_PAIRCTL": f"{os.sys.executable} {tmp / 'fake.py'} {fake_state}"}  # fmt: skip
    proc = subprocess.run(["bash", str(GPU / "run.sh"), "call3"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return proc.returncode, (raw / "steps.log").read_text().splitlines(), json.loads(fake_state.read_text())


def test_call3_judges_baseline_candidate_and_mutants_in_order_and_resumes_idempotently(tmp_path: Path) -> None:
    rc, steps, fake = _call3(tmp_path)
    assert rc == 0, steps[-5:]
    assert steps[-1].split("] ", 1)[1].startswith("ALL DONE") and "rejected as meant: 6 of 6" in steps[-1]
    calls = [c for c in fake["calls"] if c.startswith(("deploy", "accept", "rollback"))]
    assert calls[0] == "deploy --pair gpu --packages pkg-base pkg-base"  # the whole suite: no --checks
    assert calls[1:4] == ["accept --pair gpu"] * 3
    assert "deploy --pair gpu --packages pkg-sm90 pkg-sm90" in calls and "rollback --pair gpu" in calls
    assert "deploy --pair gpu --packages mut-lane-bleed mut-lane-bleed --checks two_lane_near_full" in calls
    assert fake["active"] == "pkg-base"
    rc, steps, fake2 = _call3(tmp_path)  # again on the same machine: nothing is deployed twice
    assert rc == 0 and not [c for c in fake2["calls"][len(fake["calls"]) :] if c.startswith(("deploy", "accept"))]


def test_call3_stops_when_the_baseline_is_not_accepted_three_times_in_a_row(tmp_path: Path) -> None:
    rc, steps, fake = _call3(tmp_path, fail_accepts=[2])
    assert rc == 1 and steps[-1].endswith("STOP: the baseline was not accepted three times in a row")
    assert not any("sm90" in c or "mut-" in c for c in fake["calls"])  # nothing after the failed step


def test_a_mutant_accepted_is_a_finding_the_baseline_is_put_back_and_the_run_goes_on(tmp_path: Path) -> None:
    rc, steps, fake = _call3(tmp_path, accept_mutants=["mut-cache-off"])
    assert rc == 0 and "rejected as meant: 5 of 6" in steps[-1]
    assert any("mutant cache-off: ACCEPTED" in line for line in steps)
    assert fake["active"] == "pkg-base"
    i = fake["calls"].index("deploy --pair gpu --packages mut-cache-off mut-cache-off --checks cached_continuation")
    assert fake["calls"][i + 1] == "rollback --pair gpu"


def test_lab_models_take_a_folder_given_as_text(tmp_path: Path) -> None:
    """real1's crash (`'str' object has no attribute 'mkdir'`, orchestrator/lab/models.py): a script passes argv."""
    from orchestrator.lab.models import ensure_lab_models

    models = ensure_lab_models(str(tmp_path / "models"))
    assert models.folder == tmp_path / "models" and all(p.is_file() for p in models.paths.values())


def test_call2_checks_its_part_and_returns_once_the_baseline_is_built(tmp_path: Path) -> None:
    c2 = tmp_path / "carried/c2"
    c2.mkdir(parents=True)
    (c2 / "model.part1").write_bytes(b"part")
    subprocess.run("sha256sum model.part1 > SHA256SUMS", shell=True, cwd=c2, check=True)
    (tmp_path / "state/raw").mkdir(parents=True)
    (tmp_path / "state/call1.ok").touch()
    (tmp_path / "state/raw/build-base.ok").write_text("rc=0 seconds=207\n")
    rc, steps = _run(tmp_path, "call2", tmp_path / "carried")
    assert rc == 0 and steps[-1].endswith("call 2 done: send call 3 now")
    assert (tmp_path / "state/in/model.part1").read_bytes() == b"part"
