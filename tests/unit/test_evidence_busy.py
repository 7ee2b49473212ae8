"""Issue 21 item 7: the loser of a same-home race names the winner, never "(pid ?, ?, run ?)"."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time

import pytest

from orchestrator.evidence.store import EvidenceBusy, EvidenceStore


def test_race_loser_names_the_winner_even_while_it_records_itself(tmp_path) -> None:
    store = EvidenceStore(tmp_path / "evidence")
    store._ensure()
    lock = store.locks_dir / "lab.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the winner holds the lock, has not written yet

    def record() -> None:
        time.sleep(0.2)
        os.pwrite(fd, json.dumps({"run_id": "20261203T1-77-1", "pid": 4242, "command": "deploy"}).encode(), 0)

    th = threading.Thread(target=record)
    th.start()
    try:
        with pytest.raises(EvidenceBusy) as ei:
            store.begin("deploy", argv=[], pair="lab")
    finally:
        th.join()
        os.close(fd)
    assert "(pid 4242, deploy, run 20261203T1-77-1)" in str(ei.value)
    assert "?" not in str(ei.value)


def test_a_deep_lock_holder_file_reads_as_no_holder_not_a_recursion_error(tmp_path):
    """Issue 49 item 7: a lock file edited to 30,000 brackets (within its 64 KB bound) was a
    RecursionError out of the busy message; it now reads as an unknown holder."""
    from orchestrator.evidence.store import ChainLock

    path = tmp_path / "lab.lock"
    path.write_bytes(b"[" * 30_000 + b"]" * 30_000)
    assert ChainLock(path).holder(wait_s=0.05) == {}
