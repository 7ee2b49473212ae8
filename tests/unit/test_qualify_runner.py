"""The runner's bookkeeping and the report's recomputation, on a real evidence store.

The pair here is a scripted stand-in (no llama-server, no hosts): these tests check ORDER and
EVIDENCE — plan hash before the first sample, one step per arm in alternating order, every raw
sample in the receipt, restore last, a failed restore deriving into a full result without
re-measuring. The capability itself (real servers, real packages) is tests/e2e/test_qualify.py.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.config.profiles import load_profile
from orchestrator.errors import CheckFailed, EvidenceError, RollbackFailed
from orchestrator.evidence.receipt import parse_time
from orchestrator.evidence.store import EvidenceStore
from orchestrator.qualify.plan import load_plan
from orchestrator.qualify.report import load_record, write_report
from orchestrator.qualify.runner import ActiveArm, ArmPackages, Hooks, run_qualification
from orchestrator.server.models import CompletionResult, StreamChunk, Timings

PLAN = str(Path(__file__).parent / "data" / "qualify" / "lab-uncalibrated.yaml")  # 3 pairs, 1 repeat, no calibration

BASE = ArmPackages("base-n", "base-r")
CAND = ArmPackages("cand-n", "cand-r")


class ScriptedClient:
    """Answers like llama-server's /tokenize, /completion and its SSE stream, with set speeds."""

    def __init__(self, tg: float, log: list):
        self.tg, self.log = tg, log

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def completion(self, prompt, n_predict, **params):
        self.log.append(("warmup", params.get("cache_prompt")))
        return CompletionResult(
            content="x",
            id_slot=0,
            tokens_predicted=n_predict,
            tokens_evaluated=3,
            truncated=False,
            stop_type="limit",
            timings=Timings(predicted_n=n_predict, prompt_n=3),
        )

    @contextmanager
    def stream_completion(self, prompt, n_predict, **params):
        self.log.append(("measure", len(prompt), params["cache_prompt"], params["ignore_eos"]))
        t = Timings(
            prompt_n=len(prompt),
            prompt_ms=10.0,
            prompt_per_second=len(prompt) / 0.01,
            predicted_n=n_predict,
            predicted_ms=n_predict / self.tg * 1000,
            predicted_per_second=self.tg,
            draft_n=30,
            draft_n_accepted=20,
        )
        chunks = [
            StreamChunk(content="a", tokens=[1]),
            StreamChunk(content="b", stop=True, timings=t, stop_type="limit"),
        ]
        yield None, iter(chunks)


class ScriptedHold:
    """What the runner uses of `hosts.leases.HeldLeases`."""

    def __init__(self) -> None:
        self.kept: str | None = None

    def public(self):
        return {"hosts": [{"host": "n"}, {"host": "r"}]}

    def keep(self, reason: str) -> None:
        self.kept = reason

    def end(self):
        return {"kept": self.kept} if self.kept else {"released": ["n", "r"]}


class ScriptedDriver:
    def __init__(self, speeds: dict[str, list[float]], fail_restore: bool = False):
        self.speeds = {k: list(v) for k, v in speeds.items()}
        self.events: list = []
        self.holds: list = []
        self.fail_restore = fail_restore

    def snapshot(self):
        self.events.append("snapshot")
        return {"native": "orig-n", "rpc": "orig-r", "revision": 4}

    def activate(self, packages, profile):
        arm = "baseline" if packages == BASE else "candidate"
        self.events.append(("activate", arm))
        return ActiveArm(
            client=ScriptedClient(self.speeds[arm].pop(0), self.events),
            identity={"build_info": f"b1-{arm}"},
            per_slot_ctx=profile.per_slot_ctx(),
            memory=lambda: (1000, "scripted"),
        )

    @contextmanager
    def hold(self, run_id):
        """The pair's leases: when taken and released relative to the other events."""
        self.holds.append(("hold", run_id, len(self.events)))
        held = ScriptedHold()
        yield held
        self.holds.append(("kept", held.kept, len(self.events)) if held.kept else ("released", None, len(self.events)))

    def restore(self, snapshot):
        self.events.append(("restore", snapshot["native"]))
        if self.fail_restore:
            raise CheckFailed("route read-back timed out")
        return {"native": snapshot["native"], "verified": True}

    def close(self):
        pass


def run(tmp_path: Path, driver, hooks=None):
    store = EvidenceStore(tmp_path / "evidence")
    out = run_qualification(
        store=store,
        loaded=load_plan(PLAN),
        pair="lab",
        baseline=BASE,
        candidate=CAND,
        profile=load_profile("lab"),
        driver=driver,
        argv=["qualify", "--pair", "lab"],
        hooks=hooks,
        write_report=lambda h: write_report(store, h)[0],
    )
    return store, out


SPEEDS = {"baseline": [100.0, 101.0, 99.0], "candidate": [110.0, 111.0, 109.0]}


def test_alternating_arms_fresh_activation_warmup_then_fixtures_then_restore(tmp_path):
    d = ScriptedDriver(SPEEDS)
    store, out = run(tmp_path, d)
    arms = [e[1] for e in d.events if isinstance(e, tuple) and e[0] == "activate"]
    assert arms == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]
    assert d.events[0] == "snapshot" and d.events[-1] == ("restore", "orig-n")
    # after each activation: one warm-up, then both fixtures, cold (cache_prompt false), EOS ignored
    first = d.events.index(("activate", "baseline"))
    assert d.events[first + 1] == ("warmup", False)
    assert d.events[first + 2 : first + 4] == [("measure", 200, False, True)] * 2
    assert out.restored and out.arm_steps[0] == "arm-01-p1-baseline" and out.arm_steps[2] == "arm-03-p2-candidate"

    r = store.load(out.receipt)
    assert r.outcome == "passed"
    assert sum(len(v) for v in r.samples.values()) == 12  # 3 pairs x 2 arms x 2 fixtures, every one raw
    row = r.samples["arm-02-p1-candidate"][0]
    assert row["package_native"] == "cand-n" and row["fixture_sha256"] == load_plan(PLAN).plan.fixtures[0].sha256
    extra = r.extra_fields()
    assert extra["plan_sha256"] == load_plan(PLAN).sha256
    declared = next(f for f in r.fields_set if f.key == "plan_sha256")
    assert parse_time(declared.at) < parse_time(r.first_sample_at)
    assert [s.name for s in r.steps][-1] == "restore"
    assert all(s.data["tokenizer_agrees"] for s in r.steps if s.name.startswith("arm-"))
    g = {(x["kind"], x["family"]): x["verdict"] for x in extra["qualification"]["gates"]}
    assert g == {("gain", "code"): "pass", ("non_regression", "code"): "pass", ("non_regression", "prose"): "pass"}
    md = (out.report_dir / "report.md").read_text()
    assert "Qualification PASS" in md and "| gain | code | +5.00% |" in md
    assert (out.report_dir / "ratios.png").read_bytes()[:4] == b"\x89PNG"


def test_report_states_failed_gate(tmp_path):
    d = ScriptedDriver({"baseline": [100.0, 100.0, 100.0], "candidate": [97.0, 97.5, 97.2]})
    store, out = run(tmp_path, d)
    assert out.result.verdict == "fail"
    assert store.load(out.receipt).outcome == "failed"
    md = (out.report_dir / "report.md").read_text()
    assert "**FAIL**" in md and "non_regression | prose" in md


def test_failed_restore_after_all_samples_derives_without_remeasuring(tmp_path):
    d = ScriptedDriver(SPEEDS, fail_restore=True)
    store, out = run(tmp_path, d)
    original = store.load(out.receipt)
    assert original.outcome == "failed" and "restore failed after measurements" in original.reason
    assert not out.restored and len(out.arm_steps) == 6
    activations = sum(1 for e in d.events if isinstance(e, tuple) and e[0] == "activate")

    derived = store.derive(
        out.receipt,
        reuse=["snapshot", *out.arm_steps],
        reason="restore read-back timed out after all samples; pair verified by hand",
        fresh_steps=[{"name": "restore", "outcome": "passed", "data": {"verified": "by hand"}}],
    )
    out_dir, record, result = write_report(store, derived)
    assert sum(1 for e in d.events if isinstance(e, tuple) and e[0] == "activate") == activations  # nothing re-measured
    assert record.derived and record.origin == out.receipt and len(record.samples) == 12
    assert result.to_json()["gates"] == out.result.to_json()["gates"]
    assert store.load(derived).outcome == "passed"
    assert "derived; measured in" in (out_dir / "report.md").read_text()
    assert json.loads((out_dir / "result.json").read_text())["origin"] == out.receipt


def test_arm_failure_stops_measuring_restores_and_is_inconclusive(tmp_path):
    d = ScriptedDriver({"baseline": [100.0, 100.0], "candidate": [110.0, 111.0]})

    def boom(name):
        if name == "arm-03-p2-candidate":
            raise CheckFailed("identity does not match after start")

    store, out = run(tmp_path, d, hooks=Hooks(after_arm=boom))
    assert out.restored and out.result.verdict == "inconclusive"
    assert store.load(out.receipt).outcome == "inconclusive"
    assert d.events[-1] == ("restore", "orig-n")


def test_record_with_tampered_plan_text_is_rejected(tmp_path):
    store, out = run(tmp_path, ScriptedDriver(SPEEDS))
    path = store.path_of(out.receipt)
    data = json.loads(path.read_bytes())
    assert load_record(store, out.receipt).plan.name == "lab-uncalibrated"
    data["plan_text"] = data["plan_text"].replace("threshold: 0.05", "threshold: 0.01")
    path.chmod(0o644)
    path.write_text(json.dumps(data))
    with pytest.raises(EvidenceError):
        load_record(store, out.receipt)


# ---- the CLI over receipts: exit codes and the derive path end to end through `pairctl` ----


def test_cli_report_exit_codes_follow_the_gates(tmp_path, cli):
    _, ok = run(tmp_path / "a", ScriptedDriver(SPEEDS))
    r = cli("qualify", "report", ok.receipt[:12], home=tmp_path / "a")  # the hash positional, as receipts show
    assert r.exit_code == 0, r.output
    assert "report: " in r.stdout and "report.md" in r.stdout
    _, bad = run(tmp_path / "b", ScriptedDriver({"baseline": [100.0] * 3, "candidate": [97.0] * 3}))
    r = cli("qualify", "report", "--receipt", bad.receipt, home=tmp_path / "b")
    assert r.exit_code == 1 and "qualification failed" in r.stderr


def test_cli_derive_then_report_rebuilds_result_without_remeasuring(tmp_path, cli):
    d = ScriptedDriver(SPEEDS)
    store, out = run(
        tmp_path,
        d,
        hooks=Hooks(after_restore=lambda v: (_ for _ in ()).throw(CheckFailed("final route read timed out"))),
    )
    assert not out.restored and store.load(out.receipt).outcome == "failed"
    assert d.events[-1] == ("restore", "orig-n")  # the restore itself ran; the final read failed
    reuse = ",".join(["snapshot", *out.arm_steps])
    fresh = tmp_path / "fresh.json"  # the failed step, checked again by hand: a derived record needs it covered
    fresh.write_text(json.dumps([{"name": "restore", "outcome": "passed", "data": {"verified": "by hand"}}]))
    r = cli(
        "--json",
        "receipts",
        "derive",
        "--from",
        out.receipt,
        "--reuse",
        reuse,
        "--fresh",
        str(fresh),
        "--reason",
        "final route read timed out after all samples; restore verified by hand",
        home=tmp_path,
    )
    assert r.exit_code == 0, r.output
    derived = json.loads(r.stdout)["hash"]
    r = cli("--json", "qualify", "report", "--receipt", derived, home=tmp_path)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["derived"] is True and j["origin"] == out.receipt and j["verdict"] == "pass"
    assert j["samples_total"] == 12


def test_unexpected_error_in_an_arm_still_restores(tmp_path):
    class Exploding(ScriptedDriver):
        def activate(self, packages, profile):
            if len([e for e in self.events if isinstance(e, tuple) and e[0] == "activate"]) == 1:
                self.events.append(("activate", "boom"))
                raise RuntimeError("unexpected")
            return super().activate(packages, profile)

    d = Exploding(SPEEDS)
    store, out = run(tmp_path, d)
    assert d.events[-1] == ("restore", "orig-n") and out.restored
    assert isinstance(out.stop_error, RuntimeError)
    r = store.load(out.receipt)
    assert r.outcome == "inconclusive" and "RuntimeError: unexpected" in r.step("arm-02-p1-candidate").error


def test_pair_is_held_from_before_the_snapshot_until_after_the_restore(tmp_path):
    d = ScriptedDriver(SPEEDS)
    store, out = run(tmp_path, d)
    r = store.load(out.receipt)
    assert d.holds == [("hold", r.run_id, 0), ("released", None, len(d.events))]
    extra = r.extra_fields()
    assert extra["qualify_leases"] == {"hosts": [{"host": "n"}, {"host": "r"}]}


def test_arm_whose_rollback_failed_is_not_restored_onto_and_leases_stay(tmp_path):
    class RollbackFails(ScriptedDriver):
        def activate(self, packages, profile):
            if any(isinstance(e, tuple) and e[0] == "activate" for e in self.events):
                self.events.append(("activate", "rollback failed"))
                raise RollbackFailed("deploy failed at step 'verify'; the rollback failed at step 'start-server'")
            return super().activate(packages, profile)

    d = RollbackFails(SPEEDS)
    store, out = run(tmp_path, d)
    assert not any(
        isinstance(e, tuple) and e[0] == "restore" for e in d.events
    )  # nothing deployed onto an unknown state
    assert not out.restored and out.restore_error.startswith("not attempted, an arm's rollback failed")
    assert d.holds[-1][0] == "kept" and "state is unknown" in d.holds[-1][1]
    r = store.load(out.receipt)
    assert r.outcome == "failed" and "not attempted" in r.reason


def test_fixture_longer_than_the_servers_slot_is_a_config_error_after_restore(tmp_path):
    class SmallSlots(ScriptedDriver):
        def activate(self, packages, profile):
            a = super().activate(packages, profile)
            a.per_slot_ctx = 256  # 200 prompt + 128 generated do not fit
            return a

    d = SmallSlots(SPEEDS)
    store, out = run(tmp_path, d)
    assert d.events[-1] == ("restore", "orig-n")
    assert "fixture 'code'" in str(out.stop_error) and "per-slot context of 256" in str(out.stop_error)
    assert store.load(out.receipt).outcome == "inconclusive"


def test_cli_refuses_before_touching_a_host(tmp_path, cli):
    args = ("qualify", "--pair", "lab", "--baseline", "x", "y", "--candidate", "z", "w")
    r = cli(*args, "--plan", "mmvf-field", home=tmp_path)  # 8192 + 512 tokens vs the lab's 2048-token slots
    assert r.exit_code == 3 and "fixture 'code'" in r.stderr and "per-slot context 2048" in r.stderr
    r = cli(*args, "--plan", "lab", home=tmp_path)
    assert r.exit_code == 6 and "no package 'x'" in r.stderr
    r = cli("qualify", "--pair", "lab", "--plan", "lab", home=tmp_path)
    assert r.exit_code == 3 and "--baseline, --candidate" in r.stderr
    assert not (tmp_path / "evidence" / "receipts").exists() or not any((tmp_path / "evidence" / "receipts").iterdir())


# ---- issue 22: repeats, calibration (A/A) and the plan refused at the measured noise -----------


def _lab_run(tmp_path, driver, **kw):
    store = EvidenceStore(tmp_path / "evidence")
    out = run_qualification(
        store=store,
        loaded=load_plan("lab"),
        pair="lab",
        baseline=BASE,
        candidate=CAND,
        profile=load_profile("lab"),
        driver=driver,
        argv=["qualify"],
        write_report=lambda h: write_report(store, h)[0],
        **kw,
    )
    return store, out


def test_calibrate_runs_the_baseline_in_both_arms_and_records_the_noise(tmp_path):
    from orchestrator.qualify.calibration import find_calibration, judge, profile_key

    plan = load_plan("lab").plan
    n = plan.calibration.pairs
    quiet = [100.0, 101.0, 99.5, 100.5, 100.2, 99.8, 100.1, 99.9, 100.3, 99.7, 100.4, 99.6, 100.6, 99.4, 100.0, 100.1]
    d = ScriptedDriver({"baseline": quiet[: 2 * n], "candidate": []})
    store, out = _lab_run(tmp_path, d, calibrate=True)
    assert [e for e in d.events if isinstance(e, tuple) and e[0] == "activate"] == [("activate", "baseline")] * (2 * n)
    rec = store.load(out.receipt)
    cal = rec.extra_fields()["calibration"]
    assert rec.outcome == "passed", rec.reason  # about 0.5% noise: every lab gate resolvable at 8 pairs
    assert "noise floor" in rec.reason and cal["measurement_key"] == plan.measurement_key()
    assert 0 < cal["families"]["code"]["sigma"] < 0.02 and all(g["resolvable"] for g in cal["gates"])
    rows = [r for s, rs in rec.samples.items() if s.startswith("arm-") for r in rs]
    assert len(rows) == 2 * n * 2 * plan.repeats and {r["rep"] for r in rows} == {0, 1, 2}
    # the qualification finds it, and is judged by it
    found = find_calibration(
        store, pair="lab", plan=plan, profile_sha256=profile_key(load_profile("lab")), baseline=BASE.to_dict()
    )
    assert found is not None and found[0] == out.receipt
    assert judge(plan, found, calibrate_hint="x")["receipt"] == out.receipt
    assert find_calibration(store, pair="lab", plan=plan, profile_sha256="other", baseline=BASE.to_dict()) is None
    md = (out.report_dir / "report.md").read_text()
    assert md.startswith("# A/A calibration") and "| Resolvable |" in md


def test_noisy_calibration_is_inconclusive_and_refuses_the_plan(tmp_path):
    from orchestrator.errors import Inconclusive
    from orchestrator.qualify.calibration import find_calibration, judge, profile_key

    plan = load_plan("lab").plan
    loud = [100.0, 150.0, 70.0, 130.0, 60.0, 160.0, 90.0, 140.0, 75.0, 125.0, 65.0, 155.0, 80.0, 150.0, 60.0, 140.0]
    store, out = _lab_run(tmp_path, ScriptedDriver({"baseline": loud, "candidate": []}), calibrate=True)
    rec = store.load(out.receipt)
    assert rec.outcome == "inconclusive" and "needs" in rec.reason and "the plan has 8" in rec.reason
    found = find_calibration(
        store, pair="lab", plan=plan, profile_sha256=profile_key(load_profile("lab")), baseline=BASE.to_dict()
    )
    with pytest.raises(Inconclusive, match="refused before the first sample"):
        judge(plan, found, calibrate_hint="x")


def test_qualification_records_the_noise_it_was_judged_by_and_a_candidate_profile(tmp_path):
    d = ScriptedDriver(
        {
            "baseline": [100.0, 100.5, 99.5, 100.2, 99.9, 100.1, 100.0, 99.8],
            "candidate": [40.0, 40.5, 39.5, 40.2, 39.9, 40.1, 40.0, 39.8],
        }
    )
    noise = {"receipt": "c" * 64, "pairs": 6, "families": {}, "gates": []}
    store, out = _lab_run(tmp_path, d, noise=noise, candidate_profile=load_profile("lab-draft-other"))
    rec = store.load(out.receipt)
    assert rec.extra_fields()["qualify_noise"] == noise
    assert rec.extra_fields()["qualify_candidate_profile"]["name"] == "lab-draft-other"
    assert out.result.verdict == "fail" and out.result.noise == noise
    assert {g.verdict for g in out.result.gates if g.kind == "non_regression"} == {"fail"}
    assert load_record(store, out.receipt).noise == noise  # the report recomputes with it


def test_random_order_seed_and_rules_recorded_before_the_first_sample(tmp_path):
    """A plan with `order: random` and no seed: the run draws one, records it (with the spread
    floor and drift bounds) in `qualify_rules` before any sample, runs the arms in exactly that
    seed's order, and the report shows the order, the spread that decided and the position effect."""
    import yaml

    src = load_plan(PLAN)
    data = yaml.safe_load(src.path.read_text())
    for f in data["fixtures"]:
        f["path"] = str(src.fixture_paths[f["name"]])
    data.update(order="random", pairs=4)
    plan_file = tmp_path / "random.yaml"
    plan_file.write_text(yaml.safe_dump(data))
    d = ScriptedDriver({"baseline": [100.0, 101.0, 99.0, 100.5], "candidate": [110.0, 111.0, 109.0, 110.5]})
    store = EvidenceStore(tmp_path / "evidence")
    out = run_qualification(
        store=store,
        loaded=load_plan(plan_file),
        pair="lab",
        baseline=BASE,
        candidate=CAND,
        profile=load_profile("lab"),
        driver=d,
        argv=["qualify", "--pair", "lab"],
        write_report=lambda h: write_report(store, h)[0],
    )
    r = store.load(out.receipt)
    rules = r.extra_fields()["qualify_rules"]
    assert rules["order"] == "random" and isinstance(rules["order_seed"], int) and rules["floor"] is None
    declared = next(f for f in r.fields_set if f.key == "qualify_rules")
    assert parse_time(declared.at) < parse_time(r.first_sample_at)
    ran = [e[1] for e in d.events if isinstance(e, tuple) and e[0] == "activate"]
    assert ran == [a for _, a in load_plan(plan_file).plan.arm_order(rules["order_seed"])]
    assert out.result.order["order_seed"] == rules["order_seed"]
    assert out.result.order["position"]["code"]["balanced"] is True
    md = (out.report_dir / "report.md").read_text()
    assert f"random (seed {rules['order_seed']}) order" in md
    assert "**no calibration**" in md and "own (no calibration)" in md
    assert "position effect (second arm of a pair vs first)" in md and "balanced, so it cancels" in md
    # recomputed from the receipt alone: the same rules, the same verdicts
    rec = load_record(store, out.receipt)
    assert rec.rules == rules


def test_restore_expects_the_snapshots_packages_and_what_the_restore_rendered():
    """The benchmark's calibration of 2026-12-05 10:00: a pair deployed by an earlier pairctl (its
    profile model had no `cors` block) was restored by this one; the record then named the same
    packages and the profile and argv this pairctl rendered, and the old check called it
    "not restored" (exit 8). The hashes the restore's own deploy rendered are expected, and the
    move is kept for the receipt; other packages are still a failed restore."""
    from orchestrator.qualify.engine_driver import restore_expectation

    snap = {"native": "n1", "rpc": "r1", "profile_sha256": "p-old", "argv_sha256": "a-old"}
    want, moved = restore_expectation(snap, {"native_package": "n1", "rpc_package": "r1",
                                             "profile_sha256": "p-new", "argv_sha256": "a-new"})  # fmt: skip
    assert want == {"native": "n1", "rpc": "r1", "profile_sha256": "p-new", "argv_sha256": "a-new"}
    assert moved == {"re_rendered": {"profile_sha256": {"found": "p-old", "rendered": "p-new"},
                                     "argv_sha256": {"found": "a-old", "rendered": "a-new"}}}  # fmt: skip
    same, none = restore_expectation(snap, {"profile_sha256": "p-old", "argv_sha256": "a-old"})
    assert same == snap and none == {}
    # nothing rendered (a deploy that reported no route entry): the snapshot's own hashes stand
    assert restore_expectation(snap, None) == (snap, {})
    # the packages always come from the snapshot, never from what happened to be deployed
    seen_other = {"native": "n2", "rpc": "r1", "profile_sha256": "p-new", "argv_sha256": "a-new"}
    assert seen_other != want
