"""Turn the raw output of benchmarks/gpu/run.sh into docs/gpu-validation.md.

Every figure in that page comes from a file this reads; nothing is typed by hand.
Usage: python3 benchmarks/gpu/report.py OUT.md RAW_DIR [RAW_DIR...] [--cpu-accept ACCEPT_JSON]

--cpu-accept: the CPU lab's `accept --json` of the same route for the per-check time column (default:
the one in benchmarks/results/gpu-real-cpu-rehearsal.tgz).

run.sh's phases may land on different machines (one call each), so the page can be made from
several raw folders: for each file the last folder holding it wins; the step logs are merged.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read(p: Path) -> str:
    try:
        return p.read_text(errors="replace").strip()
    except OSError:
        return ""


class Raw:
    """The union of several raw folders: `raw / name` is the last folder's copy of that file."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    def __truediv__(self, name: str) -> Path:
        found = [d / name for d in self.dirs if read(d / name)]
        return found[-1] if found else self.dirs[-1] / name

    def steps(self) -> list[str]:
        lines = dict.fromkeys(line for d in self.dirs for line in read(d / "steps.log").splitlines() if line.strip())
        return sorted(lines, key=lambda line: line[:22])  # by time stamp; a call's own order kept within one second

    def superseded(self, name: str) -> list[Path]:
        """Copies of `name` that a later folder's copy replaced (earlier attempts)."""
        winner = self / name
        return [d / name for d in self.dirs if read(d / name) and d / name != winner]


_PHASE = re.compile(r"^(\S+?)Z? \[info\s*\] build phase\s.*?phase=(\w+)", re.M)
_STAMP = re.compile(r"^(\S+?)Z? \[", re.M)
_PROGRESS = re.compile(r"completed=(\d+) .*?total=(\d+)")


def build_phases(log: str) -> str:
    """Seconds per build phase (export, configure, compile, ...) from `pairctl -v build`'s log lines:
    each phase runs until the next one starts; the last until the log's last line."""
    from datetime import datetime

    marks = [(datetime.fromisoformat(ts), name) for ts, name in _PHASE.findall(log)]
    if not marks:
        return "–"
    end = datetime.fromisoformat(_STAMP.findall(log)[-1])
    return ", ".join(
        f"{name} {((nxt[0] if nxt else end) - t).total_seconds():.0f}"
        for (t, name), nxt in zip(marks, [*marks[1:], None], strict=True)
    )


def route_argv(p: Path) -> list[str]:
    """The activated argv from a route record the run copied; said missing, never dropped silently
    (a record not copied once hid this section: the run looked at the root's old place)."""
    route = load_json(p)
    active = route.get("active") if isinstance(route, dict) else None
    if not (isinstance(active, dict) and active.get("native_argv")):
        return [f"The route record's argv: not captured ({p.name} missing or without an active entry).", ""]
    argv = [" ".join(active["native_argv"]), " ".join(active.get("rpc_argv") or [])]
    return ["The route record's argv, as activated:", "```", *argv, "```", ""]


def load_json(p: Path) -> Any:
    text = read(p)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        rows = []
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        return rows or None


def dicts(obj: Any) -> Iterator[dict]:
    """Every dict nested anywhere in obj."""
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from dicts(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from dicts(v)


def rc_of(text: str) -> str:
    m = re.findall(r"^rc=(\d+)", text, re.M)
    return m[-1] if m else "?"


def fence(text: str, limit: int = 40) -> list[str]:
    lines = text.splitlines()[-limit:]
    return ["```", *lines, "```"]


def check_of(doc: Any, name: str) -> dict:
    return next((d for d in dicts(doc) if d.get("name") == name and "verdict" in d), {})


def g(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


_SPLIT = re.compile(r"load_tensors: (offloaded .*|.*model buffer size.*)|llama_kv_cache: .*KV buffer size.*")


def real_section(raw: Raw) -> list[str]:
    """The real model (SmolLM2-135M-Instruct Q4_1) on the CUDA pair: `run.sh real1..real3` (issue 37)."""
    dep = read(raw / "deploy-real.log")
    if not dep:
        return []
    md = [
        "## The real model on the CUDA pair (issue 37)",
        "",
        "`benchmarks/gpu/run.sh real1`, `real2`, `real3`: three calls to one warm machine, because a call carries at",
        "most 64 MiB. The baseline tree (git archive, xz) and SmolLM2-135M-Instruct Q4_1 in three parts were",
        "carried; the rebuilt lab source and the joined model were checked where they landed:",
        "",
        *fence(read(raw / "source.txt"), 2),
        *fence(read(raw / "model.txt"), 2),
        "",
        "The baseline package was deployed on the `gpu` pair of `benchmarks/gpu/config/inventories/gpu-real.yaml`",
        "(ggml-rpc-server on the GPU bound to 127.0.0.1, llama-server with `--rpc`, local transport) with the lab's",
        "production-shape profile `lab-real` (2 slots, q8_0 KV, flash attention, all layers offloaded, draft-simple",
        "3/1 with the seeded-noise draft), then `pairctl accept`: the route's first acceptance, so it recorded the",
        "reference answers.",
        "",
        f"Deploy (`--skip-accept`) exit status: {rc_of(dep)}",
        *fence(dep, 24),
        "",
    ]
    md += route_argv(raw / "real-native-route.json")
    split = [m.group(0) for m in _SPLIT.finditer(read(raw / "real-native-llama-server.log"))]
    if split:
        md += [
            "The split, from llama-server's load log (target model first, then the draft):",
            *fence("\n".join(split), 16),
            "",
        ]
    acc = load_json(raw / "accept-real.json")
    md += [f"Accept exit status: {rc_of(read(raw / 'accept-real.err'))}", ""]
    checks = [d for d in dicts(acc) if "verdict" in d and "name" in d]
    if checks:
        md += ["| check | verdict | required | key figures |", "|---|---|---|---|"]
        for d in checks:
            figs = d.get("figures") or {}
            fig = ", ".join(f"{k}={v}" for k, v in list(figs.items())[:9]) if isinstance(figs, dict) else str(figs)
            md += [f"| {d['name']} | {d['verdict']} | {d.get('required', '')} | {fig} |"]
    else:
        md += fence(read(raw / "accept-real.err"), 30)
    budget = next((d["request_budget"] for d in dicts(acc) if isinstance(d.get("request_budget"), dict)), {})
    if budget:
        md += [
            "",
            "The acceptance's cold probe and the bounds derived from it (`request_budget`): "
            + ", ".join(f"{k}={g(v)}" for k, v in budget.items() if not isinstance(v, (dict, list)))
            + ".",
        ]
    md += [
        "",
        "### Replay floor on CUDA (reference_logprobs against the answers recorded above)",
        "",
        "The reference pair replayed against its own answers (`accept --only reference_logprobs`, same package,",
        "same profile), then the same package with f16 KV instead of q8_0 (`deploy --profile gpu-real-kv-f16",
        "--checks reference_logprobs`, profile in `benchmarks/gpu/config/profiles/`) for scale, then the MMVF",
        "sm90 candidate (`benchmarks/gpu/mmvf-warp-per-row-sm90`, profile lab-real). Figures from `--json`:",
        "",
        "| run | exit | verdict | positions | mean KL | max KL | top-1 | max abs dlogprob | greedy flips |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    runs = [
        ("replay 1 (same pair, q8_0 KV)", "replay-1.json", "replay-1.err"),
        ("replay 2 (same pair, q8_0 KV)", "replay-2.json", "replay-2.err"),
        ("f16 KV (gpu-real-kv-f16)", "deploy-kvf16.json", "deploy-kvf16.log"),
        ("MMVF sm90 candidate", "deploy-sm90-real.json", "deploy-sm90-real.log"),
    ]
    gates: dict = {}
    for label, js, err in runs:
        if not read(raw / err):
            md += [f"| {label} | not run | – | – | – | – | – | – | – |"]
            continue
        c = check_of(load_json(raw / js), "reference_logprobs")
        c = c or check_of(load_json(raw / js.replace("deploy-", "receipt-")), "reference_logprobs")
        f = c.get("figures") or {}
        gates = gates or next((d["gates"] for d in dicts(c) if isinstance(d.get("gates"), dict)), {})
        md += [
            f"| {label} | {rc_of(read(raw / err))} | {c.get('verdict', '–')} | {f.get('positions', '–')} | "
            f"{g(f.get('mean_kl'))} | {g(f.get('max_kl'))} | {g(f.get('top1'))} | {g(f.get('max_abs_dlogprob'))} | "
            f"{f.get('greedy_flips', '–')} |"
        ]
    if not gates:  # the check's figures carry no gates: the profile's, as the check reads them
        import yaml

        from orchestrator.config.reference_gates import ReferenceGates

        prof = yaml.safe_load((Path(__file__).resolve().parents[2] / "manifests/profiles/lab-real.yaml").read_text())
        gates = ReferenceGates.model_validate(prof.get("reference_gates") or {}).model_dump()
    md += ["", "Gates in force (profile `lab-real`): " + ", ".join(f"`{k}` {v}" for k, v in gates.items()) + "."]
    ref = load_json(raw / "reference-show-real.json")
    if ref:
        keys = sorted({str(d["key"]) for d in dicts(ref) if isinstance(d.get("key"), str)})
        md += ["", f"Reference answer key(s) (`reference show`): {', '.join(f'`{k}`' for k in keys) or '–'}."]
    kc = load_json(raw / "kernels-sm90-real.json")
    rows = [
        {"host": h["host"], **r}
        for h in dicts(kc)
        if isinstance(h.get("rows"), list) and "host" in h
        for r in h["rows"]
        if isinstance(r, dict) and "case" in r
    ]
    if rows:
        md += [
            "",
            f"The sm90 candidate's kernel cases (`kernels check`, exit {rc_of(read(raw / 'kernels-sm90-real.err'))};"
            " w4 is the launch the patch changes):",
            "",
            "| host | case | n | nmse | max abs err | passed | µs per run |",
            "|---|---|---:|---:|---:|---|---:|",
        ]
        md += [
            f"| {d['host']} | {d.get('case')} | {d.get('n', '–')} | {d.get('nmse', '–')} | {d.get('max_err', '–')} | "
            f"{d.get('passed', '–')} | {d.get('us_per_run', '–')} |"
            for d in rows
        ]
    vram = [int(x) for x in re.findall(r"^\s*(\d+)\s*$", read(raw / "vram-real.csv"), re.M)]
    if vram:
        md += [
            "",
            f"Peak GPU memory used during the real-model runs: {max(vram)} MiB ({len(vram)} samples, 200 ms apart).",
        ]
    return [*md, ""]


def machine_lines(d: Path) -> list[str]:
    """The card a raw folder ran on, its driver and CUDA (nvidia-smi), nvcc and the host, as read there."""
    gpu = read(d / "gpu.txt")
    if not gpu:
        return []
    name, driver, *rest = [x.strip() for x in gpu.splitlines()[0].split(",")] + ["", ""]
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", read(d / "nvidia-smi.txt"))
    nv = re.search(r"release [\d.]+, V[\d.]+", read(d / "nvcc.txt"))
    arches = read(d / "nvcc-arches.txt").split()
    host = read(d / "host.txt").splitlines()
    out = [
        f"- `{d.name}`: **{name}** ({', '.join(x for x in rest if x)}), driver {driver}"
        + (f", CUDA {cuda.group(1)} (driver)" if cuda else "")
        + f"; nvcc `{nv.group(0) if nv else read(d / 'nvcc.txt')[:60] or '?'}`"
    ]
    if arches:
        out += [
            f"  `nvcc --list-gpu-arch`: {arches[0]} … {arches[-1]} ({len(arches)} arches; "
            f"compute_70 {'offered' if 'compute_70' in arches else 'not offered'})"
        ]
    if host:
        out += [f"  host: {host[0]} cores; " + "; ".join(f"`{h}`" for h in host[1:])]
    return out


def cards(raw: Raw) -> str:
    names = dict.fromkeys(read(d / "gpu.txt").split(",")[0].strip() for d in raw.dirs if read(d / "gpu.txt"))
    return " and ".join(n for n in names if n) or "a lent GPU"


def main(out: Path, raw: Raw, cpu_accept: Path | None = None) -> None:
    md: list[str] = [
        f"# GPU validation on {cards(raw)}",
        "",
        "Generated by `benchmarks/gpu/report.py` from the output of `benchmarks/gpu/run.sh`;",
        "nothing here is typed by hand; a phase that did not run has no section. Raw files: the `raw.tgz`",
        "of each run, kept under `docs/` (one folder per machine).",
        "",
    ]
    steps = raw.steps()
    if steps:
        md += [
            f"Run: {steps[0][1:21]} to {steps[-1][1:21]} (UTC), from {len(raw.dirs)} raw folder(s), one per machine "
            "(a later folder's file replaces an earlier one's). Steps of every call, in time order:",
            "",
            *fence("\n".join(steps), 80),
            "",
        ]
    machines = [line for d in raw.dirs for line in machine_lines(d)]
    if machines:
        md += ["## Machine and toolchain", "", *machines, ""]
    if any(read(raw / f) for f in ("build-v100.log", "build-h200.log", "build-rtx5060ti.log")):
        md += early_builds(raw)
    if read(raw / "kernels-check.err") or read(raw / "kernels-check.json"):
        md += early_kernels(raw)
    if read(raw / "deploy.log"):
        md += early_pair(raw)
    md += real_section(raw)
    md += calls_section(raw, cpu_accept)
    md += production_section(raw)
    out.write_text("\n".join(md) + "\n")
    print(f"wrote {out}")


def early_builds(raw: Raw) -> list[str]:
    md: list[str] = []
    md += [
        "## Builds (`pairctl build --rev baseline --target T`)",
        "",
        "| target | exit | wall s | seconds per phase | package | build_info |",
        "|---|---:|---:|---|---|---|",
    ]
    v100 = read(raw / "build-v100.log")
    real = re.search(r"^real\s+(\d+)m([\d.]+)s", v100, re.M)
    if v100:
        md += [
            f"| v100 | {rc_of(v100)} | {int(real.group(1)) * 60 + float(real.group(2)) if real else '–'} | "
            "refused before compiling | – | – |"
        ]
    for t in ("h200", "rtx5060ti"):
        done = read(raw / f"build-{t}.done")
        m = re.search(r"rc=(\d+) seconds=(\d+)", done)
        log = read(raw / f"build-{t}.log")
        if not done and not log:
            continue
        if not done:
            prog = _PROGRESS.findall(log)
            state = f"still compiling when the call ended ({'/'.join(prog[-1])} ninja steps)" if prog else "not run"
            md += [f"| {t} | {state} | – | {build_phases(log)} | – | – |"]
            continue
        pk = load_json(raw / f"build-{t}.json")
        pk = pk[0] if isinstance(pk, list) and pk else (pk or {})
        md += [
            f"| {t} | {m.group(1) if m else '?'} | {m.group(2) if m else '?'} | {build_phases(log)} | "
            f"{pk.get('id', '–')} | {pk.get('build_info', '–')} |"
        ]
    if v100:
        md += ["", "The v100 refusal, as printed:", *fence(v100, 8)]
    md += [""]
    for t in ("h200", "rtx5060ti"):
        done = read(raw / f"build-{t}.done")
        if done and not done.startswith("rc=0"):
            md += [f"{t} build log (tail):", *fence(read(raw / f"build-{t}.log"), 30), ""]
    return md


def early_kernels(raw: Raw) -> list[str]:
    md: list[str] = []
    md += ["## MMVF kernel cases, CUDA vs the CPU reference (`pairctl kernels check --pair gpu`)", ""]
    kc = load_json(raw / "kernels-check.json")
    rows = [
        {"host": h["host"], **r}
        for h in dicts(kc)
        if isinstance(h.get("rows"), list) and "host" in h
        for r in h["rows"]
        if isinstance(r, dict) and "case" in r
    ]
    md += [
        f"Exit status: {rc_of(read(raw / 'kernels-check.err'))} "
        "(generic block-size selection: the patch is scoped to Volta).",
        "",
    ]
    if rows:
        md += [
            "| host | case | backend (device) | n | nmse | max abs err | passed | µs per run | CPU µs per run | runs |",
            "|---|---|---|---:|---:|---:|---|---:|---:|---:|",
        ]
        for d in rows:
            md += [
                f"| {d['host']} | {d.get('case')} | {d.get('backend', '')} ({d.get('device', '')}) | "
                f"{d.get('n', '–')} | {d.get('nmse', '–')} | {d.get('max_err', '–')} | {d.get('passed', '–')} | "
                f"{d.get('us_per_run', '–')} | "
                f"{d.get('cpu_us_per_run', '–')} | {d.get('runs', '–')} |"
            ]
    else:
        md += fence(read(raw / "kernels-check.json") or read(raw / "kernels-check.err"), 30)
    pert = read(raw / "kernels-perturbed.err")
    md += [
        "",
        f"With every CPU reference perturbed on purpose (`--perturb all`): exit status {rc_of(pert)} "
        "(must be nonzero: the comparison can fail).",
        "",
    ]
    return md


def early_pair(raw: Raw) -> list[str]:
    md: list[str] = []
    md += [
        "## GPU pair on one machine: deploy and accept",
        "",
        "`pairctl --inventory gpu deploy --pair gpu --packages P P` (ggml-rpc-server on the GPU bound to 127.0.0.1, "
        "llama-server with `--rpc` and all layers offloaded; BF16 K320/M10240 model with a same-weights draft), then "
        "`pairctl --inventory gpu accept --pair gpu`.",
        "",
    ]
    dep = read(raw / "deploy.log")
    md += [f"Deploy exit status: {rc_of(dep)}", *fence(dep, 30), ""]
    banner = read(raw / "rpc-ggml-rpc-server.out").splitlines()
    end = next((i for i, line in enumerate(banner) if "transport" in line), min(len(banner), 10) - 1)
    if banner:
        md += [
            "ggml-rpc-server's start-up banner on the RPC host (its output file):",
            *fence("\n".join(banner[: end + 1]), 12),
            "",
        ]
    md += route_argv(raw / "native-route.json")
    acc = load_json(raw / "accept.json")
    md += [f"Accept exit status: {rc_of(read(raw / 'accept.err'))}", ""]
    checks = [d for d in dicts(acc) if "verdict" in d and "name" in d]
    if checks:
        md += ["| check | verdict | required | key figures |", "|---|---|---|---|"]
        for d in checks:
            figs = d.get("figures") or {}
            fig = ", ".join(f"{k}={v}" for k, v in list(figs.items())[:8]) if isinstance(figs, dict) else str(figs)
            md += [f"| {d['name']} | {d['verdict']} | {d.get('required', '')} | {fig} |"]
    else:
        md += fence(read(raw / "accept.err"), 30)
    for earlier in raw.superseded("deploy.log"):
        text = read(earlier)
        cause = next((line for line in text.splitlines() if line.startswith("cause:")), "")
        md += [
            "",
            f"An earlier deploy in `{earlier.parent.name}` (superseded above) exited {rc_of(text)}"
            + (f"; {cause}" if cause else "."),
            *fence(
                "\n".join(line for line in text.splitlines() if line.startswith("  ") and not line.startswith("  [")),
                12,
            ),
        ]
    vram = [int(x) for x in re.findall(r"^\s*(\d+)\s*$", read(raw / "vram.csv"), re.M)]
    if vram:
        md += [
            "",
            f"Peak GPU memory used (nvidia-smi every 200 ms during deploy, accept and kernel checks): {max(vram)} MiB "
            f"(idle at start: {vram[0]} MiB; {len(vram)} samples).",
        ]
    return [*md, ""]


# ---- issues 42/43: `run.sh call1..call3` ----
BUILD_ORDER = ("base", "sm90")
CPU_REHEARSAL = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu-real-cpu-rehearsal.tgz"
_STEP_LINE = re.compile(r"rc=(\d+) seconds=([\d.]+)")
_BUFFER = re.compile(r"(\S+) (model|KV|compute) buffer size =\s+([\d.]+) MiB")


def rc_seconds(raw: Raw, name: str) -> tuple[str, str]:
    m = _STEP_LINE.findall(read(raw / f"{name}.err"))
    return (m[-1][0], f"{float(m[-1][1]):.1f}") if m else ("–", "–")


def checks_in(doc: Any) -> dict[str, dict[str, Any]]:
    """name -> check result (verdict, duration_s, figures) from an accept --json or a receipt."""
    return {d["name"]: d for d in dicts(doc) if "verdict" in d and isinstance(d.get("name"), str)}


def cpu_lab_checks(path: Path | None) -> tuple[dict[str, dict[str, Any]], str]:
    """The CPU lab's acceptance of the same route (profile lab-real) for the time column: an accept --json
    given on the command line, else the one in the committed CPU rehearsal of the real-model procedure."""
    import tarfile

    if path is not None:
        return checks_in(load_json(path)), f"`{path.name}`"
    if not CPU_REHEARSAL.is_file():
        return {}, ""
    with tarfile.open(CPU_REHEARSAL) as tf:
        f = tf.extractfile("./accept-real.json")
        doc = json.loads(f.read()) if f else None
    steps = ""
    with tarfile.open(CPU_REHEARSAL) as tf:
        f = tf.extractfile("./steps.log")
        steps = f.read().decode()[1:11] if f else ""
    return checks_in(doc), f"CPU lab, 2 cores ({steps}; `{CPU_REHEARSAL.name}`)"


def deploy_seconds(receipt: Any) -> str:
    """Seconds of a deploy's own steps, up to the acceptance (from its receipt)."""
    steps = receipt.get("steps") if isinstance(receipt, dict) else None
    if not isinstance(steps, list):
        return "–"
    total = 0.0
    for st in steps:
        if not isinstance(st, dict) or st.get("name") == "accept":
            break
        total += float(st.get("duration_s") or 0)
    return f"{total:.1f}"


def memory_lines(log: str) -> list[str]:
    """GPU and host memory per device from llama-server's load log (target model and draft together)."""
    per: dict[str, dict[str, float]] = {}
    for dev, kind, mib in _BUFFER.findall(log):
        per.setdefault(dev, {}).setdefault(kind, 0.0)
        per[dev][kind] += float(mib)
    if not per:
        return []
    out = ["| device | model MiB | KV MiB | compute MiB | total MiB |", "|---|---:|---:|---:|---:|"]
    for dev, k in per.items():
        out += [
            f"| {dev} | {k.get('model', 0):.2f} | {k.get('KV', 0):.2f} | {k.get('compute', 0):.2f} | "
            f"{sum(k.values()):.2f} |"
        ]
    return out


def calls_section(raw: Raw, cpu_accept: Path | None = None) -> list[str]:
    builds = [n for n in (*BUILD_ORDER, *sorted(mutant_names(raw))) if read(raw / f"build-{n}.err")]
    if not builds and not read(raw / "deploy-base.err"):
        return []
    md = [
        "## The real model on the CUDA pair: baseline, candidate, mutants (issues 42, 43)",
        "",
        '`benchmarks/gpu/run.sh call1`, `call2`, `call3` (README, "GPU run"): SmolLM2-135M-Instruct Q4_1 served by',
        "llama-server with `--rpc` to ggml-rpc-server on the same GPU (local transport, inventory",
        "`benchmarks/gpu/config/inventories/gpu-real.yaml`, profile `lab-real`); packages for target `h200` (sm_90).",
        "",
    ]
    if builds:
        md += [
            "### Builds (`pairctl build --rev baseline --target h200 --profile gpu`, in the background)",
            "",
            "| build | patch | exit | wall s | seconds per phase | ccache | package |",
            "|---|---|---:|---:|---|---|---|",
        ]
        for n in builds:
            rc, secs = rc_seconds(raw, f"build-{n}")
            hits = re.search(r"Hits:\s+(\d+)\s*/\s*(\d+)", read(raw / f"ccache-after-{n}.txt"))
            patch = {"base": "–", "sm90": "benchmarks/gpu/mmvf-warp-per-row-sm90"}.get(n, f"tests/mutants/{n}")
            state = rc if rc != "–" else "still building"
            md += [
                f"| {n} | {patch} | {state} | {secs} | {build_phases(read(raw / f'build-{n}.err'))} | "
                f"{f'{hits.group(1)}/{hits.group(2)} hits (cumulative)' if hits else '–'} | "
                f"{read(raw / f'build-{n}.pkg') or '–'} |"
            ]
        md += [""]
    if not read(raw / "deploy-base.err"):
        return md
    rc, secs = rc_seconds(raw, "deploy-base")
    rec = load_json(raw / "receipt-deploy-base.json")
    md += [
        "### The baseline: deployed with the whole suite, then accepted three times",
        "",
        f"Deploy exit {rc}, {secs} s wall with its acceptance (the route's first: it records the reference "
        f"answers)" + (f"; the deploy's own steps {own} s." if (own := deploy_seconds(rec)) != "–" else "."),
        "",
    ]
    runs = [("deploy", checks_in(rec.get("acceptance") if isinstance(rec, dict) else None))]
    runs += [(f"accept {i}", checks_in(load_json(raw / f"accept-{i}.out"))) for i in (1, 2, 3)]
    runs = [(label, c) for label, c in runs if c]
    cpu, cpu_label = cpu_lab_checks(cpu_accept)
    names = list(dict.fromkeys(n for _, c in runs for n in c))
    if names:
        head = [label for label, _ in runs] + ([cpu_label] if cpu else [])
        md += [
            "Verdict and seconds per check on the GPU" + (", beside the CPU lab's:" if cpu else ":"),
            "",
            "| check | " + " | ".join(head) + " |",
            "|---|" + "---|" * len(head),
        ]
        for n in names:
            cells = []
            for _, c in runs:
                d = c.get(n)
                cells.append(f"{d['verdict']} {float(d.get('duration_s') or 0):.1f} s" if d else "–")
            if cpu:
                d = cpu.get(n)
                cells.append(f"{d['verdict']} {float(d.get('duration_s') or 0):.1f} s" if d else "–")
            md += [f"| {n} | " + " | ".join(cells) + " |"]
        md += [""]
    for i in (1, 2, 3):
        arc, asecs = rc_seconds(raw, f"accept-{i}")
        if arc != "–":
            md += [f"- accept {i}: exit {arc}, {asecs} s"]
    failing = [(label, n, d.get("message", "")) for label, c in runs for n, d in c.items() if d["verdict"] != "passed"]
    if failing:
        md += ["", "Checks that did not pass:", ""]
        md += [f"- {label}: `{n}`: {msg}" for label, n, msg in failing]
    mem = memory_lines(read(raw / "deploy-base-native-llama-server.log"))
    vram = [int(x) for x in re.findall(r",\s*(\d+)\s*$", read(raw / "vram-real.csv"), re.M)]
    if mem or vram:
        md += ["", "### Memory", ""]
        if mem:
            md += ["Per device, from llama-server's load log at the baseline's deploy (target and draft together):", ""]
            md += [*mem, ""]
        if vram:
            md += [f"GPU memory used, nvidia-smi every 0.5 s during call 3: peak {max(vram)} MiB, "
                   f"first sample {vram[0]} MiB ({len(vram)} samples)."]  # fmt: skip
    verdict = read(raw / "candidate-sm90.verdict")
    if verdict:
        crc, csecs = rc_seconds(raw, "candidate-sm90")
        crec = load_json(raw / "receipt-candidate-sm90.json")
        cc = checks_in(crec.get("acceptance") if isinstance(crec, dict) else None)
        ref = cc.get("reference_logprobs", {}).get("figures") or {}
        rrc, rsecs = rc_seconds(raw, "rollback-sm90")
        passed = sum(d["verdict"] == "passed" for d in cc.values())
        md += [
            "",
            "### The MMVF candidate (`benchmarks/gpu/mmvf-warp-per-row-sm90`), deployed with the whole suite",
            "",
            f"Verdict: **{verdict}** (deploy exit {crc}, {csecs} s"
            + (f"; {passed} of {len(cc)} checks passed)." if cc else ").")
            + (f" reference_logprobs: mean KL {g(ref.get('mean_kl'))}, max KL {g(ref.get('max_kl'))}, top-1 "
               f"{g(ref.get('top1'))}, max |dlogprob| {g(ref.get('max_abs_dlogprob'))}." if ref else "")
            + (f" Then `pairctl rollback` to the baseline: exit {rrc}, {rsecs} s." if rrc != "–" else ""),
        ]  # fmt: skip
    md += numerics_lines(raw, runs)
    judged = [n for n in mutant_names(raw) if read(raw / f"mutant-{n}.verdict")]
    if judged:
        md += [
            "",
            "### Mutants (tests/mutants), each deployed with `--checks` its check onto the accepted baseline",
            "",
            "| mutant | exit | seconds | verdict |",
            "|---|---:|---:|---|",
        ]
        for n in judged:
            mrc, msecs = rc_seconds(raw, f"mutant-{n}")
            md += [f"| {n} | {mrc} | {msecs} | {read(raw / f'mutant-{n}.verdict')} |"]
        ok = sum(read(raw / f"mutant-{n}.verdict").startswith("rejected by") for n in judged)
        md += ["", f"{ok} of {len(judged)} rejected by the check meant for each, the baseline restored after each."]
    return [*md, ""]


COMPARISONS = ("two_lane_near_full", "speculative", "cached_continuation")


def numerics_lines(raw: Raw, runs: list[tuple[str, dict[str, dict[str, Any]]]]) -> list[str]:
    """The comparison checks' judgement under the device's numerics (checks/parting.py): the
    tolerance each run measured on the pair, how often two runs parted at a near-tie, the widest."""
    rows = list(runs)
    crec = load_json(raw / "receipt-candidate-sm90.json")
    if isinstance(crec, dict):
        rows.append(("candidate sm90", checks_in(crec.get("acceptance"))))
    for n in mutant_names(raw):
        mrec = load_json(raw / f"receipt-mutant-{n}.json")
        if isinstance(mrec, dict):
            rows.append((f"mutant {n}", checks_in(mrec.get("acceptance"))))
    out = []
    for label, c in rows:
        for name in COMPARISONS:
            f = (c.get(name) or {}).get("figures") or {}
            if "tolerance_nats" in f:
                out.append(
                    f"| {label} | {name} | {c[name]['verdict']} | {g(f.get('tolerance_nats'))} | "
                    f"{f.get('partings')} | {g(f.get('max_parting_margin'))} |"
                )
    if not out:
        return []
    return [
        "",
        "### Comparisons under the device's numerics",
        "",
        "Two runs of the model (two lanes against solo, drafted against draft-free, cached against uncached)",
        "may part only at a near-tie within the tolerance measured on the pair in the same run (twin lanes",
        "against solo: `checks/batch_floor.py`); each parting's margin is the reference side's own.",
        "",
        "| run | check | verdict | tolerance (nats) | partings | widest margin (nats) |",
        "|---|---|---|---:|---:|---:|",
        *out,
    ]


_CUBIN = re.compile(r"^(ELF|PTX) file\s+\d+: .*?\.(sm_\w+)\.(?:cubin|ptx)$", re.M)
_RUNS_NOT = {
    "v100": "not run: no V100 was lent; a Hopper GPU would run it only by compiling its embedded PTX at load, "
    "which is not how a V100 runs it",
    "rtx5060ti": "not run: no RTX 5060 Ti was lent, and a Hopper GPU cannot run sm_120 code",
}


def gpu_code(text: str) -> dict[str, dict[str, list[str]]]:
    """`cuobjdump --list-elf/--list-ptx` output per binary → {binary: {"ELF": [sm_..], "PTX": [sm_..]}}."""
    out: dict[str, dict[str, list[str]]] = {}
    for block in text.split("$ cuobjdump ")[1:]:
        binary = block.split("\n", 1)[0].split()[-1]
        for kind, arch in _CUBIN.findall(block):
            found = out.setdefault(binary, {"ELF": [], "PTX": []})[kind]
            found += [arch] if arch not in found else []
    return out


def production_section(raw: Raw) -> list[str]:
    """The v100 and rtx5060ti packages built without a GPU (benchmarks/gpu/production.py's files)."""
    rows = []
    for t in ("v100", "rtx5060ti"):
        m = load_json(raw / f"prod-{t}.manifest.json")
        if not isinstance(m, dict):
            continue
        tc, code = m.get("toolchain", {}), gpu_code(read(raw / f"prod-{t}.cuobjdump.txt"))
        arches = "; ".join(
            f"{b}: ELF {', '.join(k['ELF']) or 'none'}, PTX {', '.join(k['PTX']) or 'none'}" for b, k in code.items()
        )
        rows += [
            f"| {t} | {m.get('id')} | {tc.get('nvcc', '?')} | {tc.get('cuda_from', '?')} | "
            f"{m.get('cmake_flags', {}).get('CMAKE_CUDA_ARCHITECTURES', '?')} | {arches or 'not listed'} | "
            f"{_RUNS_NOT[t]} |"
        ]
    if not rows:
        return []
    return [
        "## Production packages built without a GPU (`pairctl build --target v100 --target rtx5060ti`)",
        "",
        "Built on a 2-core machine without a GPU, each target with the first toolkit that can build it",
        "(docs/guides/cuda-toolchain.md); the architectures are what `cuobjdump` lists in the package's binaries.",
        "",
        "| target | package | nvcc | toolkit from | CMAKE_CUDA_ARCHITECTURES | GPU code in the binaries | ran |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def mutant_names(raw: Raw) -> list[str]:
    """Mutants this run built or judged, in the order run.sh took them (steps.log)."""
    seen: dict[str, None] = {}
    for line in raw.steps():
        m = re.search(r"\] (?:build|mutant) ([a-z0-9-]+)[: ]", line)
        if m and m.group(1) not in BUILD_ORDER:
            seen[m.group(1)] = None
    return list(seen)


if __name__ == "__main__":
    argv = sys.argv[1:]
    cpu = None
    if "--cpu-accept" in argv:
        i = argv.index("--cpu-accept")
        cpu = Path(argv[i + 1])
        del argv[i : i + 2]
    if len(argv) < 2:
        sys.exit(__doc__)
    main(Path(argv[0]), Raw([Path(a) for a in argv[1:]]), cpu)
