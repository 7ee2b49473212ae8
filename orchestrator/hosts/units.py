"""systemd units for a pair's services (pure rendering), and their check by `systemd-analyze verify`.

With `service_manager: systemd`, each service's supervisor (`pairctl-svc supervise`, the same loop
as elsewhere) runs as an enabled unit: systemd starts it at boot, restarts it and stops the whole
tree; the supervisor keeps what systemd 252 cannot (exponential backoff, a /health hang check
without sd_notify, restarting llama-server when its RPC peer went away, holding still under a
lease). The service's exact argv is the tail of ExecStart. `pairctl-svc` verifies the staged text
with the host's own `systemd-analyze` before anything is stopped, and prints back what it installed.
"""

from __future__ import annotations

import math
import posixpath
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.config.inventory import Supervision
from orchestrator.errors import ConfigError, HostError
from orchestrator.hashing import sha256_bytes

Scope = Literal["user", "system"]


def unit_name(pair: str, service: str, root: str) -> str:
    """`pairctl-PAIR-SERVICE-ROOTHASH.service`: the root's hash keeps two roots of one user from
    sharing a unit (pairctl-svc recomputes it, so a unit record can only name this root's)."""
    return f"pairctl-{pair}-{service}-{root_tag(root)}.service"


def root_tag(root: str) -> str:
    return sha256_bytes(root.encode())[:8]


def exec_quote(arg: str) -> str:
    """One ExecStart= word: double-quoted with systemd's C-style escapes (`\\xNN` for a control
    character) and `$`/`%` doubled, so every argument a profile may hold is written exactly."""
    if "\0" in arg:
        raise ConfigError(f"argument {arg!r} holds a NUL byte, which no argv can carry")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    escaped = "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in escaped)
    return f'"{escaped}"'


def _spec(value: str) -> str:
    """A path setting: `%` doubled (specifiers); such settings take no escapes, so a control
    character is refused (the inventory refuses it already; this guards the rendering)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ConfigError(f"path {value!r} holds a control character; it cannot be written into a unit")
    return value.replace("%", "%%")


# Hardening every unit gets: what a user manager applies without namespaces (seccomp, no_new_privs).
# The servers need TCP/IP and the resolver (AF_NETLINK: getaddrinfo's AI_ADDRCONFIG), nothing more;
# devices (GPUs) and the network stay open.
HARDENING_COMMON = (
    "NoNewPrivileges=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "SystemCallArchitectures=native",
    # calls no server or supervisor makes (clock setting, kernel modules, mounts, swap, reboot,
    # raw I/O ports, ptrace and perf): refused with EPERM rather than a SIGSYS kill
    "SystemCallFilter=~@clock @cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap",
    "SystemCallErrorNumber=EPERM",
    "UMask=0077",
)
# Added in the system manager, where the supervisor runs as root (it drops the service to
# service_user itself): a read-only OS and root except run/, a private /tmp, and only the
# capabilities the supervisor uses. No PrivateDevices=: the GPU device nodes must stay reachable.
HARDENING_SYSTEM = (
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "PrivateTmp=yes",
    "PrivateMounts=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_SETPCAP CAP_KILL CAP_CHOWN CAP_FOWNER CAP_DAC_OVERRIDE "
    "CAP_DAC_READ_SEARCH CAP_SYS_PTRACE",
)


# PrivateTmp= hides what is under these: a root or model there fails the start (226/NAMESPACE).
_SHARED_TMP = ("/tmp", "/var/tmp")


def _under_shared_tmp(path: str) -> bool:
    p = posixpath.normpath(path)
    return any(p == t or p.startswith(t + "/") for t in _SHARED_TMP)


def hardening(root: str, *, user: bool, reads: Sequence[str] = (), state: str | None = None) -> list[str]:
    """The [Service] sandboxing lines for a unit of this scope. PrivateTmp= is left out when the
    root, the state_dir or an absolute path in `reads` (the argv) lies under /tmp or /var/tmp. The
    one writable path is run/ as resolved (the state_dir), never the link's name."""
    if user:
        return list(HARDENING_COMMON)
    paths = [root, state or root, *(w.split("=", 1)[-1] for w in reads)]
    hides = any(p.startswith("/") and _under_shared_tmp(p) for p in paths)
    system = [x for x in HARDENING_SYSTEM if not (hides and x == "PrivateTmp=yes")]
    return [*HARDENING_COMMON, *system, f"ReadWritePaths={_spec(state or posixpath.join(root, 'run'))}"]


def supervise_argv(svc: str, root: str, service: str, sup: Sequence[str], argv: Sequence[str]) -> list[str]:
    """ExecStart's words: the installed helper's supervisor loop, its options, the service's argv."""
    return ["/bin/sh", svc, "supervise", root, service, *sup, *argv]


def render_unit(
    *,
    pair: str,
    service: str,
    exec_argv: Sequence[str],
    root: str,
    supervision: Supervision,
    after: str | None = None,
    user: bool = False,
    state: str | None = None,
) -> str:
    """One service's supervisor as a unit. `after`: the unit this one needs first on the same host
    (the RPC server's). Its output goes where `pairctl-svc start` puts it (run/NAME.sup.log)."""
    sup_log = _spec(posixpath.join(root, "run", service + ".sup.log"))
    lines = [
        "# written by pairctl; ExecStart ends with the argv pairctl verifies (do not edit: a deploy rewrites it)",
        "[Unit]",
        f"Description=pairctl pair {pair}: {service} (under pairctl-svc supervise)",
        f"StartLimitIntervalSec={supervision.loop_window_s}",
        f"StartLimitBurst={supervision.loop_starts}",
    ]
    if after:  # Wants, not BindsTo: the supervisor itself restarts llama-server when its peer goes
        lines += [f"After={after}", f"Wants={after}"]
    elif not user:
        lines += ["After=network-online.target", "Wants=network-online.target"]
    lines += [
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={' '.join(exec_quote(a) for a in exec_argv)}",
        "Restart=on-failure",
        f"RestartSec={max(1, math.ceil(supervision.backoff_s))}",
        "KillMode=control-group",
        "TimeoutStopSec=20",
        "Environment=PATH=/usr/local/bin:/usr/bin:/bin",
        "Environment=PAIRCTL_SVC_MANAGED=systemd",
        f"WorkingDirectory={_spec(posixpath.join(root, 'run'))}",
        f"StandardOutput=append:{sup_log}",
        f"StandardError=append:{sup_log}",
        *hardening(root, user=user, reads=exec_argv, state=state),
        "",
        "[Install]",
        f"WantedBy={'default.target' if user else 'multi-user.target'}",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class UnitReadback:
    """What `pairctl-svc` printed of an installed unit: its file's sha256, `is-enabled`,
    `is-active`, systemd's restart count of the supervisor, and (user scope) lingering."""

    unit: str
    sha256: str | None
    enabled: str
    active: str
    restarts: int | None
    linger: bool | None
    user: str | None = None  # the login user whose manager runs it (user scope)
    source: str | None = None  # FRAGMENT:DROPINS:RELOAD, "ok:none:no" when systemd runs our file as written

    def as_dict(self) -> dict[str, object]:
        return {
            "unit": self.unit,
            "sha256": self.sha256,
            "enabled": self.enabled,
            "active": self.active,
            "supervisor_restarts": self.restarts,
            "linger": self.linger,
        }

    @property
    def starts_at_boot(self) -> bool:
        return self.enabled == "enabled" and self.linger is not False

    def boot(self) -> dict[str, object]:
        """What a reboot brings back, for receipts and status (the shape of hosts/boot.py's)."""
        out: dict[str, object] = {"persistence": "systemd", **self.as_dict()}
        if self.enabled != "enabled":
            out["warning"] = (
                f"no boot persistence: {self.unit} is {self.enabled}, not enabled (the next deploy enables it)"
            )
        elif self.linger is False:
            who = self.user or "USER"
            out["warning"] = (
                f"no boot persistence: {who}'s systemd user manager starts at boot only with lingering; "
                f"run `loginctl enable-linger {who}` on the host"
            )
        return out


_UNIT_LINE = re.compile(
    r"^unit=(pairctl-[A-Za-z0-9._-]+\.service):([0-9a-f]{64}|-):([a-z-]{1,40}):([a-z-]{1,40}):(\d{1,9}|-)$"
)


_SOURCE_LINE = re.compile(r"^unit_source=((?:ok|other):(?:none|some):(?:no|yes))$")
_LINGER_LINE = re.compile(r"^linger=([A-Za-z0-9._][A-Za-z0-9._-]{0,31}):(yes|no)$")


def parse_readback(out: str) -> UnitReadback | None:
    """The `unit=` (and `linger=`) lines of pairctl-svc's output; None when there is no unit line.
    The host is untrusted: anything that does not match the exact shape reads as absent."""
    rb: UnitReadback | None = None
    linger: bool | None = None
    user: str | None = None
    source: str | None = None
    for line in out.splitlines():
        if m := _UNIT_LINE.match(line):
            sha, nr = m.group(2), m.group(5)
            rb = UnitReadback(
                unit=m.group(1),
                sha256=None if sha == "-" else sha,
                enabled=m.group(3),
                active=m.group(4),
                restarts=None if nr == "-" else int(nr),
                linger=None,
            )
        elif m := _LINGER_LINE.match(line):
            user, linger = m.group(1), m.group(2) == "yes"
        elif m := _SOURCE_LINE.match(line):
            source = m.group(1)
    if rb is None:
        return None
    return UnitReadback(**{**rb.__dict__, "linger": linger, "user": user, "source": source})


def check_readback(host: str, out: str, unit: str, text: str) -> UnitReadback:
    """After a start: the unit on the host is the one rendered here, enabled and active."""
    rb = parse_readback(out)
    want = sha256_bytes(text.encode())
    if rb is None or rb.unit != unit:
        raise HostError(f"{host}: pairctl-svc did not read back the unit {unit} after starting it")
    if rb.sha256 != want:
        raise HostError(
            f"{host}: the installed {unit} is not the one pairctl rendered (sha256 {rb.sha256 or 'none'}, "
            f"expected {want})",
            hint="something else writes that unit file; remove it and deploy again",
        )
    if rb.enabled != "enabled" or rb.active != "active":
        raise HostError(f"{host}: {unit} is {rb.enabled} and {rb.active} after its start (expected enabled, active)")
    if rb.source is None:
        raise HostError(
            f"{host}: where systemd loads {unit} from was not read back (pairctl-svc printed no unit_source)"
        )
    if rb.source != "ok:none:no":
        frag, drop, reload = rb.source.split(":")
        why = [
            *(
                ["systemd loads it from another file (a unit directory earlier in its search path)"]
                if frag != "ok"
                else []
            ),
            *(["drop-in files (UNIT.d/*.conf) change it"] if drop != "none" else []),
            *(["the manager has not reloaded it"] if reload != "no" else []),
        ]
        raise HostError(
            f"{host}: {unit} as systemd runs it is not the unit pairctl installed: {'; '.join(why) or 'not read back'}",
            hint="`systemctl [--user] cat UNIT` on the host shows what overrides it; remove that and deploy again",
        )
    return rb


def verify_units(units: Mapping[str, str], *, user: bool = False, timeout_s: float = 60.0) -> list[str]:
    """Run `systemd-analyze verify` on the rendered files (in a temporary directory, together,
    so their references resolve); returns its complaints, [] when they verify."""
    with tempfile.TemporaryDirectory(prefix="pairctl-units-") as d:
        paths = []
        for name, text in units.items():
            p = Path(d, name)
            p.write_text(text)
            paths.append(str(p))
        argv = ["systemd-analyze", *(["--user"] if user else []), "verify", *paths]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except FileNotFoundError:
            return ["systemd-analyze is not installed here"]
        out = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
        return out if res.returncode != 0 or out else []
