"""Scheduled acceptance as systemd service + timer units (or a crontab line where systemd is absent).

No home-made scheduler: systemd (or cron) runs `pairctl accept --scheduled`, which records a
`skipped: leased by ...` receipt instead of waiting when someone else holds the pair.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.durations import parse_duration
from orchestrator.errors import ConfigError, PairctlError
from orchestrator.evidence import atomic

MARKER = "# managed by pairctl"
SKIPPED_EXIT = 11  # ExitCode.SKIPPED: a scheduled run that found the pair leased is not a failure


def parse_every(every: str) -> int:
    """'30m', '6h', '1d' (any duration pairctl reads) -> seconds, bounded to what a timer should do."""
    try:
        seconds = int(round(parse_duration(every, what="--every")))
    except ConfigError:
        raise ConfigError(f"--every {every!r}: use a duration such as 30m, 6h or 1d") from None
    if seconds < 300:
        raise ConfigError(f"--every {every!r}: at least 5m between acceptance runs")
    if seconds > 30 * 86400:
        raise ConfigError(f"--every {every!r}: at most 30d")
    return seconds


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart argument by systemd's rules (not a shell's): `%` and `$` are doubled."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def cron_spec(seconds: int) -> str:
    minutes = seconds // 60
    if seconds % 60:
        raise ConfigError("cron cannot schedule below a minute")
    if minutes < 60 and 60 % minutes == 0:
        return f"*/{minutes} * * * *"
    hours, rem = divmod(minutes, 60)
    if not rem and hours < 24 and 24 % hours == 0:
        return f"0 */{hours} * * *" if hours > 1 else "0 * * * *"
    days, rem = divmod(hours, 24)
    if not rem and minutes % 60 == 0 and days >= 1:
        return "0 0 * * *" if days == 1 else f"0 0 */{days} * *"
    raise ConfigError(f"an interval of {seconds}s has no exact cron form; use a divisor of an hour or a day")


@dataclass(frozen=True)
class Schedule:
    pair: str
    every_s: int
    argv: tuple[str, ...]  # full command line: pairctl binary first
    home: str

    @property
    def unit_name(self) -> str:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.pair)
        return f"pairctl-accept-{safe}"

    def service_text(self) -> str:
        return f"""{MARKER}
[Unit]
Description=pairctl scheduled acceptance of pair {self.pair}
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
Environment=PAIRCTL_HOME={systemd_quote(self.home)}
ExecStart={" ".join(systemd_quote(a) for a in self.argv)}
SuccessExitStatus={SKIPPED_EXIT}
TimeoutStartSec=6h
"""

    def timer_text(self) -> str:
        return f"""{MARKER}
[Unit]
Description=Run pairctl acceptance of pair {self.pair} every {self.every_s}s

[Timer]
OnBootSec=15min
OnUnitActiveSec={self.every_s}s
RandomizedDelaySec=60s
Persistent=true
Unit={self.unit_name}.service

[Install]
WantedBy=timers.target
"""

    def crontab_line(self) -> str:
        """The line for crontab(5), where an unescaped `%` in the command ends it and turns the
        rest into stdin: every `%` is written `\\%` (cron removes the backslash)."""
        command = f"PAIRCTL_HOME={shlex.quote(self.home)} {shlex.join(self.argv)}".replace("%", "\\%")
        return f"{cron_spec(self.every_s)} {command}  {MARKER} ({self.pair})"


def accept_argv(pairctl: str, *, home: str, inventory: str, pair: str, checks: list[str] | None) -> tuple[str, ...]:
    argv = [pairctl, "--home", home, "--inventory", inventory, "accept", "--pair", pair, "--scheduled"]
    for c in checks or []:
        argv += ["--checks", c]
    return tuple(argv)


def systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def unit_dir(system: bool) -> Path:
    return Path("/etc/systemd/system") if system else Path.home() / ".config/systemd/user"


def write_units(schedule: Schedule, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for suffix, text in (("service", schedule.service_text()), ("timer", schedule.timer_text())):
        p = directory / f"{schedule.unit_name}.{suffix}"
        atomic.replace(p, text.encode(), mode=0o644)  # exclusive unique temp name: never through a link
        out.append(p)
    return out


def verify_units(paths: list[Path]) -> str:
    """`systemd-analyze verify`; returns its output, raises if it finds a problem."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        raise PairctlError("systemd-analyze is not installed; cannot verify the units")
    proc = subprocess.run([exe, "verify", *map(str, paths)], capture_output=True, text=True, timeout=60)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise PairctlError(f"systemd-analyze verify rejected the units:\n{text}")
    return text


def systemctl(system: bool, *args: str) -> None:
    argv = ["systemctl"] + ([] if system else ["--user"]) + list(args)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise PairctlError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def list_units(directory: Path) -> list[dict[str, str]]:
    rows = []
    for p in sorted(directory.glob("pairctl-accept-*.timer")):
        text = p.read_text()
        if not text.startswith(MARKER):
            continue
        every = re.search(r"OnUnitActiveSec=(\S+)", text)
        rows.append({"unit": p.stem, "timer": str(p), "every": every.group(1) if every else "?"})
    return rows


def remove_units(name: str, directory: Path) -> list[Path]:
    removed = []
    for suffix in ("timer", "service"):
        p = directory / f"{name}.{suffix}"
        if p.exists() and p.read_text().startswith(MARKER):
            p.unlink()
            removed.append(p)
    return removed
