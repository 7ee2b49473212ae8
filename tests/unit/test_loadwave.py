"""The lab's noise source (benchmarks/_loadwave.py): a real CPU load on a schedule, bounded in time.

Short schedules (about a second, one worker) so the shared machine barely notices."""

from __future__ import annotations

import time

import pytest

from benchmarks._loadwave import LoadWave, Schedule


def test_schedule_phases():
    s = Schedule(on_s=2, off_s=1, duration_s=10)
    assert [s.is_on(t) for t in (0, 1.9, 2.1, 2.9, 3.1)] == [True, True, False, False, True]
    off_first = Schedule(on_s=2, off_s=1, duration_s=10, start_on=False)
    assert [off_first.is_on(t) for t in (0.5, 1.5, 2.9, 3.5)] == [False, True, True, False]
    with pytest.raises(ValueError):
        Schedule(duration_s=0)
    with pytest.raises(ValueError):
        Schedule(workers=0)


def test_the_load_ends_by_itself_and_burns_cpu_only_while_on():
    wave = LoadWave(Schedule(workers=1, on_s=0.3, off_s=0.3, duration_s=1.2)).start()
    t0 = time.monotonic()
    try:
        assert wave.running() == 1
        assert wave.wait(10.0), "a worker outlived its duration"
    finally:
        wave.stop()
    took = time.monotonic() - t0
    rec = wave.record()
    assert took < 8.0 and rec["workers"][0]["ended_by"] == "itself"
    cpu = rec["workers"][0]["cpu_s"]
    # on for about 0.6 s of its 1.2 s (plus the interpreter's start): never the whole time
    assert 0.05 < cpu < 1.0, rec


def test_stop_ends_the_load_early():
    with LoadWave(Schedule(workers=1, on_s=5, off_s=5, duration_s=60)) as wave:
        time.sleep(0.3)
        assert wave.running() == 1
    rec = wave.record()
    assert wave.running() == 0 and rec["workers"][0]["ended_by"] == "stop()"
    assert rec["workers"][0]["cpu_s"] is not None
