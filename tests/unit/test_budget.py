"""Issue 21 item 5: every acceptance request is bounded by the work it asks for, and the suite
stops after a required check found the server not answering (pure: no server)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.checks import budget, suite
from orchestrator.checks.base import CheckContext, CheckOptions, CheckResult
from orchestrator.config.profiles import load_profile
from orchestrator.server.client import ServerUnreachable

# these suites run stand-in checks on a stand-in client: no speed probe to send
NO_PROBE = CheckOptions(measure_speed=False)


def test_request_seconds_is_work_over_floor_speed_plus_margin() -> None:
    assert budget.request_seconds(3000, 200, lanes=1, floor_pp=300, floor_tg=20, margin_s=30) == 10 + 10 + 30
    assert budget.request_seconds(3000, 200, lanes=2, floor_pp=300, floor_tg=20, margin_s=30) == 2 * 20 + 30
    with pytest.raises(ValueError):
        budget.request_seconds(10, 10, lanes=0)
    with pytest.raises(ValueError):
        budget.request_seconds(10, 10, floor_tg=0)


def test_lab_profile_requests_are_bounded_in_minutes_not_an_hour() -> None:
    """Today every completion waits 1800 s and every other request 600 s: a SIGSTOPped server
    hung the deploy for an hour. The lab profile's largest request (two near-full lanes at once)
    now has about a minute; the production profile's scales with its 266240-token context."""
    lab = budget.for_profile(load_profile("lab"))
    assert 30 < lab.completion_s < 180, lab
    assert lab.control_s <= 30
    assert "lane(s)" in lab.why and "tok/s" in lab.why
    prod = budget.for_profile(load_profile("production"))
    assert prod.completion_s > 10 * lab.completion_s  # derived from the profile, not a constant
    per_slot = load_profile("production").per_slot_ctx()
    gen = round(per_slot * 0.125)
    assert prod.completion_s == budget.request_seconds(per_slot - gen, gen, lanes=2)


@pytest.mark.parametrize(
    "message, transport",
    [
        ("ServerUnreachable: POST http://127.0.0.2:8080/completion: timed out (ReadTimeout)", True),
        ("ServerUnreachable: GET http://x/slots: connection refused", True),
        ("lane 0 generated 3 tokens, expected 256", False),
    ],
)
def test_transport_failures_are_told_from_wrong_answers(message: str, transport: bool) -> None:
    assert budget.is_transport_failure(message) is transport


class _IdleServer:
    """Only what the suite itself asks between checks (/slots: all idle)."""

    retries: list[str] = []

    def slots(self, timeout: float = 10):
        return []


def test_suite_stops_after_a_required_check_finds_the_server_not_answering() -> None:
    ran: list[str] = []

    def hung(ctx: CheckContext) -> CheckResult:
        ran.append("two_lane")
        raise ServerUnreachable("POST http://127.0.0.2:8080/completion: timed out (ReadTimeout)")

    def later(name: str):
        def fn(ctx: CheckContext) -> CheckResult:
            ran.append(name)
            return CheckResult(name=name, verdict="passed")

        return fn

    names = list(suite.CHECKS)[1:4]  # the first three model checks after identity
    ctx = CheckContext(client=_IdleServer(), profile=load_profile("lab"), pair="lab", options=NO_PROBE)  # type: ignore[arg-type]
    res = suite.run_suite(
        ctx, only=names, overrides={names[0]: hung, names[1]: later(names[1]), names[2]: later(names[2])}
    )
    assert ran == ["two_lane"], ran  # nothing waited on the dead server after the first timeout
    assert not res.passed
    by = {r.name: r for r in res.results}
    assert by[names[0]].verdict == "error"
    assert all(by[n].verdict == "skipped" and "not answering" in by[n].message for n in names[1:])


# --- issue 28: bounds from the pair's measured speed, not from constants ------------------------


def _speeds(pp: float, tg: float) -> budget.Speeds:
    return budget.Speeds(prompt_per_s=pp, generated_per_s=tg, source="test figures")


def test_a_slow_real_pair_gets_bounds_from_its_own_speed() -> None:
    """The issue's pair: ~7 prompt tokens/s over RPC on a loaded 2-core machine. The old constant
    bound (300 prompt tok/s) gave its two near-full lanes about a minute; measured speeds give
    them what they need, times the profile's slowdown allowance."""
    prof = load_profile("lab-real")
    old = budget.for_profile(prof)
    b = budget.from_speeds(prof, _speeds(7.0, 5.0))
    prompt, gen = budget._largest_request(prof, 0.125, None)
    work = prof.parallel * (prompt / 7.0 + gen / 5.0)
    assert b.completion_s == round(prof.speed.slowdown_allowance * work + budget.MARGIN_S, 1)
    assert b.completion_s > 4 * old.completion_s
    assert "7.0 tok/s" in b.why and "test figures" in b.why
    # one batch of prompt at 7 tok/s slowed by the allowance and grown to a full slot's context
    # (512 cells against the probe's 256): /slots may be silent that long, three times over, with
    # no cap (issue 42 item 2: a stopped server is caught by the services' CPU time instead)
    growth = prof.per_slot_ctx() / 256
    assert b.stall_s == round(3 * prof.speed.slowdown_allowance * prof.batch_size / 7.0 * growth, 1)
    mid = budget.from_speeds(prof, _speeds(60.0, 20.0))
    assert mid.stall_s == round(3 * prof.speed.slowdown_allowance * prof.batch_size / 60.0 * growth, 1)
    assert "allowance" in mid.speeds["stall_why"] and "context growth 2.00" in mid.speeds["stall_why"]
    assert mid.speeds["idle_s"] == budget.IDLE_S and "CPU time" in mid.speeds["idle_why"]
    # a fast pair's stall bound does not drop below the minimum
    assert budget.from_speeds(prof, _speeds(5000.0, 900.0)).stall_s == budget.STALL_MIN_S


def test_slower_than_the_floor_is_its_own_failure_with_both_figures() -> None:
    prof = load_profile("lab-real")
    with pytest.raises(budget.TooSlow) as e:
        budget.from_speeds(prof, _speeds(1.5, 50.0))
    msg = str(e.value)
    assert "slower than the profile's floor" in msg and "measured 1.50 tok/s" in msg and "floor 2 tok/s" in msg
    assert "speed.min_prompt_tokens_per_s" in msg
    with pytest.raises(budget.TooSlow, match="generation measured 0.50"):
        budget.from_speeds(prof, _speeds(100.0, 0.5))
    assert not budget.is_transport_failure(msg)  # slow is not "unreachable"


def test_declared_floors_and_stall_bound_come_from_the_profile() -> None:
    prof = load_profile("lab-real").model_copy(
        update={"speed": load_profile("lab-real").speed.model_copy(update={"stall_s": 45.0, "slowdown_allowance": 2})}
    )
    b = budget.from_speeds(prof, _speeds(50.0, 20.0))
    assert b.stall_s == 45.0 and "declared" in b.speeds["stall_why"]
    assert b.to_dict()["speeds"]["floors"]["stall_s"] == 45.0


def test_the_speed_probe_is_bounded_by_the_floors_and_within_two_minutes_when_hung() -> None:
    for name in ("lab", "lab-real"):
        pb = budget.probe_budget(load_profile(name))
        assert pb.stall_s <= 120, (name, pb)  # a SIGSTOPped server fails the probe within 2 minutes
        assert pb.completion_s > pb.stall_s


@pytest.mark.parametrize(
    "message, transport",
    [
        ("ServerStalled: POST http://x/completion: stopped making progress for 31 s (...)", True),
        ("ServerTooSlow: POST http://x/completion: still making progress but not done within 90 s", True),
    ],
)
def test_stalls_end_the_suite_like_an_unreachable_server(message: str, transport: bool) -> None:
    assert budget.is_transport_failure(message) is transport


def test_progress_signature_changes_with_prompt_and_generation_progress() -> None:
    from orchestrator.server.client import progress_signature

    def slot(done: int, decoded: int, busy: bool = True, task: int = 7) -> dict:
        return {"id": 0, "id_task": task, "is_processing": busy, "n_prompt_tokens_processed": done,
                "next_token": [{"n_decoded": decoded}]}  # fmt: skip

    a = progress_signature([slot(256, 0)])
    assert a != progress_signature([slot(512, 0)])  # prompt processing moved
    assert a != progress_signature([slot(256, 1)])  # a token was generated
    assert a != progress_signature([slot(256, 0, task=8)])  # another task started
    assert a == progress_signature([slot(256, 0)])  # nothing moved: a stall
    assert progress_signature([{"id": 0, "is_processing": False}]) == ((0, None, False, None, None),)


# --- issue 42 item 2: bounds that scale with the work; a stopped server caught by its CPU time ---------


def test_the_silence_bound_covers_a_batch_of_two_near_full_lanes_at_4x_context() -> None:
    """The operator's profile (ctx 4096, 2 slots, batch 1024, ubatch 256) on a busy 2-core machine:
    the probe measured 34 prompt tok/s on 128 tokens, and one 1024-token batch of two near-full
    lanes then took about 100 s; the old cap (100 s) called that a stall after 101 s."""
    prof = load_profile("lab-real").model_copy(update={"ctx_size": 4096, "batch_size": 1024, "ubatch_size": 256})
    b = budget.from_speeds(prof, _speeds(34.0, 20.0))
    growth, deep, probe = budget.context_growth(prof)
    assert (deep, probe, growth) == (2048, 256, 8.0)
    assert b.stall_s == round(3 * prof.speed.slowdown_allowance * 1024 / 34.0 * 8.0, 1)
    assert b.stall_s > 10 * 110  # the batch seen taking ~100-110 s is far inside it
    assert "1024 tokens / 34.0 prompt tok/s x context growth 8.00" in b.speeds["stall_why"]
    # the batch bound never exceeds what the lanes hold, and grows with the lanes on a unified cache
    small = load_profile("lab-real").model_copy(update={"ctx_size": 256, "batch_size": 4096})
    assert "batch 512 tokens" in budget.from_speeds(small, _speeds(34.0, 20.0)).speeds["stall_why"]
    uni = prof.model_copy(update={"extra_args": ["--kv-unified"]})
    assert budget.context_growth(uni)[0] == 16.0


GOLDEN = __import__("pathlib").Path(__file__).parent / "golden"


def test_proc_stat_gives_state_and_cpu_ticks_from_real_lines() -> None:
    """Captured on this machine: a busy python3 (R, 16 ticks) and a SIGSTOPped process (T)."""
    from orchestrator.hosts.probes import parse_proc_stat

    assert parse_proc_stat((GOLDEN / "proc_pid_stat_running.txt").read_bytes()) == ("R", 16)
    state, ticks = parse_proc_stat((GOLDEN / "proc_pid_stat_stopped.txt").read_bytes()) or ("", -1)
    assert state == "T" and ticks >= 0
    # a command name with spaces and parentheses is counted from its last ")"
    line = (GOLDEN / "proc_pid_stat_running.txt").read_bytes().replace(b"(python3)", b"(a) b (c)")
    assert parse_proc_stat(line) == ("R", 16)
    assert parse_proc_stat(b"") is None and parse_proc_stat(b"12 (x) R 1") is None


class _SlowServer:
    """A real HTTP server whose /completion answers after `answer_s` and whose /slots answers only
    when no request computes, as llama-server's answers only between batches (one long batch)."""

    def __init__(self, answer_s: float) -> None:
        import http.server
        import json as _json
        import threading
        import time as _time

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _send(self, body: object) -> None:
                data = _json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the poll gave up on this late answer (its own bound), as a real server sees it

            def do_GET(self) -> None:
                idle.wait()  # no answer during the batch
                self._send([{"id": 0, "id_task": 1, "is_processing": True, "n_prompt_tokens_processed": 1024}])

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                idle.clear()
                _time.sleep(answer_s)
                idle.set()
                self._send(_json.loads((GOLDEN / "completion.json").read_text()))

        idle = threading.Event()
        idle.set()
        self.idle = idle
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.idle.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_long_batch_that_burns_cpu_is_not_a_stall_and_a_stopped_server_is() -> None:
    """/slots silent for longer than the idle bound: while the services' CPU time moves the request
    goes on to its answer; when it stops moving (SIGSTOP, deadlock) the request fails at idle_s,
    naming the process state, long before the (work-derived) stall bound."""
    import itertools
    import time

    from orchestrator.server.client import ProgressWatch, ServerClient, ServerStalled

    srv = _SlowServer(answer_s=2.5)
    try:
        ticks = itertools.count()
        working = ProgressWatch(
            stall_s=60.0, poll_s=0.1, alive=lambda: (("llama-server", 7, "R", next(ticks)),), idle_s=1.0
        )
        with ServerClient(srv.url) as c:
            c.watch = working
            t0 = time.monotonic()
            r = c.completion([1, 2, 3], 1, timeout=30)
            assert r.content and time.monotonic() - t0 >= 2.4
            # a host that does not answer the reading (a cut SSH session) is no sign of a stop
            c.watch = ProgressWatch(stall_s=60.0, poll_s=0.1, alive=lambda: None, idle_s=1.0)
            assert c.completion([1, 2, 3], 1, timeout=30).content
            c.watch = ProgressWatch(stall_s=60.0, poll_s=0.1, alive=lambda: (("llama-server", 7, "T", 5),), idle_s=1.0)
            t0 = time.monotonic()
            with pytest.raises(ServerStalled) as e:
                c.completion([1, 2, 3], 1, timeout=30)
            took = time.monotonic() - t0
        assert 1.0 <= took < 2.4, took
        msg = str(e.value)
        assert "stopped making progress" in msg and "llama-server pid 7 state T" in msg and "no CPU time" in msg
        assert budget.is_transport_failure(msg)
        # issue 42: a SIGSTOPped llama-server while the RPC server still computes the batch it was
        # sent (its CPU time moving for a minute and more at 4x context): stopped all the same
        rpc_ticks = itertools.count()
        c2 = ServerClient(srv.url)

        def both() -> tuple[tuple[str, int, str, int], ...]:
            return (("llama-server", 7, "T", 5), ("ggml-rpc-server", 8, "R", next(rpc_ticks)))

        c2.watch = ProgressWatch(stall_s=60.0, poll_s=0.1, idle_s=1.0, alive=both)
        t0 = time.monotonic()
        with c2, pytest.raises(ServerStalled):
            c2.completion([1, 2, 3], 1, timeout=30)
        assert 1.0 <= time.monotonic() - t0 < 2.4
    finally:
        srv.close()


class _SteppingServer(_SlowServer):
    """/slots answers at once, its prompt count moving at the given moments (seconds after the
    request came): batches that lengthen as the context fills; /completion answers at `answer_s`."""

    def __init__(self, moves: list[float], answer_s: float) -> None:
        super().__init__(answer_s)
        import time as _time

        self.moves, self.started = moves, _time.monotonic()
        outer = self

        def slots(h: Any) -> None:
            n = sum(1 for m in outer.moves if _time.monotonic() - outer.started >= m)
            h._send([{"id": 0, "id_task": 1, "is_processing": True, "n_prompt_tokens_processed": 256 * n}])

        handler = self.httpd.RequestHandlerClass
        handler.do_GET = slots  # type: ignore[method-assign]

    def restart(self) -> None:
        import time as _time

        self.started = _time.monotonic()


def test_without_a_cpu_reading_a_hung_server_fails_in_minutes_and_a_slowing_one_passes() -> None:
    """Review of issue 42: with no CPU-time reading (a host's /proc unreadable) the work-derived
    stall bound alone judged, ~6,400 s on the field profile. Now it is held to `blind_s` (one batch
    at the probe's speed x the allowance's factor), raised to `blind_factor` x the longest silence
    between batches seen: batches that lengthen (0.4, 0.8, 1.2 s) pass under a 1 s ceiling, a server
    whose /slots stops moving fails at the ceiling, not at the 60 s bound."""
    import time

    from orchestrator.server.client import ProgressWatch, ServerClient, ServerStalled

    srv = _SteppingServer([0.4, 1.2, 2.4], answer_s=2.6)
    try:
        with ServerClient(srv.url) as c:
            c.watch = ProgressWatch(stall_s=60.0, poll_s=0.05, alive=lambda: None, idle_s=1.0, blind_s=1.0,
                                    blind_factor=3.0)  # fmt: skip
            srv.restart()
            assert c.completion([1, 2, 3], 1, timeout=30).content
            assert c.watch.gaps and 1.1 <= c.watch.gaps[0] < 1.6, c.watch.gaps
            hung = ProgressWatch(stall_s=60.0, poll_s=0.05, alive=lambda: None, idle_s=1.0, blind_s=1.0,
                                 blind_factor=3.0)  # fmt: skip
            c.watch, srv.moves = hung, []
            t0 = time.monotonic()
            with pytest.raises(ServerStalled) as e:
                c.completion([1, 2, 3], 1, timeout=30)
        assert time.monotonic() - t0 < 2.5
        assert "no CPU-time reading" in str(e.value) and "bound 1 s" in str(e.value)
    finally:
        srv.close()


def test_the_blind_bound_is_one_batch_at_the_probe_speed_times_the_factor() -> None:
    """The issue's operator profile (ctx 4096, 2 slots, batch 1024; probe 34 tok/s): the stall bound
    counts context growth 8 (2,891 s); without a CPU reading a hung server fails in 361 s, still
    3.6x the ~100 s its honest deepest batch took on the busy machine."""
    prof = load_profile("lab-real").model_copy(update={"ctx_size": 4096, "batch_size": 1024})
    b = budget.from_speeds(prof, _speeds(34.0, 20.0))
    assert b.stall_s == pytest.approx(2891.3)
    assert b.blind_s == pytest.approx(361.4) and b.blind_factor == 12.0
    w = b.watch(alive=None)
    assert w.blind_stall_s() == pytest.approx(361.4)
    w.gaps.append(100.0)  # a 100 s batch seen: the next may take up to 12 x that (held to stall_s)
    assert w.blind_stall_s() == pytest.approx(1200.0)


def test_a_stopped_server_fails_at_idle_s_when_half_the_readings_come_late() -> None:
    """Found on the busy lab (load 20, ctx 4096): a SIGSTOPped llama-server was not failed in 4
    minutes. One CPU-time reading came back late (None): the watch forgot the baseline and waited
    on /slots for the whole work-derived stall bound (2.6 hours). Readings are cumulative, so a
    None teaches nothing and forgets nothing, and /slots is never waited on past idle_s."""
    import itertools
    import time

    from orchestrator.server.client import ProgressWatch, ServerClient, ServerStalled

    srv = _SlowServer(answer_s=20.0)  # a batch whose /slots never answers, as a stopped server's
    try:
        stopped = (("llama-server", 7, "T", 5),)
        readings = itertools.cycle([stopped, None])
        with ServerClient(srv.url) as c:
            c.watch = ProgressWatch(stall_s=600.0, poll_s=0.1, alive=lambda: next(readings), idle_s=1.0)
            t0 = time.monotonic()
            with pytest.raises(ServerStalled) as e:
                c.completion([1, 2, 3], 1, timeout=30)
        assert time.monotonic() - t0 < 5.0
        assert "no CPU time used by llama-server pid 7 state T" in str(e.value)
    finally:
        srv.close()


def test_two_watches_sharing_the_reader_both_get_each_reading() -> None:
    """Found on the busy lab: the two near-full lanes' watches share one CPU-time reader and poll
    together; the second caller of a reading in flight got None, so that lane never judged idle and
    a SIGSTOPped llama-server held the check for the blind bound (12 minutes) instead of ~30 s."""
    import threading
    import time

    reading = (("llama-server", 7, "T", 5),)

    def slow() -> Any:
        time.sleep(0.3)
        return reading

    r = budget._Bounded(slow, wait_s=2.0)
    got: list[Any] = []
    ts = [threading.Thread(target=lambda: got.append(r())) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == [reading, reading]


def test_a_host_that_hangs_does_not_hang_the_watch() -> None:
    """The CPU-time reading goes over SSH; a frozen sshd must not stop the watch from judging."""
    import threading
    import time

    gate = threading.Event()
    reading = (("llama-server", 7, "S", 3),)

    def slow() -> tuple:
        gate.wait(10)
        return reading

    read = budget._Bounded(slow, wait_s=0.2)
    t0 = time.monotonic()
    assert read() is None and read() is None  # the same reading still in flight: no second thread
    assert time.monotonic() - t0 < 1.0
    gate.set()
    assert read() == reading  # the late reading is handed to the next call
    assert budget._Bounded(lambda: reading)() == reading
    assert budget._Bounded(lambda: 1 / 0)() is None  # type: ignore[arg-type,return-value]


def test_services_cpu_reads_the_main_threads_of_real_processes(tmp_path) -> None:
    """The reader the watch uses, on real processes through the local transport: a busy one's CPU
    ticks move, a SIGSTOPped one reads state T and its ticks stand still."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from orchestrator.remote.local import LocalTransport

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        roots = {}
        for role, service, proc in (("native", "llama-server", busy), ("rpc", "ggml-rpc-server", stopped)):
            root = tmp_path / role
            (root / "run").mkdir(parents=True)
            (root / "run" / f"{service}.pid").write_text(f"{proc.pid}\n")
            roots[role] = str(root)
        t = LocalTransport()
        read = budget.services_cpu({"native": t, "rpc": t}, roots)
        first = read()
        time.sleep(0.5)
        second = read()
        assert first is not None and second is not None
        by1, by2 = {s[0]: s for s in first}, {s[0]: s for s in second}
        assert by2["llama-server"][1] == busy.pid and by2["llama-server"][3] > by1["llama-server"][3]
        assert by2["ggml-rpc-server"][2] == "T" and by2["ggml-rpc-server"][3] == by1["ggml-rpc-server"][3]
        assert budget.services_cpu({"native": t}, {"native": str(tmp_path / "none")})() is None
    finally:
        for p in (busy, stopped):
            p.kill()
            p.wait()
