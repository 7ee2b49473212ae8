"""Issue 42 item 4: no program run on a host that `doctor --hosts` does not check and explain.

The scan reads what pairctl sends hosts: the words in command position of pairctl-svc.sh and of
the fixed `sh -c` scripts, and the program of every literal argv (`Cmd(("x", ...))`, `Cmd.of("x",
...)`, `argv = ["x", ...]`) under orchestrator/. A word counts when it is a program on this machine
(case labels and awk text are not), so a new tool used anywhere fails here until hosts/tools.py
names it with its package and use.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from orchestrator.checks import telemetry
from orchestrator.config.inventory import HostSpec
from orchestrator.engine.actions import host
from orchestrator.hosts import prune, tools

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"
KEYWORDS = set(
    "if then else elif fi for while until do done case esac in return exit break continue shift set unset "
    "export local readonly echo printf test [ true false cd read kill command exec wait trap eval umask : . pwd".split()
)


def commands(script: str) -> set[str]:
    """Programs in command position of a POSIX sh script (functions it defines left out)."""
    defined = set(re.findall(r"^\s*([A-Za-z_]\w*)\s*\(\)", script, re.M))
    out = set()
    for raw in script.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw)
        line = re.sub(r"^\s*[\w.*|-]+\)", "", line)  # a case label (`watch)`) is no command
        line = re.sub(r"'[^']*'", "''", line)
        line = re.sub(r'"(?:[^"\\$]|\\.)*"', '""', line)
        for seg in re.split(r"\|\||&&|[;|&`(){}]|\$\(|\bthen\b|\bdo\b|\belse\b", line):
            words = [w for w in seg.split() if not re.match(r"^\w+=", w) and w != "!"]
            if words and re.fullmatch(r"[a-z][\w.-]*", words[0]) and words[0] not in KEYWORDS | defined:
                out.add(words[0])
    return {w for w in out if shutil.which(w)}


LOCAL = {"cli", "build", "lab", "qualify", "bisect", "config", "evidence", "ops"}  # ops: but logs.py (below)


def argv_programs() -> set[str]:
    out = set()
    for f in [*ROOT.rglob("*.py"), ROOT / "ops" / "logs.py"]:
        if f.relative_to(ROOT).parts[0] in LOCAL and f.name != "logs.py":
            continue  # the operator's machine (the CLI's own argv, builds, the lab's sshd), not a host
        src = f.read_text()
        out |= set(re.findall(r'Cmd\((?:argv=)?\(\s*"([a-z][\w.-]*)"', src))
        out |= set(re.findall(r'Cmd\.of\(\s*"([a-z][\w.-]*)"', src))
        out |= set(re.findall(r'argv(?:: list\[str\])? = \[\s*"([a-z][\w.-]*)"', src))
    return out


def test_every_program_pairctl_runs_on_a_host_is_one_doctor_checks():
    listed = {t for g in tools.TOOL_GROUPS for t in g.tools}
    svc = (ROOT / "hosts" / "pairctl-svc.sh").read_text()
    scripts = [svc, telemetry.SAMPLE_SCRIPT, host._SERVICE_USER_SH, prune.REMOVE_SH, tools.MISSING_SH]
    used = set().union(*(commands(s) for s in scripts)) | argv_programs()
    # the operator side's own commands (run locally, not on a host)
    assert {"timeout", "sha256sum", "setsid", "grep", "cat", "df"} <= used  # the scan sees them
    assert used <= listed, f"run on hosts but not checked by doctor --hosts: {sorted(used - listed)}"


def _host(**kw: object) -> HostSpec:
    return HostSpec.model_validate({"address": "10.0.0.1", "install_root": "/srv/p", "role": "native", **kw})


def test_the_tools_a_host_needs_follow_its_supervision_and_are_explained():
    plain = tools.missing_cmd(_host()).argv
    assert plain[:3] == ("sh", "-c", tools.MISSING_SH) and "setsid" in plain and "crontab" in plain
    assert "systemctl" not in plain and "setpriv" not in plain
    sd = tools.missing_cmd(_host(service_manager="systemd")).argv
    assert "systemd-analyze" in sd and "crontab" not in sd
    ok, detail, fix = tools.judge(_host(), {"setsid", "ss"})
    assert not ok and "setsid (util-linux: start each supervisor" in detail
    assert fix == "apt-get install util-linux on the host"
    assert "optional: ss" in detail
    ok, detail, fix = tools.judge(_host(), {"ss", "nvidia-smi"})  # only optional ones: fine, and said
    assert ok and not fix and "ss (listening sockets" in detail
