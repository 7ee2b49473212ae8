"""What the H200 run committed stays true: the gpu profile logs at the verbosity that prints the
per-device split, the captured load log carries that split, and the H200 sections of the docs are
exactly what benchmarks/gpu/sections.py makes of the committed raw archive (no figure typed by hand)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tarfile
from pathlib import Path
from types import ModuleType

from orchestrator.config.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]
LOAD_LOG = ROOT / "tests/unit/data/load-log-h200.txt"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / f"benchmarks/gpu/{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sections_module() -> ModuleType:
    return _module("sections")


def test_gpu_profile_renders_log_verbosity_4() -> None:
    args = load_profile("gpu").render_args(
        model_paths={"target": "/m/t.gguf", "draft_same": "/m/d.gguf"},
        host="127.0.0.1",
        port=8080,
        rpc=["127.0.0.1:50052"],
        log_file="/run/llama-server.log",
    )
    i = args.index("--log-verbosity")
    assert args[i + 1] == "4"


def test_h200_load_log_shows_the_split_per_device() -> None:
    text = LOAD_LOG.read_text()
    assert "verbosity = 4" in text
    model = dict(re.findall(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB", text))
    kv = dict(re.findall(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB", text))
    assert set(model) == {"CPU_Mapped", "CUDA0", "RPC0[127.0.0.1:50052]"}
    assert float(model["RPC0[127.0.0.1:50052]"]) > 10 * float(model["CUDA0"])  # the RPC device holds the layers
    assert list(kv) == ["RPC0[127.0.0.1:50052]"]
    assert re.search(r"offloaded 3/3 layers to GPU", text)


def test_h200_doc_sections_are_generated_from_the_raw_archive(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    with tarfile.open(ROOT / "docs/gpu-reference-raw.tgz") as tf:
        tf.extractall(raw, filter="data")
    docs = tmp_path / "docs"
    docs.mkdir()
    names = ("reference-answers.md", "qualify-calibration.md")
    for name in names:
        shutil.copy(ROOT / "docs" / name, docs / name)
    sections_module().main(raw, docs)
    for name in names:
        assert (docs / name).read_text() == (ROOT / "docs" / name).read_text(), f"docs/{name} differs from the raw"


def test_gpu_validation_is_generated_from_the_raw_archives(tmp_path: Path) -> None:
    """docs/gpu-validation.md is what report.py makes of the committed raw archives (the earlier
    H200 phases and the real model's run on the H100: issue 42's baseline, candidate and mutants),
    unpacked as docs/guides/gpu.md says; no figure in it is typed by hand."""
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "benchmarks/gpu/report.py")
    assert spec and spec.loader
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    old, real, prod = tmp_path / "old", tmp_path / "real", tmp_path / "prod"
    archives = (("gpu-validation-raw.tgz", old), ("gpu-real-raw.tgz", real), ("gpu-production-raw.tgz", prod))
    for archive, into in archives:
        into.mkdir()
        with tarfile.open(ROOT / "docs" / archive) as tf:
            tf.extractall(into, filter="data")
    out = tmp_path / "gpu-validation.md"
    report.main(out, report.Raw([*sorted(p for p in old.iterdir() if p.is_dir()), real, prod / "production"]))
    text = out.read_text()
    assert text == (ROOT / "docs/gpu-validation.md").read_text(), "docs/gpu-validation.md differs from the raw"
    assert "ALL DONE" in text and "6 of 6 rejected" in text and "### Comparisons under the device's numerics" in text
    assert "ELF sm_70" in text and "ELF sm_120a" in text  # the production packages built without a GPU


# cuobjdump 13.5.37 (wheel nvidia-cuda-cuobjdump) on a one-kernel program built by each toolkit.
LIST_SM120 = "ELF file    1: k120.1.sm_120a.cubin\nELF file    2: k120.2.sm_120a.cubin\n"
PTX_SM120 = "PTX file    1: k120.1.sm_120.ptx\nPTX file    2: k120.2.sm_120a.ptx\n"


def test_production_packages_are_collected_and_rendered_from_what_exists(tmp_path: Path) -> None:
    """Only a package in the store gets a row; its architectures are cuobjdump's, and no run is claimed."""
    home, raw = tmp_path / "home", tmp_path / "raw"
    pkg = home / "packages" / "production-9d37488533-rtx5060ti"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "bin" / "llama-server").write_text("")
    manifest = {"id": pkg.name, "target": {"name": "rtx5060ti"}, "cmake_flags": {"CMAKE_CUDA_ARCHITECTURES": "120"},
                "toolchain": {"nvcc": "13.5.37", "cuda_from": "wheels: nvidia-cuda-nvcc 13.5.37"}}  # fmt: skip
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    (home / "packages" / "lab-9d37488533-cpu-lab").mkdir()  # no manifest: skipped
    fake = tmp_path / "cuobjdump"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = --list-elf ] && printf '{LIST_SM120}' || printf '{PTX_SM120}'\n")
    fake.chmod(0o755)
    assert _module("production").collect(home, raw, str(fake)) == [pkg.name]
    report = _module("report")
    assert report.gpu_code((raw / "prod-rtx5060ti.cuobjdump.txt").read_text()) == {
        "bin/llama-server": {"ELF": ["sm_120a"], "PTX": ["sm_120", "sm_120a"]}
    }
    md = "\n".join(report.production_section(report.Raw([raw])))
    assert "| rtx5060ti | production-9d37488533-rtx5060ti | 13.5.37 | wheels: nvidia-cuda-nvcc 13.5.37 | 120 |" in md
    assert "cannot run sm_120" in md and "v100" not in md.split("|---|")[-1]
    assert report.production_section(report.Raw([tmp_path / "empty"])) == []
