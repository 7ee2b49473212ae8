"""Kernel patches: metadata, scope of the diff, patch application, harness link line, check plan/judge."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.build import harness as hz
from orchestrator.build.patching import apply_patch, apply_patch_commit, patch_digest, verify_patch
from orchestrator.checks.kernels import harness_argv, judge_host, parse_harness_output, plan_kernel_check
from orchestrator.config.inventory import load_inventory
from orchestrator.config.kernels import CaseSet, KernelCase, describe_all, diff_files, load_cases, load_kernel
from orchestrator.errors import BuildError, ConfigError
from orchestrator.hashing import sha256_file
from orchestrator.paths import KERNELS

MMVF = KERNELS / "mmvf-warp-per-row"
DATA = Path(__file__).parent / "data" / "kernels"


# --- metadata ------------------------------------------------------------------------------------


def test_mmvf_metadata_matches_its_diff():
    d, meta = load_kernel("mmvf-warp-per-row")
    assert d == MMVF.resolve()
    assert meta.patch_sha256 == sha256_file(MMVF / "patch.diff")
    assert diff_files((MMVF / "patch.diff").read_text()) == meta.files == ["ggml/src/ggml-cuda/mmvf.cu"]
    s = meta.scope
    assert (s.weight_type, s.k, s.m, s.dst_columns, s.cc_min, s.cc_max, s.fusion, s.ids) == (
        "bf16",
        320,
        10240,
        4,
        700,
        750,
        False,
        False,
    )


def test_mmvf_diff_only_adds_a_guard_with_exactly_the_declared_scope():
    """The diff removes nothing and its one new branch tests every scope condition of kernel.yaml."""
    text = (MMVF / "patch.diff").read_text()
    body = [line for line in text.splitlines() if not line.startswith(("diff ", "index ", "--- ", "+++ ", "@@"))]
    assert not [line for line in body if line.startswith("-")], "the patch must not remove existing code"
    added = "\n".join(line[1:] for line in body if line.startswith("+"))
    for cond in (
        "std::is_same_v<T, nv_bfloat16>",
        "ncols_dst == 4",
        "!is_multi_token_id",
        "ids == nullptr",
        "!has_fusion",
        "ncols == 320",
        "nrows == 10240",
        "GGML_CUDA_CC_IS_NVIDIA(cc)",
        "cc >= GGML_CUDA_CC_VOLTA",
        "cc < GGML_CUDA_CC_TURING",
        "block_size_best = warp_size",
    ):
        assert cond in added, cond


def test_changed_patch_is_refused(tmp_path):
    k = tmp_path / "mmvf-warp-per-row"
    shutil.copytree(MMVF, k)
    (k / "patch.diff").write_text((k / "patch.diff").read_text().replace("ncols == 320", "ncols == 322"))
    with pytest.raises(ConfigError, match="does not match kernel.yaml patch_sha256"):
        load_kernel(k)
    with pytest.raises(BuildError, match="patch_sha256"):
        patch_digest(k)


def test_cases_are_the_six_of_issue_7():
    cs = load_cases("mmvf-warp-per-row")
    assert cs.max_nmse == 5e-4
    by = {c.name: c for c in cs.cases}
    assert sorted(c.n for c in cs.cases if c.k_stride is None and c.weight_channels == 1) == [1, 3, 4, 5]
    assert all((c.weight_type, c.k, c.m) == ("bf16", 320, 10240) for c in cs.cases)
    assert by["w4-kpad"].k_stride == 384 and by["w4-kpad"].n == 4
    assert by["w4-bcast"].channels == 4 and by["w4-bcast"].weight_channels == 2
    assert (
        by["w4-kpad"].harness_spec()
        == "name=w4-kpad,type=bf16,k=320,m=10240,n=4,k_stride=384,wch=1,ch=1,runs=20,seed=1"
    )


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"k": 321}, "k must be even"),
        ({"k_stride": 320}, "k_stride"),
        ({"k_stride": 385}, "k_stride"),
        ({"weight_channels": 3, "channels": 4}, "multiple"),
        ({"extra": 1}, "Extra inputs"),
    ],
)
def test_bad_case_is_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        KernelCase.model_validate({"name": "x", "k": 320, "m": 8, "n": 1, **bad})


def test_duplicate_case_names_rejected():
    c = {"name": "a", "k": 2, "m": 2, "n": 1}
    with pytest.raises(ValueError, match="duplicate"):
        CaseSet.model_validate({"kernel": "k", "cases": [c, c]})


def test_describe_all_lists_mmvf():
    rows = {r["name"]: r for r in describe_all()}
    assert rows["mmvf-warp-per-row"]["scope_line"].startswith("cuda MUL_MAT bf16 K320 M10240 W4 cc[700,750)")


def test_config_check_accepts_kernel_yaml(cli):
    r = cli("config", "check", str(MMVF / "kernel.yaml"))
    assert r.exit_code == 0, r.output


# --- patch application on a small repo (fast, and every failure mode) ------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_NOSYSTEM": "1",
            "PATH": "/usr/bin:/bin",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "GIT_AUTHOR_DATE": "2026-01-02T00:00:00+0000",
            "GIT_COMMITTER_DATE": "2026-01-02T00:00:00+0000",
        },
    ).stdout.strip()


@pytest.fixture
def toy(tmp_path):
    """A repo with one file and a kernel folder whose diff changes it."""
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "k.cu").write_text("a\nb\nc\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "tag", "baseline")
    (repo / "src" / "k.cu").write_text("a\nB\nc\n")
    diff = _git(repo, "diff") + "\n"
    _git(repo, "checkout", "-q", "--", ".")
    kdir = tmp_path / "toy-patch"
    kdir.mkdir()
    (kdir / "patch.diff").write_text(diff)
    blob = _git(repo, "rev-parse", "baseline:src/k.cu")

    def write_meta(patch_text: str | None = None, blob_id: str = blob) -> Path:
        if patch_text is not None:
            (kdir / "patch.diff").write_text(patch_text)
        meta = {
            "name": "toy-patch",
            "title": "toy",
            "description": "toy",
            "patch_sha256": sha256_file(kdir / "patch.diff"),
            "files": ["src/k.cu"],
            "base": {"source": "toy", "blobs": {"src/k.cu": blob_id}},
            "scope": {
                "backend": "cuda",
                "op": "MUL_MAT",
                "function": "f",
                "weight_type": "bf16",
                "k": 2,
                "m": 2,
                "dst_columns": 1,
                "cc_min": 700,
                "cc_max": 750,
                "change": "x",
                "unchanged": "y",
            },
        }
        import yaml

        (kdir / "kernel.yaml").write_text(yaml.safe_dump(meta))
        (kdir / "cases.yaml").write_text(
            yaml.safe_dump({"kernel": "toy-patch", "cases": [{"name": "c", "k": 2, "m": 2, "n": 1}]})
        )
        return kdir

    write_meta()
    return repo, kdir, write_meta


def test_apply_patch_commit_is_reproducible_and_exact(toy):
    repo, kdir, _ = toy
    head_before = _git(repo, "rev-parse", "HEAD")
    c1 = apply_patch_commit(repo, "baseline", kdir)
    c2 = apply_patch_commit(repo, "baseline", kdir)
    assert c1 == c2
    assert _git(repo, "show", f"{c1}:src/k.cu") == "a\nB\nc"
    assert _git(repo, "rev-parse", f"{c1}^") == _git(repo, "rev-parse", "baseline")
    msg = _git(repo, "log", "-1", "--format=%B", c1)
    assert f"Pairctl-Patch-Sha256: {sha256_file(kdir / 'patch.diff')}" in msg and "toy-patch" in msg
    assert (
        _git(repo, "log", "-1", "--format=%an <%ae> %aI", c1)
        == "pairctl kernels <kernels@pairctl.invalid> 2026-01-02T00:00:00+00:00"
    )
    # the working copy and HEAD are untouched; the commit is kept reachable by a ref
    assert _git(repo, "rev-parse", "HEAD") == head_before and _git(repo, "status", "--porcelain") == ""
    assert _git(repo, "rev-parse", apply_patch(repo, "baseline", kdir).ref) == c1


def test_patch_that_does_not_apply_stops_with_build_error(toy):
    repo, kdir, write_meta = toy
    bad = (kdir / "patch.diff").read_text().replace("-b\n", "-x\n").replace(" a\n", " z\n")
    write_meta(bad)
    with pytest.raises(BuildError, match="does not apply cleanly"):
        apply_patch_commit(repo, "baseline", kdir)


def test_patch_on_another_base_is_refused(toy):
    repo, kdir, _ = toy
    (repo / "src" / "k.cu").write_text("a\nb\nc\nd\n")
    _git(repo, "commit", "-qam", "moved on")
    with pytest.raises(BuildError, match="written against src/k.cu blob"):
        apply_patch_commit(repo, "HEAD", kdir)


def test_unknown_revision_is_refused(toy):
    repo, kdir, _ = toy
    with pytest.raises(BuildError, match="not a commit"):
        apply_patch_commit(repo, "no-such-rev", kdir)


# --- the real patch on the pinned source ------------------------------------------------------------


@pytest.fixture(scope="session")
def kernel_source(request, pairctl_home):
    """The lab's pinned source repo (tests/plugins/packages.py's `lab_source` when present)."""
    try:
        return Path(request.getfixturevalue("lab_source"))
    except pytest.FixtureLookupError:
        from orchestrator.lab.source import ensure_source
        from orchestrator.paths import Home
        from tests.plugins.tiers import refuse_in_check

        refuse_in_check("the pinned llama.cpp source")

        return ensure_source(Home.resolve(pairctl_home))


@pytest.mark.unit_slow  # the pinned llama.cpp source (prepared once per home: 27 s cold)
def test_mmvf_patch_applies_to_pinned_source(kernel_source):
    r = subprocess.run(
        ["git", "-C", str(kernel_source), "apply", "--check", str(MMVF / "patch.diff")], capture_output=True, text=True
    )
    # `git apply --check` checks against the working copy, which is the baseline tree in the lab repo
    assert r.returncode == 0, r.stderr
    out = verify_patch(MMVF, kernel_source, "baseline")
    _, meta = load_kernel(MMVF)
    assert out["base"] == meta.base.commit
    assert _git(kernel_source, "rev-parse", "baseline^{tree}") == meta.base.tree
    commit = apply_patch_commit(kernel_source, "baseline", MMVF)
    assert commit == apply_patch_commit(kernel_source, "baseline", MMVF)
    changed = _git(kernel_source, "diff", "--name-only", "baseline", commit).splitlines()
    assert changed == ["ggml/src/ggml-cuda/mmvf.cu"]


# --- harness link line (golden build.ninja statement from a real CPU build) --------------------------


def test_link_line_from_build_ninja():
    ninja = (DATA / "build.ninja.rpc-server.txt").read_text()
    line = hz.link_line(ninja, "CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/c++\nCMAKE_BUILD_TYPE:STRING=Release\n")
    assert line.cxx == "/usr/bin/c++"
    assert line.flags == ("-O3", "-DNDEBUG")
    assert line.link_libraries[:2] == ("ggml/src/libggml.a", "-ldl")
    assert "ggml/src/ggml-rpc/libggml-rpc.a" in line.link_libraries
    argv = hz.compile_argv(
        line, sources=[Path("/k/kernel_cases.cpp")], include_dirs=[Path("/s/ggml/include")], out=Path("/o/x")
    )
    assert argv[:5] == ["/usr/bin/c++", "-std=c++17", "-O3", "-DNDEBUG", "-I/s/ggml/include"]
    assert argv.index("/k/kernel_cases.cpp") < argv.index("ggml/src/libggml.a")


def test_link_line_missing_statement_is_a_build_error():
    with pytest.raises(BuildError, match="no build statement"):
        hz.link_line(
            "build bin/llama-server: X\n  LINK_LIBRARIES = a.a\n", "CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/c++\n"
        )


def test_ninja_unescape():
    assert hz._ninja_unescape("a$ b$$c$:d") == "a b$c:d"


def test_harness_inputs_hash_the_sources():
    inputs = hz.harness_inputs()
    assert list(inputs) == ["kernels/harness/kernel_cases.cpp"]
    assert inputs["kernels/harness/kernel_cases.cpp"] == sha256_file(KERNELS / "harness" / "kernel_cases.cpp")


# --- the check's plan and verdict (pure) -----------------------------------------------------------


@pytest.fixture
def lab_inv():
    return load_inventory("lab", {"PAIRCTL_HOME": "/H"})


PKGS = {"lab-native": "pkg-n", "lab-rpc": "pkg-r"}


def test_plan_on_cpu_lab_uses_a_second_rpc_server_on_the_rpc_address(lab_inv):
    cs = load_cases("mmvf-warp-per-row")
    plan = plan_kernel_check(lab_inv, "lab", cs, PKGS)
    s = plan.rpc_server
    assert s is not None and (s.host, s.bind, s.port) == ("lab-rpc", "127.0.0.3", 50053)
    assert s.binary == "/H/lab/hosts/lab-rpc/root/releases/pkg-r/bin/ggml-rpc-server"
    kroot = "/H/lab/hosts/lab-rpc/root.state/kernel-check"  # run/ links to the default state dir
    assert list(s.start_cmd().argv) == [
        "sh",
        f"{kroot}/bin/pairctl-svc",
        "start",
        kroot,
        "ggml-rpc-server",
        # the second rpc-server is guarded as the live one is: only the pair's peers are served
        f"sup.allow={','.join(lab_inv.rpc_peers('lab'))}",
        s.binary,
        "-H",
        "127.0.0.3",
        "-p",
        "50053",
    ]
    assert s.allow == tuple(lab_inv.rpc_peers("lab")) and s.allow
    assert list(s.guard_cmd().argv)[2:] == ["guard", kroot, "ggml-rpc-server"]
    assert list(s.wait_cmd().argv)[2:] == ["wait-listen", kroot, "ggml-rpc-server", "127.0.0.3", "50053", "20"]
    assert list(s.stop_cmd().argv)[2:] == ["stop", kroot, "ggml-rpc-server"]
    native, rpc = plan.runs
    assert native.harness == "/H/lab/hosts/lab-native/root/releases/pkg-n/tests/bin/ggml-kernel-cases"
    argv = list(native.cmd.argv)
    assert argv[argv.index("--rpc") + 1] == "127.0.0.3:50053" and "--no-local" in argv
    assert argv.count("--case") == 6 and "--perturb" not in argv
    assert rpc.harness.startswith("/H/lab/hosts/lab-rpc/root/releases/pkg-r/")
    # issue 49: each harness proves the pair's route key to the second server's guard, with its
    # host's shim and key (on the RPC host: those the check puts in the server's own root)
    nroot = "/H/lab/hosts/lab-native/root"
    assert dict(native.cmd.env) == {
        "GGML_NO_BACKTRACE": "1",
        "LD_PRELOAD": f"{nroot}/bin/pairctl-rpc-guard.so",
        "PAIRCTL_RPC_DIAL": "127.0.0.3:50053",
        "PAIRCTL_RPC_KEY": f"{nroot}/secrets/rpc.key",
    }
    assert dict(rpc.cmd.env)["PAIRCTL_RPC_KEY"] == f"{kroot}/secrets/rpc.key"
    assert dict(rpc.cmd.env)["LD_PRELOAD"] == f"{kroot}/bin/pairctl-rpc-guard.so"
    assert (s.native, s.rpc_root) == (("lab-native", nroot), "/H/lab/hosts/lab-rpc/root")


def test_plan_gpu_hosts_test_their_own_gpus(lab_inv):
    hosts = {k: h.model_copy(update={"gpu": "Tesla V100"}) for k, h in lab_inv.hosts.items()}
    inv = lab_inv.model_copy(update={"hosts": hosts})
    plan = plan_kernel_check(inv, "lab", load_cases("mmvf-warp-per-row"), PKGS)
    assert plan.rpc_server is None
    assert all("--rpc" not in r.cmd.argv for r in plan.runs)


def test_plan_refuses_live_ports_and_unknown_perturb(lab_inv):
    cs = load_cases("mmvf-warp-per-row")
    with pytest.raises(ConfigError, match="rpc port"):
        plan_kernel_check(lab_inv, "lab", cs, PKGS, port=50052)
    with pytest.raises(ConfigError, match="server port"):
        plan_kernel_check(lab_inv, "lab", cs, PKGS, port=8080)
    with pytest.raises(ConfigError, match="names no case"):
        plan_kernel_check(lab_inv, "lab", cs, PKGS, perturb=["w9"])
    with pytest.raises(ConfigError, match="no package"):
        plan_kernel_check(lab_inv, "lab", cs, {"lab-native": "x"})
    plan = plan_kernel_check(lab_inv, "lab", cs, PKGS, perturb=["w4"])
    assert list(plan.runs[0].cmd.argv)[-2:] == ["--perturb", "w4"]


def _run(lab_inv):
    return plan_kernel_check(lab_inv, "lab", load_cases("mmvf-warp-per-row"), PKGS).runs[0]


NAMES = ["w1", "w3", "w4", "w5", "w4-kpad", "w4-bcast"]


def test_judge_real_passing_output(lab_inv):
    text = (DATA / "harness_pass.jsonl").read_text()
    rows, summary, junk = parse_harness_output(text)
    assert (
        len(rows) == 6
        and summary == {"summary": True, "passed": 6, "failed": 0, "backends": 1, "cases": 6}
        and not junk
    )
    v = judge_host(_run(lab_inv), 0, text, "", cases=NAMES, max_nmse=5e-4)
    assert v.passed, v.problems


def test_judge_real_perturbed_output_fails(lab_inv):
    text = (DATA / "harness_perturbed_w4-kpad.jsonl").read_text()
    v = judge_host(_run(lab_inv), 1, text, "", cases=NAMES, max_nmse=5e-4)
    assert not v.passed
    assert any("case w4-kpad" in p and "perturbed on purpose" in p for p in v.problems)
    assert not any("case w4 " in p for p in v.problems)


def test_judge_does_not_trust_exit_zero_alone(lab_inv):
    text = (DATA / "harness_pass.jsonl").read_text()
    lines = text.splitlines()
    # a missing case, a lying `passed` flag, a NaN (null) nmse, a missing summary: each one fails
    missing = "\n".join(line for line in lines if '"case":"w5"' not in line)
    assert any(
        "w5 has no result" in p for p in judge_host(_run(lab_inv), 0, missing, "", cases=NAMES, max_nmse=5e-4).problems
    )
    row = json.loads(lines[0])
    lying = json.dumps({**row, "nmse": 0.01})
    assert not judge_host(_run(lab_inv), 0, "\n".join([lying, *lines[1:]]), "", cases=NAMES, max_nmse=5e-4).passed
    nan = json.dumps({**row, "nmse": None, "passed": False})
    assert not judge_host(_run(lab_inv), 0, "\n".join([nan, *lines[1:]]), "", cases=NAMES, max_nmse=5e-4).passed
    assert any(
        "no summary" in p
        for p in judge_host(_run(lab_inv), 0, "\n".join(lines[:-1]), "", cases=NAMES, max_nmse=5e-4).problems
    )
    assert any(
        "exited 127" in p for p in judge_host(_run(lab_inv), 127, "", "not found", cases=NAMES, max_nmse=5e-4).problems
    )


def test_harness_argv_shape():
    cs = load_cases("mmvf-warp-per-row")
    argv = harness_argv("/r/tests/bin/ggml-kernel-cases", cs, rpc="127.0.0.3:50053", perturb=["all"])
    assert argv[0] == "/r/tests/bin/ggml-kernel-cases"
    assert argv[argv.index("--max-nmse") + 1] == "0.0005"
    assert argv[-2:] == ["--perturb", "all"]


# --- the lab's kernel model variant ------------------------------------------------------------------


def test_kmmvf_models_have_the_patched_matmul_shape(tmp_path):
    import gguf

    from orchestrator.lab.kernel_models import ensure_kmmvf_models

    paths = ensure_kmmvf_models(tmp_path)
    assert set(paths) == {"target", "draft_same"}
    first = {role: sha256_file(p) for role, p in paths.items()}
    assert (
        ensure_kmmvf_models(tmp_path) == paths and {r: sha256_file(p) for r, p in paths.items()} == first
    )  # intact: kept
    tensors = {t.name: t for t in gguf.GGUFReader(paths["target"]).tensors}
    gate = tensors["blk.0.ffn_gate.weight"]
    assert gate.tensor_type == gguf.GGMLQuantizationType.BF16
    assert [int(x) for x in gate.shape] == [320, 10240]  # ne00 = K = 320, ne01 = M = 10240
    draft = {t.name: t for t in gguf.GGUFReader(paths["draft_same"]).tensors}
    assert all(bytes(draft[n].data) == bytes(t.data) for n, t in tensors.items())  # same weights: drafts accepted
    paths["target"].write_bytes(b"broken")
    ensure_kmmvf_models(tmp_path)
    assert sha256_file(paths["target"]) == first["target"]  # a damaged file is rewritten identically
    # The GPU profile runs Q8 KV with flash attention on CUDA devices, local and over RPC: the head
    # size must be one ggml-cuda's flash-attention kernels have (fattn.cu). Head size 32 made the
    # H200's ggml-rpc-server abort on the first graph (the RPC backend claims every op).
    reader = gguf.GGUFReader(paths["target"])
    n_embd = int(reader.fields["llama.embedding_length"].parts[-1][0])
    n_head = int(reader.fields["llama.attention.head_count"].parts[-1][0])
    assert n_embd // n_head in {64, 80, 96, 112, 128, 256}


def test_config_check_validates_cases_yaml(cli, tmp_path):
    assert cli("config", "check", str(MMVF / "cases.yaml")).exit_code == 0
    bad = tmp_path / "cases.yaml"
    bad.write_text((MMVF / "cases.yaml").read_text().replace("k_stride: 384", "k_stride: 300"))
    r = cli("config", "check", "--kind", "kernel-cases", str(bad))
    assert r.exit_code == 3 and "k_stride" in r.output


@pytest.mark.parametrize("name", ["h200_cuda_patched.jsonl", "h200_cuda_forced_warp_per_row.jsonl"])
def test_judge_real_cuda_output(lab_inv, name):
    """Captured on an H200 by kernels/harness/cuda_check.sh (CUDA0 vs CPU); 'forced' = the patch's
    guard without its Volta bound, i.e. the warp-per-row launch itself on a real GPU."""
    hosts = {k: h.model_copy(update={"gpu": "H200"}) for k, h in lab_inv.hosts.items()}
    run = plan_kernel_check(
        lab_inv.model_copy(update={"hosts": hosts}), "lab", load_cases("mmvf-warp-per-row"), PKGS
    ).runs[0]
    text = (DATA / name).read_text()
    v = judge_host(run, 0, text, "", cases=NAMES, max_nmse=5e-4)
    assert v.passed, v.problems
    assert {r["backend"] for r in v.rows} == {"CUDA0"}


GOLDEN = Path(__file__).parent / "golden"


def test_listeners_come_from_a_real_proc_net_tcp():
    """Issue 42 item 4: `ss` is missing on the GPU host; the kernel's tables are read instead.
    Golden: this machine's /proc/net/tcp and /proc/net/tcp6, captured with listeners on
    127.0.0.1:18081, [::1]:18082 and [::]:18083 (v6only) and one connection to the first."""
    from orchestrator.checks.kernels import port_taken
    from orchestrator.hosts.probes import parse_proc_net_tcp

    text = (GOLDEN / "proc_net_tcp.txt").read_text() + (GOLDEN / "proc_net_tcp6.txt").read_text()
    got = parse_proc_net_tcp(text)
    assert sorted(got) == sorted([("0.0.0.0", 2024), ("127.0.0.1", 18081), ("::", 18083), ("::1", 18082)])
    # established sockets (st 01) are not listeners, even on a listening port
    assert port_taken(text, "127.0.0.1", 18081) == ["127.0.0.1:18081"]
    assert port_taken(text, "127.0.0.3", 2024) == ["0.0.0.0:2024"]  # the wildcard holds every address
    assert port_taken(text, "127.0.0.3", 18083) == ["[::]:18083"]
    assert port_taken(text, "127.0.0.3", 18081) == [] and port_taken(text, "::1", 18082) == ["[::1]:18082"]
    assert port_taken("", "127.0.0.3", 50063) == [] and parse_proc_net_tcp("garbage\n 0: zz:1 y 0A") == []


def test_started_identity_requires_our_running_binary():
    import base64

    from orchestrator.checks.kernels import started_identity

    binary = "/r/releases/p/bin/ggml-rpc-server"
    argv = base64.b64encode(f"{binary}\0-H\0127.0.0.3\0-p\00050063\0".encode()).decode()
    ok = f"current=-\nprevious=-\npid=42\nlistening=127.0.0.3:50063\nproc=ggml-rpc-server:42:{'a' * 64}:{argv}\n"
    assert started_identity(ok, binary) is None
    # a port held by someone else: the helper saw a listener, but our process died (failed bind)
    assert "not running" in started_identity("pid=42\nlistening=127.0.0.3:50063\nproc=ggml-rpc-server:-\n", binary)
    assert "not running" in started_identity("pid=42\n", binary)
    assert "not /other" in started_identity(ok, "/other") or "/other" in started_identity(ok, "/other")


def test_harness_runs_without_gdb_backtraces(lab_inv):
    run = _run(lab_inv)
    assert dict(run.cmd.env)["GGML_NO_BACKTRACE"] == "1"
    assert run.cmd.full_argv()[:3] == ("env", "--", "GGML_NO_BACKTRACE=1")
