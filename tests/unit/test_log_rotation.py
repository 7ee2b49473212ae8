"""The JSON log rotates (issue 33 item 6: it grew by ~10 KB a deploy, never rotated): a command that
starts and finds `<home>/logs/pairctl.jsonl` past its cap shifts it to `.1`, `.1` to `.2` ..., drops
the oldest beyond the kept count, and writes its own lines to a fresh 0600 file."""

from __future__ import annotations

import json
import os
import stat

from orchestrator import log


def test_a_command_rotates_a_full_log_and_keeps_three(cli, tmp_path):
    logs = tmp_path / "home" / "logs"
    logs.mkdir(parents=True)
    cur = logs / "pairctl.jsonl"
    for i in (1, 2, 3):
        (logs / f"pairctl.jsonl.{i}").write_text(f"old {i}\n")
    with open(cur, "wb") as fh:
        fh.truncate(log.LOG_MAX_BYTES + 1)
    r = cli("--json", "receipts", "list", home=tmp_path / "home")
    assert r.exit_code == 0, r.output
    assert (logs / "pairctl.jsonl.1").stat().st_size == log.LOG_MAX_BYTES + 1
    assert (logs / "pairctl.jsonl.2").read_text() == "old 1\n" and (logs / "pairctl.jsonl.3").read_text() == "old 2\n"
    assert not (logs / "pairctl.jsonl.4").exists()  # "old 3" dropped
    lines = cur.read_text().splitlines()
    assert lines and all(json.loads(line)["event"] for line in lines)  # this command's own lines, fresh
    assert stat.S_IMODE(os.stat(cur).st_mode) == 0o600
    # under the cap: the next command appends, nothing shifts
    before = cur.stat().st_size
    assert cli("--json", "receipts", "list", home=tmp_path / "home").exit_code == 0
    assert cur.stat().st_size > before and (logs / "pairctl.jsonl.1").stat().st_size == log.LOG_MAX_BYTES + 1


def test_rotation_is_a_no_op_below_the_cap_or_without_a_file(tmp_path):
    p = tmp_path / "x.jsonl"
    assert log.rotate_if_large(p, max_bytes=10) is False
    p.write_text("12345")
    assert log.rotate_if_large(p, max_bytes=10) is False and p.exists()
    p.write_text("12345678901")
    assert log.rotate_if_large(p, max_bytes=10, keep=1) is True
    assert not p.exists() and (tmp_path / "x.jsonl.1").read_text() == "12345678901"
