"""Hooks: the inventory's commands (argv, the event as JSON on stdin, killed after a timeout) run
on the operator's machine when something happens, recorded with the caller's evidence and in
`<home>/logs/hooks.jsonl`. A failing hook never changes the run's outcome, except `pre-deploy`,
which runs before any host changes and vetoes the deploy when it fails (failing closed)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

from orchestrator.config.inventory import HookEvent, Inventory
from orchestrator.errors import ExitCode, PairctlError
from orchestrator.evidence.masking import mask_text
from orchestrator.paths import Home

_TAIL = 400


def event_document(event: HookEvent, text: str, **fields: Any) -> dict[str, Any]:
    """The JSON a hook reads: `event`, a one-line `text` (what a chat webhook shows), the time,
    and the event's own fields (pair, receipt, outcome ...)."""
    return {"event": event, "text": text, "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), **fields}


def run_hooks(home: Home, inventory: Inventory, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every hook declared for `doc["event"]`, one after the other; never raises."""
    records = [_run_one(list(h.argv), h.timeout_s, doc) for h in inventory.hooks if doc["event"] in h.on]
    if records:
        _log(home, records)
    return records


class HookVetoed(PairctlError):
    """A pre-deploy hook said no (non-zero exit, timeout, or it could not start): nothing changed."""

    exit_code = ExitCode.FAILURE


def check_veto(home: Home, inventory: Inventory, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the hooks of a veto event (`pre-deploy`); raise HookVetoed naming the first that failed."""
    records = run_hooks(home, inventory, doc)
    for rec in records:
        if not rec["ok"]:
            raise HookVetoed(
                f"pair {doc.get('pair')}: the {doc['event']} hook {rec['argv0']} vetoed the {doc.get('command', 'run')}"
                f" ({rec['error']}); nothing was changed",
                hint="the tail of the hook's stderr is above and in logs/hooks.jsonl; fix what it reports, or remove "
                "the hook from the inventory",
            )
    return records


def _run_one(argv: list[str], timeout_s: float, doc: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"event": doc["event"], "argv0": argv[0], "ok": False, "exit_code": None, "error": None}
    t0 = time.monotonic()
    try:
        data = json.dumps(doc, sort_keys=True).encode()
        proc = subprocess.run(argv, input=data, capture_output=True, timeout=timeout_s, check=False)
        rec["exit_code"] = proc.returncode
        rec["ok"] = proc.returncode == 0
        if proc.returncode != 0:
            tail = proc.stderr.decode(errors="replace")[-_TAIL:].strip()
            rec["error"] = f"exit {proc.returncode}: " + mask_text(tail)
    except subprocess.TimeoutExpired:
        rec["error"] = f"killed after its timeout of {timeout_s:g} s"
    except OSError as exc:
        rec["error"] = f"could not start {argv[0]!r}: {exc.strerror or exc}"
    rec["seconds"] = round(time.monotonic() - t0, 3)
    return rec


def _log(home: Home, records: list[dict[str, Any]]) -> None:
    """Append to `<home>/logs/hooks.jsonl` (0600): best effort, a hook's record never fails a run."""
    try:
        home.logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(home.logs / "hooks.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps({"at": datetime.now(UTC).isoformat(), **r}, sort_keys=True) + "\n")
    except OSError:
        pass
