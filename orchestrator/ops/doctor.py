"""`pairctl doctor`: check the operator's machine before a job, and say what to fix. Local files
and `--version`-style probes only; with `--hosts`, one exec per host naming the programs it lacks."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.build.toolchain import check_toolchain
from orchestrator.config.inventory import Inventory, api_key_file_problems
from orchestrator.config.targets import Target
from orchestrator.errors import BuildError, PairctlError
from orchestrator.hosts import tools
from orchestrator.remote.known_hosts import known_hosts_name
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import Transport


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def check_tools(targets: list[Target]) -> list[Finding]:
    """The build toolchain per target, judged by the same check `pairctl build` runs first."""
    out = []
    for tool, pkg in (("git", "git"), ("ssh-keygen", "openssh-client")):
        found = shutil.which(tool)
        out.append(
            Finding(f"tool:{tool}", bool(found), found or "not found", "" if found else f"apt-get install {pkg}")
        )
    for t in targets:
        try:
            tc = check_toolchain(t)
            out.append(Finding(f"toolchain:{t.name}", True, ", ".join(f"{k} {v}" for k, v in tc.versions().items())))
        except BuildError as exc:
            out.append(Finding(f"toolchain:{t.name}", False, exc.message, exc.hint or "install the missing tools"))
    if not shutil.which("ccache"):
        why = "not found (rebuilds of other revisions recompile everything)"
        out.append(Finding("tool:ccache", False, why, "apt-get install ccache"))
    return out


def check_inventory(inv: Inventory) -> list[Finding]:
    out = []
    kh_path = Path(inv.known_hosts)
    import paramiko  # here, not at import: the CLI starts (and local-transport hosts work) without it

    known = paramiko.HostKeys()
    if kh_path.exists():
        try:
            known.load(str(kh_path))
            out.append(Finding("known_hosts", True, str(kh_path)))
        except Exception as exc:
            out.append(Finding("known_hosts", False, f"{kh_path}: unreadable ({exc})", "fix or regenerate the file"))
    else:
        fix = "ssh-keyscan each host, check fingerprints out of band, write them there"
        out.append(Finding("known_hosts", False, f"{kh_path} does not exist", fix))
    for name, h in sorted(inv.hosts.items()):
        if h.transport == "local":
            out.append(Finding(f"host:{name}", True, "local transport"))
            continue
        entry = known_hosts_name(h.address, h.port)
        has = known.lookup(entry) is not None
        fix = "" if has else f"add {entry}'s host key to {kh_path} after checking its fingerprint"
        out.append(Finding(f"known_host:{name}", has, f"{entry} {'present' if has else 'missing'}", fix))
        if h.key:
            kp = Path(h.key)
            if not kp.exists():
                out.append(Finding(f"key:{name}", False, f"{kp} missing", f"create it or fix 'key' for host {name}"))
            else:
                mode = stat.S_IMODE(kp.stat().st_mode)
                ok = not (mode & 0o077)
                out.append(Finding(f"key:{name}", ok, f"{kp} mode {mode:o}", "" if ok else f"chmod 600 {kp}"))
    for pair_name, pair in inv.pairs.items():  # what deploy would refuse, found before a deploy
        if pair.api_key_file:
            problems = api_key_file_problems(pair_name, pair.api_key_file)
            out.append(Finding(f"api_key_file:{pair_name}", not problems, "; ".join(problems) or pair.api_key_file,
                               "; ".join(p.split("; ", 1)[-1] for p in problems if "; " in p)))  # fmt: skip
    return out


def check_host_tools(inv: Inventory, transports: Mapping[str, Transport]) -> list[Finding]:
    """Per host, one exec naming every program pairctl needs there and lacks (hosts/tools.py)."""
    out = []
    for name, t in sorted(transports.items()):
        spec = inv.host(name)
        try:
            res = t.run(tools.missing_cmd(spec), check=False, timeout=TOOLS_TIMEOUT_S)
        except PairctlError as exc:
            out.append(Finding(f"host_tools:{name}", False, f"not reachable: {exc}", "fix the connection first"))
            continue
        text = as_text(res.stdout)
        if res.exit_status != 0:  # sh or timeout itself missing (127), or the login failed
            err = (as_text(res.stderr).strip().splitlines() or [f"exit {res.exit_status}"])[0]
            out.append(Finding(f"host_tools:{name}", False, f"the tool check did not run: {err}",
                               "apt-get install coreutils dash on the host"))  # fmt: skip
            continue
        ok, detail, fix = tools.judge(spec, set(text.split()))
        out.append(Finding(f"host_tools:{name}", ok, detail, fix))
    return out


TOOLS_TIMEOUT_S = 30.0


def run_doctor(
    inv: Inventory | None, targets: list[Target], transports: Mapping[str, Transport] | None = None
) -> list[Finding]:
    findings = check_tools(targets)
    if inv is not None:
        findings += check_inventory(inv)
        if transports:
            findings += check_host_tools(inv, transports)
    return findings
