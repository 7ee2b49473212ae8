"""The split of the model between the pair's devices, read from llama-server's own load log.

Nothing over HTTP says the RPC host holds part of the model; llama-server logs it while loading
at `--log-verbosity 4`: per buffer (named after its device: `RPC0[host:port]`, `CUDA0`,
`CPU_Mapped`) the model and KV buffer sizes, the total `offloaded N/M layers`, and at level 5
`layer N assigned to device D`. Layers per device come from the debug lines when present, else
from the offloaded count: all of it when one non-CPU device holds weights, else shared between the
accelerators in proportion to their model buffer bytes (an estimate, said so in `layers_from`).
The parse uses the first load that really loads (`load_mode` other than `none`) up to the draft
model or `load_model: initializing`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from orchestrator.config.split import LOG_VERBOSITY, SplitExpectation
from orchestrator.hosts.probes import log_unwritable, service_dir
from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text
from orchestrator.roles import LLAMA_SERVER

if TYPE_CHECKING:  # checks.base imports the profile models; the check context is only a type here
    from orchestrator.checks.base import CheckContext

CPU = "CPU"
_LOAD = re.compile(r"load_tensors: loading model tensors.*\(load_mode = (\w[\w+]*)\)")
_END = ("load_model: initializing", "loading draft model")
_MODEL = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([0-9.]+) MiB")
_KV = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([0-9.]+) MiB")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")
_LAYER = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")
MARKERS = ("load_tensors:", "llama_kv_cache:", "load_model: initializing", "loading draft model")
LOG_FILE = "llama-server.log"  # the --log-file pairctl renders; it starts anew with each server start


def device_of(buffer: str) -> str:
    """`RPC0[127.0.0.3:50052]` -> `RPC0`; `CPU_Mapped`, `CPU_REPACK`, `CPU` -> `CPU`."""
    name = buffer.split("[", 1)[0]
    return CPU if name.upper().startswith("CPU") else name


def _target_section(lines: list[str]) -> list[str]:
    out: list[str] = []
    inside = False
    for line in lines:
        m = _LOAD.search(line)
        if m and not inside:
            inside = m.group(1) != "none"
            continue
        if m and inside:
            break  # a second real load (the draft model): the target's section is over
        if inside and any(e in line for e in _END):
            break
        if inside:
            out.append(line)
    return out


def parse_load_split(text: str) -> dict[str, Any] | None:
    """{devices: {name: {model_mib, kv_mib, layers}}, offloaded, n_layers_total, layers_from} or
    None when the log holds no load section (the verbosity was too low)."""
    section = _target_section(text.splitlines())
    if not section:
        return None
    devices: dict[str, dict[str, Any]] = {}

    def dev(name: str) -> dict[str, Any]:
        return devices.setdefault(name, {"model_mib": 0.0, "kv_mib": 0.0, "layers": None})

    offloaded = total = None
    layer_dev: dict[int, str] = {}
    for line in section:
        if m := _MODEL.search(line):
            dev(device_of(m.group(1)))["model_mib"] += float(m.group(2))
        elif m := _KV.search(line):
            dev(device_of(m.group(1)))["kv_mib"] += float(m.group(2))
        elif m := _OFFLOADED.search(line):
            offloaded, total = int(m.group(1)), int(m.group(2))
        elif m := _LAYER.search(line):
            layer_dev.setdefault(int(m.group(1)), device_of(m.group(2)))
    layers_from = None
    if layer_dev:
        for name in set(layer_dev.values()):
            dev(name)["layers"] = sum(1 for d in layer_dev.values() if d == name)
        layers_from = "debug: layer N assigned to device"
    elif offloaded is not None and total is not None:
        holders = [n for n, d in devices.items() if n != CPU and d["model_mib"] > 0]
        if len(holders) == 1:
            dev(holders[0])["layers"] = offloaded
            dev(CPU)["layers"] = total - offloaded
            layers_from = "offloaded N/M layers, one accelerator"
        elif not holders:
            dev(CPU)["layers"] = total
            layers_from = "offloaded N/M layers, no accelerator holds weights"
        else:
            shares = _shares(offloaded, {n: devices[n]["model_mib"] for n in holders})
            for n, k in shares.items():
                dev(n)["layers"] = k
            dev(CPU)["layers"] = total - offloaded
            layers_from = "offloaded N/M layers shared by model buffer bytes between accelerators (estimate)"
    for d in devices.values():
        d["model_mib"] = round(d["model_mib"], 2)
        d["kv_mib"] = round(d["kv_mib"], 2)
    return {"devices": devices, "offloaded": offloaded, "n_layers_total": total, "layers_from": layers_from}


def _shares(n: int, weights: dict[str, float]) -> dict[str, int]:
    """`n` split in proportion to `weights` by largest remainder (the parts sum to `n`)."""
    total = sum(weights.values())
    exact = {k: n * w / total for k, w in weights.items()}
    out = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[: n - sum(out.values())]:
        out[k] += 1
    return out


def split_problems(split: dict[str, Any] | None, expect: SplitExpectation) -> list[str]:
    """What the profile's `split` declares, against the parsed load log."""
    if split is None:
        return [
            f"the server's log shows no model load (run it with --log-verbosity {LOG_VERBOSITY}: the profile's "
            "split sets it)"
        ]
    rpc = {n: d for n, d in split["devices"].items() if n.startswith("RPC")}
    p = []
    if not rpc:
        p.append("no RPC device holds a buffer: the RPC host holds nothing of the model")
        return p
    layers = sum(d["layers"] or 0 for d in rpc.values())
    known = all(d["layers"] is not None for d in rpc.values())
    if not known:
        p.append(f"layers per RPC device are not in the log (offloaded count missing; log level {LOG_VERBOSITY})")
    elif layers < expect.rpc_min_layers:
        how = f" ({split['layers_from']})" if "estimate" in str(split.get("layers_from")) else ""
        p.append(f"the RPC device(s) hold {layers} layers{how}, the profile expects at least {expect.rpc_min_layers}")
    model = sum(d["model_mib"] for d in rpc.values())
    if model < expect.rpc_min_model_mib or model <= 0:
        p.append(f"the RPC device(s) hold {model:g} MiB of weights, the profile expects at least "
                 f"{expect.rpc_min_model_mib:g} MiB")  # fmt: skip
    kv = sum(d["kv_mib"] for d in rpc.values())
    if expect.rpc_kv and kv <= 0:
        p.append("the RPC device(s) hold no KV cache, the profile expects part of it there")
    return p


def log_grep_cmd(root: str, file: str, *texts: str, most: int = 20, folder: str | None = None) -> Cmd:
    """Lines of `<folder>/<file>` holding any of the fixed strings (no shell, no regex), at most `most`.
    FOLDER: where llama-server keeps its files now (probes.service_dir), `<root>/run` when not given."""
    argv: list[str] = ["grep", "-F", "-m", str(most)]
    for t in texts:
        argv += ["-e", t]
    return Cmd((*argv, "--", f"{folder or root.rstrip('/') + '/run'}/{file}"))


def read_split(ctx: CheckContext) -> dict[str, Any]:
    """The split as the native host's server log states it now: {split, problems} (never raises)."""
    expect = ctx.profile.split
    tr, root = ctx.transports.get("native"), ctx.host_roots.get("native")
    if expect is None:
        return {"split": None, "problems": []}
    if tr is None or root is None:
        return {"split": None, "problems": ["split: no transport to the native host to read its server log"]}
    try:
        d = service_dir(tr, root, LLAMA_SERVER)
        r = tr.run(log_grep_cmd(root, LOG_FILE, *MARKERS, most=4000, folder=d), check=False, timeout=30)
    except Exception as exc:  # a host error is an identity problem, not a crash of the suite
        return {"split": None, "problems": [f"split: cannot read the server log: {type(exc).__name__}: {exc}"]}
    split = parse_load_split(as_text(r.stdout))
    # no load in a log its server could never write (a service user in the runtime dir): that, not -lv
    why = log_unwritable(tr, ctx.host_names.get("native", tr.name), root, d, LLAMA_SERVER) if split is None else None
    return {"split": split, "problems": [f"split: {p}" for p in ([why] if why else split_problems(split, expect))]}
