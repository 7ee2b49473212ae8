"""Qualification plans: fixture hashes checked at load, order, gates, fit to the profile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config.profiles import load_profile
from orchestrator.errors import ConfigError
from orchestrator.hashing import sha256_file
from orchestrator.paths import MANIFESTS
from orchestrator.qualify import fixture_text
from orchestrator.qualify.plan import load_plan


def write_plan(tmp_path: Path, **over) -> Path:
    fx = tmp_path / "fx.txt"
    fx.write_text("hello world " * 20)
    data = {
        "name": "t",
        "fixtures": [{"name": "a", "family": "code", "path": "fx.txt", "sha256": sha256_file(fx), "tokens": 100}],
        "n_predict": 32,
        "pairs": 3,
        "gates": [{"kind": "gain", "family": "code", "threshold": 0.05}],
    }
    data.update(over)
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_plans_load_and_fit_their_profiles():
    lab = load_plan("lab")
    assert (lab.plan.pairs, lab.plan.repeats, len(lab.plan.fixtures)) == (8, 3, 2)
    assert lab.plan.calibration is not None and lab.plan.calibration.required
    lab.plan.check_fits(load_profile("lab"))
    field = load_plan("mmvf-field")
    assert field.plan.families == ["code", "prose", "structured"]
    assert (field.plan.pairs, field.plan.n_predict) == (5, 512)
    assert all(f.tokens == 8192 for f in field.plan.fixtures)
    field.plan.check_fits(load_profile("production"))
    assert field.sha256 == sha256_file(field.path)


def test_shipped_fixtures_are_the_generator_output(tmp_path):
    made = fixture_text.write_shipped(tmp_path)
    for name, p in made.items():
        assert sha256_file(p) == sha256_file(MANIFESTS / "fixtures" / "qualify" / name), name


def test_fixture_hash_mismatch_is_a_config_error_naming_the_fixture(tmp_path):
    p = write_plan(tmp_path)
    (tmp_path / "fx.txt").write_text("changed")
    with pytest.raises(ConfigError, match=r"fixture 'a': .*fx.txt has sha256 .* the plan says"):
        load_plan(p)


def test_missing_fixture_file(tmp_path):
    p = write_plan(tmp_path)
    (tmp_path / "fx.txt").unlink()
    with pytest.raises(ConfigError, match="fixture 'a': file .* not found"):
        load_plan(p)


def test_fixture_text_rechecks_hash_during_a_run(tmp_path):
    lp = load_plan(write_plan(tmp_path))
    assert lp.fixture_text("a").startswith("hello")
    (tmp_path / "fx.txt").write_text("tampered")
    with pytest.raises(ConfigError, match="changed since the plan was loaded"):
        lp.fixture_text("a")


def test_fixture_longer_than_the_slot_names_the_fixture(tmp_path):
    lp = load_plan(write_plan(tmp_path))
    lp.plan.check_fits(load_profile("lab"))  # 100 + 32 fits 2048
    big = load_plan(write_plan(tmp_path, n_predict=1990))  # 100 + 1990 > 2048
    with pytest.raises(
        ConfigError, match=r"fixture 'a' \(100 prompt \+ 1990 generated\) needs 2090 tokens.*2048 of profile lab"
    ):
        big.plan.check_fits(load_profile("lab"))


def test_alternating_order_reverses_each_pair():
    lp = load_plan("lab")  # the lab plan runs a random order (issue 31); its alternating form:
    assert lp.plan.model_copy(update={"order": "alternating"}).arm_order() == [
        (0, "baseline"),
        (0, "candidate"),
        (1, "candidate"),
        (1, "baseline"),
        (2, "baseline"),
        (2, "candidate"),
        (3, "candidate"),
        (3, "baseline"),
        (4, "baseline"),
        (4, "candidate"),
        (5, "candidate"),
        (5, "baseline"),
        (6, "baseline"),
        (6, "candidate"),
        (7, "candidate"),
        (7, "baseline"),
    ]


def test_explicit_order(tmp_path):
    lp = load_plan(write_plan(tmp_path, pairs=2, order=["candidate", "baseline", "candidate", "baseline"]))
    assert lp.plan.arm_order() == [(0, "candidate"), (0, "baseline"), (1, "candidate"), (1, "baseline")]
    with pytest.raises(ConfigError, match="pair 2 .* must hold one baseline and one candidate"):
        load_plan(write_plan(tmp_path, pairs=2, order=["candidate", "baseline", "candidate", "candidate"]))
    with pytest.raises(ConfigError, match="lists 2 x pairs = 4 arms"):
        load_plan(write_plan(tmp_path, pairs=2, order=["candidate", "baseline"]))


@pytest.mark.parametrize(
    "gates, match",
    [
        ([{"kind": "gain", "family": "nope", "threshold": 0.05}], "no fixture has that family"),
        ([{"kind": "gain", "family": "code", "threshold": -0.05}], "gain gate needs a threshold >= 0"),
        ([{"kind": "non_regression", "threshold": 0.01}], "floor at or below 0"),
        ([{"kind": "speedup", "threshold": 0.01}], "gates.0.kind"),
        ([], "gates"),
    ],
)
def test_bad_gates(tmp_path, gates, match):
    with pytest.raises(ConfigError, match=match):
        load_plan(write_plan(tmp_path, gates=gates))


def test_unknown_key_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown key"):
        load_plan(write_plan(tmp_path, gate_after_seeing_data=True))


def test_plan_hash_changes_with_any_edit(tmp_path):
    p = write_plan(tmp_path)
    h1 = load_plan(p).sha256
    p.write_text(p.read_text().replace("threshold: 0.05", "threshold: 0.04"))
    assert load_plan(p).sha256 != h1


def test_registered_as_manifest_kind_plan():
    from orchestrator.cli import config_registry as registry

    assert registry.schemas()["plan"].__name__ == "QualifyPlan"
    results = [registry.check_file(MANIFESTS / "plans" / f, kind=None) for f in ("lab.yaml", "mmvf-field.yaml")]
    assert [r.problems for r in results] == [(), ()]
