"""Pure parts of rollouts (ops/rollout.py), revision resolution refusals and hooks (real child processes)."""

from __future__ import annotations

import json
import sys

import pytest

from orchestrator.config.inventory import Inventory
from orchestrator.errors import ConfigError
from orchestrator.ops.hooks import event_document, run_hooks
from orchestrator.ops.revision import PairPackages, build_command
from orchestrator.ops.rollout import (
    LEASED,
    NOT_STARTED,
    PASSED,
    REFUSED,
    ROLLBACK_FAILED,
    ROLLED_BACK,
    SKIPPED,
    fleet_exit_code,
    on_revision,
    plan_waves,
)
from orchestrator.paths import Home


def test_waves_canary_alone_first_then_serial():
    assert plan_waves(["a", "b", "c", "d"], "c", 2) == [["c"], ["a", "b"], ["d"]]
    assert plan_waves(["a", "b", "c"], None, 3) == [["a", "b", "c"]]
    assert plan_waves(["a", "b", "c"], None, 1) == [["a"], ["b"], ["c"]]


def test_waves_refuse_bad_input():
    with pytest.raises(ConfigError, match="--canary x"):
        plan_waves(["a"], "x", 1)
    with pytest.raises(ConfigError, match="--serial"):
        plan_waves(["a"], None, 0)


@pytest.mark.parametrize(
    ("outcomes", "codes", "want"),
    [
        ([PASSED, SKIPPED], [0, 0], 0),
        ([PASSED, ROLLED_BACK, NOT_STARTED], [0, 7, 0], 7),
        ([ROLLED_BACK, ROLLBACK_FAILED], [7, 8], 8),
        ([PASSED, LEASED], [0, 5], 5),
        ([LEASED, REFUSED], [5, 4], 4),
        ([REFUSED, REFUSED], [4, 6], 1),
        ([LEASED, ROLLED_BACK], [5, 7], 7),
    ],
)
def test_fleet_exit_code(outcomes, codes, want):
    assert fleet_exit_code(outcomes, codes) == want


PP = PairPackages("lab1", "lab", "lab", "lab-aaaa-cpu-lab", "lab-aaaa-cpu-lab")


def _st(**route):
    base = {"active_packages": [PP.native, PP.rpc], "state": "active", "active": f"{PP.native} + {PP.rpc} (lab)"}
    return {"route": {**base, **route}, "problems": [], "health": "ok"}


def test_on_revision_only_when_active_accepted_same_profile_and_healthy():
    assert on_revision(_st(), PP) is not None
    assert on_revision(_st(state="activating"), PP) is None
    assert on_revision(_st(active_packages=["x", "y"]), PP) is None
    assert on_revision(_st(active=f"{PP.native} + {PP.rpc} (lab-unloadable)"), PP) is None
    assert on_revision({**_st(), "health": "not healthy"}, PP) is None
    assert on_revision({**_st(), "problems": ["lab1-native: ..."]}, PP) is None
    assert on_revision({"route": None, "problems": [], "health": "ok"}, PP) is None


def test_build_command_is_one_shell_line():
    assert build_command("lab-b", ["v100", "rtx5060ti"], "production", None) == (
        "pairctl build --rev lab-b --target v100 --target rtx5060ti --profile production"
    )
    assert build_command("a b", ["t"], "p", None) == "pairctl build --rev 'a b' --target t --profile p"


FAIL = "import sys; print('no', file=sys.stderr); sys.exit(2)"


def _inv(tmp_path, hooks):
    return Inventory.model_validate({"hosts": {}, "pairs": {}, "hooks": hooks})


def test_hooks_get_the_event_on_stdin_and_failures_are_recorded(tmp_path):
    out = tmp_path / "got.json"
    write = f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"
    inv = _inv(
        tmp_path,
        [
            {"on": ["fleet.finished"], "argv": [sys.executable, "-c", write]},
            {
                "on": ["fleet.finished"],
                "argv": [sys.executable, "-c", FAIL],
            },
            {"on": ["fleet.finished"], "argv": [sys.executable, "-c", "import time; time.sleep(5)"], "timeout_s": 0.3},
            {"on": ["fleet.finished"], "argv": [str(tmp_path / "missing-program")]},
            {"on": ["deploy.passed"], "argv": [sys.executable, "-c", "raise SystemExit(9)"]},
        ],
    )
    home = Home.resolve(tmp_path / "home")
    recs = run_hooks(home, inv, event_document("fleet.finished", "done", exit_code=7))
    assert [r["ok"] for r in recs] == [True, False, False, False]  # the deploy.passed hook did not run
    assert json.loads(out.read_text())["exit_code"] == 7 and json.loads(out.read_text())["text"] == "done"
    assert recs[1]["error"] == "exit 2: no"
    assert "timeout" in recs[2]["error"] and recs[2]["seconds"] < 3
    assert "could not start" in recs[3]["error"]
    logged = (home.logs / "hooks.jsonl").read_text().splitlines()
    assert len(logged) == 4 and oct((home.logs / "hooks.jsonl").stat().st_mode & 0o777) == "0o600"


def test_hook_inventory_refuses_unknown_events_and_shell_strings():
    with pytest.raises(ValueError, match="deploy.failed"):
        Inventory.model_validate({"hosts": {}, "hooks": [{"on": ["deploy.failed"], "argv": ["x"]}]})
    with pytest.raises(ValueError):
        Inventory.model_validate({"hosts": {}, "hooks": [{"on": ["fleet.finished"], "argv": "curl -d @- x"}]})


# -- the command line refuses before any host is touched (no lab: the hosts do not exist) ----------


def _pairctl(tmp_path, *args):
    from tests.plugins.cli import run_cli

    return run_cli(["--home", str(tmp_path / "home"), "--inventory", "lab3", "--json", *args])


def test_deploy_rev_refuses_an_unresolvable_revision(tmp_path):
    r = _pairctl(tmp_path, "deploy", "--rev", "no-such-tag", "--all")
    assert r.exit_code == 6, r.output
    err = json.loads(r.stdout)["error"]
    assert "no source repository" in err["message"] and "--source DIR" in err["hint"]


def test_deploy_rev_names_the_build_command_for_missing_packages(tmp_path):
    rev = "ab" * 20
    r = _pairctl(tmp_path, "deploy", "--rev", rev, "--pair", "lab1", "--pair", "lab3")
    assert r.exit_code == 6, r.output
    err = json.loads(r.stdout)["error"]
    assert f"lab-{rev[:10]}-cpu-lab (for lab1, lab3)" in err["message"] and "nothing was started" in err["message"]
    assert err["hint"] == f"build them first: pairctl build --rev {rev} --target cpu-lab --profile lab"


@pytest.mark.parametrize(
    "args",
    [
        ("deploy", "--pair", "lab1", "--pair", "lab2", "--packages", "a", "b"),  # ids are for one pair
        ("deploy", "--all", "--native", "a", "--rpc", "b"),
        ("deploy", "--rev", "x", "--packages", "a", "b", "--pair", "lab1"),
        ("deploy", "--rev", "x", "--pair", "lab1", "--canary", "lab2"),  # canary outside the --pair list
        ("deploy", "--rev", "x", "--all", "--serial", "0"),
    ],
)
def test_rollout_usage_errors(tmp_path, args):
    r = _pairctl(tmp_path, *args)
    assert r.exit_code == 2, r.output


def test_waves_n_pauses_after_n_waves_and_exits_0(monkeypatch):
    """`--waves N` (Argo's pause): N waves run, the rest are `paused` with the way to continue;
    the wave loop only (each pair's run is the engine's, proven on the lab elsewhere)."""
    from orchestrator.ops import rollout as ro

    ran: list[str] = []

    def one(home, inventory, result, run, argv):
        ran.append(run.pair)
        run.outcome = PASSED
        return run

    monkeypatch.setattr(ro, "_labelled_one", one)
    waves = plan_waves(["a", "b", "c"], "a", 1)
    runs = {p: ro.PairRun(p, i, "deploy") for i, w in enumerate(waves) for p in w}
    res = ro.RolloutResult("deploy", "r", "c", ro.RolloutOptions(canary="a", waves=2), waves, list(runs.values()))
    res.timings = {"waves_s": []}
    ro._run_waves(None, None, res, runs, [], lambda line: None)  # type: ignore[arg-type]
    assert ran == ["a", "b"] and runs["c"].outcome == ro.PAUSED
    assert "run the same command again" in (runs["c"].reason or "")
    assert res.exit_code() == 0 and res.paused() and res.waves_run() == 2
    assert res.as_dict()["outcome"] == "paused"  # not "passed": waves are left
    with pytest.raises(ConfigError, match="--waves"):
        ro.check_options(ro.RolloutOptions(waves=-1))
