"""Issue 16 item 5 (log side): the JSON log holds no frame locals and masks secrets at any depth;
it is created 0600; a --home that is a file is a clear error, not a traceback."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

from orchestrator import log

SECRET = "sk-live-0123456789abcdef"


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_traceback_in_log_has_no_locals_and_nested_secrets_are_masked(tmp_path):
    f = tmp_path / "logs" / "pairctl.jsonl"
    log.configure(log_file=f)
    try:

        def send(headers):
            authorization = f"Bearer {SECRET}"  # a local that a locals-dump would print
            raise UnicodeEncodeError("latin-1", authorization, 7, 8, "ordinal not in range")

        try:
            send({"Authorization": f"Bearer {SECRET}"})
        except UnicodeEncodeError:
            log.get_logger().exception(
                "internal error",
                request={"headers": {"Authorization": f"Bearer {SECRET}"}},
                argv=["llama-server", "--api-key", SECRET],
                deep=[{"x": {"api_key": SECRET}}],
            )
        for h in logging.getLogger().handlers:
            h.flush()
        text = f.read_text()
        assert "internal error" in text and "UnicodeEncodeError" in text
        assert SECRET not in text
        rec = _records(f)[-1]
        frames = [fr for exc in rec["exception"] for fr in exc["frames"]]
        assert frames and all("locals" not in fr or not fr["locals"] for fr in frames)
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    finally:
        for h in list(logging.getLogger().handlers):
            logging.getLogger().removeHandler(h)


def test_home_that_is_a_file_is_a_clear_error(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a directory")
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "--home", str(home), "receipts", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3, r
    assert "must be a directory" in r.stderr and "Traceback" not in r.stderr + r.stdout
