"""Boot persistence on hosts without systemd: `@reboot` (and watchdog) crontab lines per root.

`pairctl-svc start|restart` keeps each service's verified start arguments in `run/NAME.boot` and
`stop` removes them, so `pairctl-svc boot ROOT` starts again exactly what was last started. The
lines that run it sit under a marker comment naming the root, so several roots coexist and a
deploy replaces its own lines, keeping every other line (`merge_crontab`, pure). A host without
`crontab` is no failure: the result says so and `status` warns.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from orchestrator.remote.command import Cmd
from orchestrator.remote.result import as_text
from orchestrator.remote.transport import Transport

if TYPE_CHECKING:
    from orchestrator.hosts.managers.base import HostPaths

MARKER_PREFIX = "# pairctl boot persistence, install root "
MARKER_SUFFIX = " (managed by pairctl; a deploy rewrites it)"
WRITE_ATTEMPTS = 3  # another writer between our write and its read-back: merge again from what is there

CRONTAB_LIST = Cmd(("crontab", "-l"))
CRONTAB_INSTALL = Cmd(("crontab", "-"))


def marker(root: str) -> str:
    return MARKER_PREFIX + root + MARKER_SUFFIX


def boot_argv(layout: HostPaths) -> list[str]:
    """What the @reboot line runs: the installed helper's `boot` for this root."""
    return ["sh", layout.svc, "boot", layout.root]


def unfit_for_cron(root: str) -> str | None:
    """Why a root cannot go into a crontab line (None when it can): cron ends a command at a
    newline, and a `\\` before `%` cannot be written so that cron keeps both."""
    if "\n" in root or "\r" in root:
        return "the install root holds a line break"
    if "\\%" in root:
        return "the install root holds '\\%', which cron cannot carry"
    return None


def cron_escape(command: str) -> str:
    """A shell line as a crontab command: every `%` escaped as `\\%` (see `cron_command`)."""
    return command.replace("%", "\\%")


def cron_command(line: str) -> str:
    """What cron hands to `/bin/sh -c` for a crontab entry line (vixie/Debian cron): the schedule
    (`@reboot`, or five fields) dropped, `\\%` turned into `%`, and the command cut at the first
    unescaped `%` (the rest is its stdin, which pairctl's lines never have)."""
    s = line.lstrip()
    if s.startswith("@"):
        cmd = s.split(None, 1)[1] if len(s.split(None, 1)) == 2 else ""
    else:
        parts = s.split(None, 5)
        cmd = parts[5] if len(parts) == 6 else ""
    out: list[str] = []
    escaped = False
    for ch in cmd:
        if escaped:
            if ch != "%":
                out.append("\\")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "%":
            break
        else:
            out.append(ch)
    if escaped:
        out.append("\\")
    return "".join(out)


def entry(layout: HostPaths) -> str:
    """The lines under this root's marker (the root checked with `unfit_for_cron` first): the
    @reboot line, and the watchdog that supervises the supervisors where no service manager does:
    every minute, `watch` starts again what `boot` would (unless leased, given up or refused)."""
    watch = ["sh", layout.svc, "watch", layout.root]
    return (
        "@reboot " + cron_escape(shlex.join(boot_argv(layout))) + "\n" + WATCH_SCHEDULE + cron_escape(shlex.join(watch))
    )


WATCH_SCHEDULE = "* * * * * "  # the watchdog's bound: a minute, plus the supervisor's start


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _without_entry(existing: str, root: str, stray: str | None = None) -> tuple[list[str], int | None]:
    """The crontab's lines without this root's marker(s) and the @reboot line after each (and
    without copies of `stray`), and where the first marker stood (None: there was none)."""
    mark = marker(root)
    out: list[str] = []
    at: int | None = None
    drop_next = 0
    for ln in _lines(existing):
        if drop_next:  # ours: the @reboot line and the watchdog after the marker (older pairctl: one)
            drop_next -= 1
            if ln.startswith("@reboot") or (ln.startswith(WATCH_SCHEDULE) and "pairctl-svc" in ln):
                continue
            drop_next = 0
        if ln == mark:
            drop_next = 2
            at = len(out) if at is None else at
            continue
        if stray is not None and ln in stray.split("\n"):
            continue
        out.append(ln)
    return out, at


def merge_crontab(existing: str, root: str, line: str) -> str:
    """The user's crontab with this root's marker + line exactly once, in the place of its first
    marker or appended; every other line kept in order (a stray copy of our line goes). Equal to
    `existing` when nothing needs changing."""
    out, at = _without_entry(existing, root, stray=line)
    pos = len(out) if at is None else at
    out[pos:pos] = [marker(root), line]
    merged = "\n".join(out) + "\n"
    return existing if existing == merged else merged


def drop_entry(existing: str, root: str) -> str:
    """The user's crontab without this root's marker and the @reboot line after it (a host
    whose services systemd now starts); equal to `existing` when there is none."""
    out, at = _without_entry(existing, root)
    if at is None:
        return existing
    return "\n".join(out) + "\n" if out else ""


def drop_entries_under(existing: str, prefix: str) -> str:
    """The user's crontab without the entry of every root at or under the folder `prefix` (a lab's
    home going away). A prefix of fewer than two folders ("/", "/home") would take other users'
    roots too: refused (ValueError), a caller's bug."""
    if not prefix.startswith("/") or len(PurePosixPath(prefix).parts) < 3:
        raise ValueError(f"refusing to drop boot entries under {prefix!r}: name an absolute folder two levels deep")
    under = prefix.rstrip("/") + "/"
    for ln in _lines(existing):
        root = ln.removeprefix(MARKER_PREFIX).removesuffix(MARKER_SUFFIX)
        if ln == marker(root) and (root + "/").startswith(under):
            existing = drop_entry(existing, root)
    return existing


def entry_state(text: str, root: str, line: str) -> str:
    """`installed` (marker followed by exactly `line`, once), `absent`, or `differs`."""
    lines, want = _lines(text), line.split("\n")
    mark = marker(root)
    at = [i for i, ln in enumerate(lines) if ln == mark]
    if not at and not set(want) & set(lines):
        return "absent"
    if len(at) == 1 and lines[at[0] + 1 : at[0] + 1 + len(want)] == want and all(lines.count(w) == 1 for w in want):
        return "installed"
    return "differs"


@dataclass(frozen=True)
class CrontabRead:
    """`crontab -l` judged: `text` ("" when the user has none), or `missing` (no crontab program),
    or `error` (anything else, with its output)."""

    text: str | None
    missing: bool = False
    error: str | None = None


def parse_crontab_list(exit_status: int, stdout: str, stderr: str) -> CrontabRead:
    if exit_status == 0:
        return CrontabRead(stdout)
    err = stderr.strip()
    if exit_status == 127 or ("not found" in err and "crontab" in err and "no crontab for" not in err):
        return CrontabRead(None, missing=True)
    if exit_status == 1 and "no crontab for" in err:
        return CrontabRead("")
    return CrontabRead(None, error=f"crontab -l exited {exit_status}: {err[-200:]}")


def read_crontab(t: Transport) -> CrontabRead:
    res = t.run(CRONTAB_LIST, check=False, timeout=30)
    return parse_crontab_list(res.exit_status, as_text(res.stdout), as_text(res.stderr))


def _unpersisted(why: str) -> dict[str, object]:
    return {"persistence": None, "warning": f"no boot persistence: {why}"}


def _text_or_warning(got: CrontabRead) -> str | dict[str, object]:
    """The crontab's text, or the result saying why `crontab -l` gave nothing to judge or merge."""
    if got.text is None:
        return _unpersisted("crontab missing" if got.missing else str(got.error))
    return got.text


def ensure_entry(t: Transport, layout: HostPaths) -> dict[str, object]:
    """This root's lines in the host user's crontab, replaced in place and read back. Never raises
    for cron's absence or a refused write: the result says what is persisted (`persistence`:
    `cron` or None) and why not (`warning`)."""
    why = unfit_for_cron(layout.root)
    if why:
        return _unpersisted(why)
    line = entry(layout)
    outcome, detail = _rewrite(t, lambda text: merge_crontab(text, layout.root, line))
    if outcome in ("unchanged", "changed"):
        return {"persistence": "cron", "entry": line, "changed": outcome == "changed", "read_back": "installed"}
    return detail if isinstance(detail, dict) else _unpersisted(detail)


def remove_entry(t: Transport, layout: HostPaths) -> str:
    """Best effort, for a root whose services are now systemd units: its lines go (they would
    mislead). Returns what happened, for the receipt; never raises for cron's absence."""
    return _drop(t, lambda text: drop_entry(text, layout.root))


def remove_entries_under(t: Transport, prefix: str) -> str:
    """Every root's entry at or under `prefix` out of the host user's crontab (a lab's leftovers)."""
    return _drop(t, lambda text: drop_entries_under(text, prefix))


def _drop(t: Transport, change: Callable[[str], str]) -> str:
    """What `_rewrite` did, in the words of a receipt's `crontab_line`."""
    outcome, detail = _rewrite(t, change)
    if isinstance(detail, dict):
        return "no crontab"
    return {"unchanged": "none", "changed": "removed", "refused": detail.partition(":")[0]}.get(outcome, detail)


def _rewrite(t: Transport, change: Callable[[str], str]) -> tuple[str, str | dict[str, object]]:
    """The crontab rewritten by `change` and read back: `unchanged` (nothing to write), `changed`,
    `refused` (`crontab -` failed), `unread` (the warning `crontab -l` gave) or `raced`. Another
    writer in between (or cron rewriting it) means changing again from what is there now."""
    got = read_crontab(t)
    for attempt in range(WRITE_ATTEMPTS):
        text = _text_or_warning(got)
        if isinstance(text, dict):
            return "unread", text
        new = change(text)
        if new == text:
            return ("changed" if attempt else "unchanged"), ""
        res = t.run(CRONTAB_INSTALL, check=False, timeout=30, stdin=new.encode())
        if res.exit_status != 0:
            return "refused", f"crontab - exited {res.exit_status}: {as_text(res.stderr).strip()[-200:]}"
        got = read_crontab(t)
        if got.text == new:
            return "changed", ""
    return "raced", f"the crontab read back differs from what was written {WRITE_ATTEMPTS} times (another writer?)"


def read_entry(t: Transport, layout: HostPaths) -> dict[str, object]:
    """For status: whether this root's @reboot line is in the crontab (`installed`), and a
    `warning` when it is not."""
    why = unfit_for_cron(layout.root)
    if why:
        return _unpersisted(why)
    line = entry(layout)
    text = _text_or_warning(read_crontab(t))
    if isinstance(text, dict):
        return text
    state = entry_state(text, layout.root, line)
    if state == "installed":
        return {"persistence": "cron", "entry": line}
    return {
        **_unpersisted(
            f"the crontab has {'no' if state == 'absent' else 'a different'} @reboot line for {layout.root} "
            "(the next deploy or rollback writes it)"
        ),
        "entry_state": state,
    }
