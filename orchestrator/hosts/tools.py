"""The programs pairctl runs on each host, by Debian package, and one SSH exec that names the
missing ones (`pairctl doctor --hosts`, before a deploy finds out half-way).
tests/unit/test_host_tools.py scans the scripts and argv lists so that no program runs on a host
that this list does not name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orchestrator.config.inventory import HostSpec
from orchestrator.remote.command import Cmd

When = Literal["always", "pairctl", "systemd", "service_user", "optional"]


@dataclass(frozen=True)
class ToolGroup:
    package: str  # the Debian package that provides them
    tools: tuple[str, ...]
    why: str
    when: When = "always"  # "pairctl"/"systemd": that service_manager; "optional": used when present


TOOL_GROUPS: tuple[ToolGroup, ...] = (
    ToolGroup("dash (or any POSIX sh)", ("sh",), "runs pairctl-svc, the host helper, and pairctl's fixed scripts"),
    ToolGroup(
        "coreutils",
        tuple(
            "timeout env cat head tail cut tr wc sort od base64 sha256sum stat readlink ln mv rm cp mkdir mktemp "
            "chmod chown dirname date sleep id ls df du".split()
        ),
        "bound every command (timeout), hash releases and models (sha256sum), switch links, read pid and log files",
    ),
    ToolGroup("findutils", ("find", "xargs"), "list and hash a release's files"),
    ToolGroup("grep", ("grep",), "read the server's log lines (identity, split, cancellation)"),
    ToolGroup("sed", ("sed",), "read process state from /proc"),
    ToolGroup("mawk (or gawk)", ("awk",), "match a service's sockets in /proc/net/tcp"),
    ToolGroup("tar", ("tar",), "unpack an uploaded release"),
    ToolGroup("procps", ("ps",), "stop a supervisor's process group"),
    ToolGroup(
        "util-linux", ("setsid",), "start each supervisor in its own session (it outlives the SSH login)", "pairctl"
    ),
    ToolGroup("cron", ("crontab",), "start the supervisors again at boot (@reboot)", "pairctl"),
    ToolGroup("systemd", ("systemctl", "systemd-analyze"), "run and verify the services' units", "systemd"),
    ToolGroup("util-linux", ("setpriv",), "run the servers as the inventory's service_user", "service_user"),
    ToolGroup("iproute2", ("ss",), "optional: listening sockets (else /proc/net/tcp is read)", "optional"),
    ToolGroup(
        "bash", ("bash",), "optional: probe a port with /dev/tcp (else the port is assumed listening)", "optional"
    ),
    ToolGroup("nvidia driver", ("nvidia-smi",), "optional: GPU memory in acceptance telemetry", "optional"),
)

# Fixed text: the tools arrive as positional arguments; prints the missing ones, one a line.
MISSING_SH = 'for t in "$@"; do command -v "$t" >/dev/null 2>&1 || echo "$t"; done'


def groups_for(host: HostSpec) -> list[ToolGroup]:
    """The groups this host needs (and the optional ones), by its supervision and service user."""
    wanted: set[When] = {"always", "optional", host.service_manager}
    if host.service_user:
        wanted.add("service_user")
    return [g for g in TOOL_GROUPS if g.when in wanted]


def missing_cmd(host: HostSpec) -> Cmd:
    tools = sorted({t for g in groups_for(host) for t in g.tools})
    return Cmd(("sh", "-c", MISSING_SH, "pairctl-tools", *tools))


def judge(host: HostSpec, missing: set[str]) -> tuple[bool, str, str]:
    """(all required found, what was found, the fix) for the host's answer to `missing_cmd`."""
    groups = groups_for(host)
    need = [g for g in groups if g.when != "optional" and missing & set(g.tools)]
    nice = [g for g in groups if g.when == "optional" and missing & set(g.tools)]
    count = sum(len(g.tools) for g in groups)
    lines = [f"{', '.join(sorted(missing & set(g.tools)))} ({g.package}: {g.why})" for g in need]
    detail = f"missing {'; '.join(lines)}" if need else f"{count - len(missing)} of {count} tools found"
    if nice:
        detail += "; not installed, optional: " + "; ".join(
            f"{', '.join(sorted(missing & set(g.tools)))} ({g.why.removeprefix('optional: ')})" for g in nice
        )
    fix = f"apt-get install {' '.join(sorted({g.package.split(' ')[0] for g in need}))} on the host" if need else ""
    return not need, detail, fix
