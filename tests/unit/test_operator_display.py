"""Issue 34, item 10: what a person reads in `status` on a narrow terminal: whole package ids
(wrapped, never cut with an ellipsis), no Python `None`, the boot line in the future tense."""

from __future__ import annotations

import io

from orchestrator.engine.render import print_status
from orchestrator.terminal import console

PID = "lab-9d37488533-cpu-lab-with-a-long-tail-0123456789"


def _status() -> dict:
    host = {
        "role": "native", "current": PID, "previous": None, "releases": [PID], "service": "llama-server",
        "running": True, "pid": 12, "matches_manifest": True, "leases": [],
        "boot": {"persistence": "crontab", "starts_at_boot": True},
    }  # fmt: skip
    return {
        "pair": "lab",
        "hosts": {"lab-native": host, "lab-rpc": {**host, "role": "rpc", "service": "ggml-rpc-server"}},
        "route": {
            "revision": 3,
            "active": f"{PID} + {PID} (lab)",
            "previous": None,
            "updated_at": "t",
            "updated_by": "run-1",
        },  # fmt: skip
        "problems": [],
        "health": "ok",
    }


def test_status_on_a_100_column_terminal_keeps_whole_ids_and_prints_no_none():
    buf = io.StringIO()
    print_status(console(file=buf, width=100, force_terminal=True, color_system=None), _status())
    text = buf.getvalue()
    assert "…" not in text, text
    assert "None" not in text, text
    joined = "".join(ch for ch in text if ch not in " │┃\n")  # a folded id reads whole once the table is removed
    assert PID.replace(" ", "") in joined, text
    assert "previous -" in text and "starts at the next boot" in text, text
