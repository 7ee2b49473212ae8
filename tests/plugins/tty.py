"""Run a command under a real pseudo-terminal and read back the screen a person would see.

`run_in_pty` gives the child a pty as stdin, stdout and stderr (so `isatty()` is true, as in an
operator's terminal); `screen` replays the bytes through a minimal VT100 model (carriage
return, line feed, cursor up/down/column, erase line, SGR and mode switches ignored), enough
for what rich's live display and tables emit. A spinner left on screen, or a line drawn over
another one, shows up in the final screen exactly as on a real terminal.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import struct
import time
from collections.abc import Mapping

_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")
SPINNER_GLYPHS = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")


def run_in_pty(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float = 600,
    columns: int = 140,
) -> tuple[int, bytes]:
    """Run `argv` with a pty of `columns` columns; its exit code and every byte it wrote."""
    import fcntl
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: exec, never return into pytest
        try:
            if cwd:
                os.chdir(cwd)
            os.execvpe(argv[0], argv, dict(env if env is not None else os.environ))
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            break
        r, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not r:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        out += data
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), bytes(out)


def screen(raw: bytes) -> list[str]:
    """The lines a terminal shows after `raw` (scrollback included), trailing blanks removed."""
    text = raw.decode("utf-8", errors="replace")
    lines: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = _CSI.match(text, i)
            if m:
                params, final = m.group(1), m.group(2)
                n = int(params) if params.isdigit() else 1
                if final == "A":
                    row = max(0, row - n)
                elif final == "B":
                    row += n
                elif final == "G":
                    col = max(0, n - 1)
                elif final == "K":
                    while len(lines) <= row:
                        lines.append([])
                    if params in ("2",):
                        lines[row] = []
                    elif params in ("", "0"):
                        del lines[row][col:]
                    else:  # 1: start to cursor
                        lines[row][: col + 1] = [" "] * min(col + 1, len(lines[row]))
                i = m.end()
                continue
            i += 1
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            col = 0
        elif ch >= " " or ch == "\t":
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            while len(line) < col:
                line.append(" ")
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        i += 1
    shown = ["".join(line).rstrip() for line in lines]
    while shown and not shown[-1]:
        shown.pop()
    return shown
