"""Builders for common remote steps: each returns a `Cmd`, runs nothing (golden-tested).

Paths always follow `--` so a path starting with `-` can never be read as an option.
Renames use `mv -T` (rename(2) onto the exact target, never "into" a directory), and a
symlink is switched by creating it under a temp name and renaming it over the old one:
there is no moment when the link is missing.
"""

from __future__ import annotations

from orchestrator.remote.command import Cmd


def _mode(mode: int) -> str:
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"bad file mode {mode!r}")
    return format(mode, "04o")


def mkdir_p(path: str, mode: int = 0o755) -> Cmd:
    """Create a directory and missing parents; `-m` applies to the last component only."""
    return Cmd.of("mkdir", "-p", "-m", _mode(mode), "--", path)


def mkdir_exclusive(path: str, mode: int = 0o755) -> Cmd:
    """Fails if the path exists: the atomic "take" primitive."""
    return Cmd.of("mkdir", "-m", _mode(mode), "--", path)


def chmod(mode: int, *paths: str) -> Cmd:
    if not paths:
        raise ValueError("chmod needs a path")
    return Cmd.of("chmod", _mode(mode), "--", *paths)


def rename(src: str, dst: str) -> Cmd:
    """Atomic rename onto `dst` (replacing a file or symlink; never moving into a directory)."""
    return Cmd.of("mv", "-T", "--", src, dst)


def symlink_tmp(target: str, tmp_link: str) -> Cmd:
    """First half of an atomic symlink switch: `ln -sfn target tmp_link`."""
    return Cmd.of("ln", "-sfn", "--", target, tmp_link)


def switch_symlink(target: str, link: str, tmp_link: str) -> tuple[Cmd, Cmd]:
    """Point `link` at `target` atomically: make `tmp_link`, then rename it over `link`."""
    return symlink_tmp(target, tmp_link), rename(tmp_link, link)


def readlink(path: str) -> Cmd:
    """Prints the link's target; exits nonzero if `path` is not a symlink."""
    return Cmd.of("readlink", "--", path)


def sha256sum(*paths: str) -> Cmd:
    """`sha256sum` output lines: `<hex>  <path>`; parse with `parse_sha256sum`."""
    if not paths:
        raise ValueError("sha256sum needs a path")
    return Cmd.of("sha256sum", "--", *paths)


def cat(path: str) -> Cmd:
    return Cmd.of("cat", "--", path)


def test_exists(path: str) -> Cmd:
    """Exit 0 if the path exists (symlinks followed), 1 if not."""
    return Cmd.of("test", "-e", path)


def test_dir(path: str) -> Cmd:
    return Cmd.of("test", "-d", path)


def remove_tree(path: str) -> Cmd:
    """`rm -rf` of one explicit absolute path; refuses `/` and relative paths."""
    if not path.startswith("/") or path.rstrip("/") == "":
        raise ValueError(f"refusing to remove {path!r}: only a non-root absolute path")
    return Cmd.of("rm", "-rf", "--", path)


def kill(pid: int, signal: str = "TERM") -> Cmd:
    if not isinstance(pid, int) or pid <= 1:
        raise ValueError(f"refusing to signal pid {pid!r}")
    if not signal.isalnum():
        raise ValueError(f"bad signal name {signal!r}")
    return Cmd.of("kill", f"-{signal}", "--", str(pid))


def write_stdin_to(path: str) -> Cmd:
    """Write the command's stdin to `path` (no shell redirection): `dd of=path`."""
    return Cmd.of("dd", f"of={path}", "bs=65536", "status=none")


def date_epoch() -> Cmd:
    """The host's clock, seconds since the epoch (for skew checks)."""
    return Cmd.of("date", "+%s")


def parse_sha256sum(text: str) -> dict[str, str]:
    """`sha256sum` lines -> {path: hex}. Raises ValueError on a malformed line."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("\\"):
            raise ValueError(f"sha256sum escaped a file name (newline or backslash in it): {line!r}")
        digest, sep, path = line.partition("  ")
        if not sep:
            digest, sep, path = line.partition(" *")  # binary mode marker
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a sha256sum line: {line!r}")
        out[path] = digest
    return out
