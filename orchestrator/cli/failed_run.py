"""A failed deploy's or rollback's `--json`: what the run did, read back from its own receipt.

A run that fails raises (the exit code comes from the exception), so the engine's RunResult
never reaches the CLI; the receipt it sealed holds every step, the final state and the
rollback. A script handling exit 7 or 8 gets those beside the `error` object, without a
second command (`receipts show HASH`).
"""

from __future__ import annotations

from typing import Any

from orchestrator.paths import Home


def failed_run_document(home: Home, command: str, pair: str, receipt: str | None) -> dict[str, Any] | None:
    """steps, final_state and rollback of the run sealed as `receipt` (None if it cannot be read)."""
    if not receipt:
        return None
    from orchestrator.evidence.store import EvidenceStore  # start-up: only a failed run reads it

    try:
        rec = EvidenceStore(home.evidence).load(receipt)
    except Exception:  # the error object still names the receipt; `receipts verify` says why
        return None
    extra = rec.model_extra or {}
    return {
        "command": command,
        "pair": pair,
        "outcome": rec.outcome,
        "reason": rec.reason,
        "receipt": receipt,
        "steps": [
            {
                "name": s.name,
                "hosts": [h for h in (s.host or "").split(",") if h],
                "ok": s.outcome in ("passed", "skipped"),
                "outcome": s.outcome,
                "seconds": s.duration_s or 0.0,
                "error": s.error,
            }
            for s in rec.steps
        ],
        "final_state": extra.get("final_state"),
        "rollback": extra.get("rollback"),
    }
