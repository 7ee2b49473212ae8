"""`pairctl doctor`: check the operator's machine before a job, and say what to fix.

Reads only local files and runs only `--version`-style probes: it never connects to a host,
so it is safe to run anywhere, any time.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import paramiko

from orchestrator.config.inventory import Inventory
from orchestrator.config.targets import Target


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _version(argv: list[str]) -> str | None:
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if text else ""


def check_tools() -> list[Finding]:
    out = []
    for tool, argv, pkg in (
        ("git", ["git", "--version"], "git"),
        ("cmake", ["cmake", "--version"], "cmake"),
        ("ninja", ["ninja", "--version"], "ninja-build"),
        ("c++", ["c++", "--version"], "g++"),
        ("ccache", ["ccache", "--version"], "ccache"),
        ("ssh-keygen", ["ssh-keygen", "-V"], "openssh-client"),
    ):
        v = _version(argv) if tool != "ssh-keygen" else ("present" if shutil.which("ssh-keygen") else None)
        out.append(Finding(f"tool:{tool}", v is not None, v or "not found", "" if v else f"apt-get install {pkg}"))
    return out




def check_nvcc_for(targets: list[Target]) -> list[Finding]:
    cuda = [t for t in targets if t.backend == "cuda"]
    if not cuda:
        return []
    v = _version(["nvcc", "--version"])
    if v is None:
        return [Finding("tool:nvcc", False, "nvcc not found", "install a CUDA toolkit for: " + ", ".join(t.name for t in cuda))]
    full = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"release (\d+)\.(\d+)", full)
    major = int(m.group(1)) if m else None
    arches = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True, timeout=20).stdout.split()
    out = []
    for t in cuda:
        want = f"compute_{t.cuda_arch}"
        ok = want in arches and not (t.cuda_major_max and major and major > t.cuda_major_max)
        fix = ""
        if not ok:
            fix = f"target {t.name} needs a CUDA toolkit that offers {want}"
            if t.cuda_major_max:
                fix += f" (CUDA {t.cuda_major_max}.x; CUDA {major} cannot target sm_{t.cuda_arch})"
        out.append(Finding(f"cuda:{t.name}", ok, f"nvcc {m.group(0) if m else '?'}; {want} {'offered' if want in arches else 'not offered'}", fix))
    return out


def check_inventory(inv: Inventory) -> list[Finding]:
    out = []
    kh_path = Path(inv.known_hosts)
    known = paramiko.HostKeys()
    if kh_path.exists():
        try:
            known.load(str(kh_path))
            out.append(Finding("known_hosts", True, str(kh_path)))
        except Exception as exc:
            out.append(Finding("known_hosts", False, f"{kh_path}: unreadable ({exc})", "fix or regenerate the file"))
    else:
        out.append(Finding("known_hosts", False, f"{kh_path} does not exist", "ssh-keyscan each host, check fingerprints out of band, write them there"))
    for name, h in sorted(inv.hosts.items()):
        if h.transport == "local":
            out.append(Finding(f"host:{name}", True, "local transport"))
            continue
        entry = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
        has = known.lookup(entry) is not None
        out.append(Finding(
            f"known_host:{name}", has, f"{entry} {'present' if has else 'missing'}",
            "" if has else f"add {entry}'s host key to {kh_path} after checking its fingerprint",
        ))
        if h.key:
            kp = Path(h.key)
            if not kp.exists():
                out.append(Finding(f"key:{name}", False, f"{kp} missing", f"create it or fix 'key' for host {name}"))
            else:
                mode = stat.S_IMODE(kp.stat().st_mode)
                ok = not (mode & 0o077)
                out.append(Finding(f"key:{name}", ok, f"{kp} mode {mode:o}", "" if ok else f"chmod 600 {kp}"))
    return out


def run_doctor(inv: Inventory | None, targets: list[Target]) -> list[Finding]:
    findings = check_tools() + check_nvcc_for(targets)
    if inv is not None:
        findings += check_inventory(inv)
    return findings


def env_summary() -> dict[str, str]:
    return {"PAIRCTL_HOME": os.environ.get("PAIRCTL_HOME", "")}
