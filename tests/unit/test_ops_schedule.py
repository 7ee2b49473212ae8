"""Scheduled acceptance units and the Prometheus textfile output."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.checks.textfile import write_acceptance
from orchestrator.errors import ConfigError
from orchestrator.ops import schedule as sched


def make(pair: str = "lab", every: str = "6h") -> sched.Schedule:
    exe = str(Path(sys.executable).absolute().parent / "pairctl")
    return sched.Schedule(
        pair=pair,
        every_s=sched.parse_every(every),
        argv=sched.accept_argv(
            exe, home="/var/lib/pair ctl", inventory="/etc/pairctl/inv 1.yaml", pair=pair, checks=["identity"]
        ),
        home="/var/lib/pair ctl",
    )


@pytest.mark.parametrize(
    "every, seconds, cron", [("30m", 1800, "*/30 * * * *"), ("6h", 21600, "0 */6 * * *"), ("1d", 86400, "0 0 * * *")]
)
def test_every_and_cron(every, seconds, cron):
    assert sched.parse_every(every) == seconds
    assert sched.cron_spec(seconds) == cron


def test_every_reads_durations_as_everywhere_else():
    assert sched.parse_every("90min") == sched.parse_every("1h30m") == 5400


@pytest.mark.parametrize("bad", ["", "6", "1m", "6 weeks", "999d"])
def test_bad_interval_rejected(bad):
    with pytest.raises(ConfigError):
        sched.parse_every(bad)


def test_systemd_quoting():
    assert sched.systemd_quote("plain-arg") == "plain-arg"
    assert sched.systemd_quote("a b") == '"a b"'
    assert sched.systemd_quote('say "hi" $HOME 50%') == '"say \\"hi\\" $$HOME 50%%"'


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_generated_units_verify(tmp_path):
    paths = sched.write_units(make(), tmp_path)
    sched.verify_units(paths)  # raises on any problem
    text = paths[0].read_text()
    assert "SuccessExitStatus=11" in text and "--scheduled" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_verify_catches_a_broken_unit(tmp_path):
    paths = sched.write_units(make(), tmp_path)
    paths[0].write_text(paths[0].read_text().replace("ExecStart=", "ExecStart=/nonexistent/pairctl "))
    with pytest.raises(Exception, match="rejected"):
        sched.verify_units(paths)


def test_list_and_remove_only_managed(tmp_path):
    sched.write_units(make("p1"), tmp_path)
    (tmp_path / "pairctl-accept-foreign.timer").write_text("[Timer]\n")
    rows = sched.list_units(tmp_path)
    assert [r["unit"] for r in rows] == ["pairctl-accept-p1"]
    assert len(sched.remove_units("pairctl-accept-p1", tmp_path)) == 2
    assert sched.remove_units("pairctl-accept-foreign", tmp_path) == []


def test_crontab_line_is_quoted():
    line = make().crontab_line()
    assert line.startswith("0 */6 * * * PAIRCTL_HOME='/var/lib/pair ctl' ")
    assert "'/etc/pairctl/inv 1.yaml'" in line


def _samples(path: Path) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_textfile_parses_and_keeps_last_success(tmp_path):
    p = write_acceptance(
        tmp_path,
        pair="lab",
        now=1000.0,
        passed=True,
        checks={"identity": True, "cancel": True},
        tokens_per_second=1100.5,
    )
    s = _samples(p)
    assert s[("pairctl_acceptance_last_success_timestamp_seconds", (("pair", "lab"),))] == 1000.0
    assert s[("pairctl_acceptance_check_passed", (("check", "cancel"), ("pair", "lab")))] == 1.0
    assert s[("pairctl_generation_tokens_per_second", (("pair", "lab"),))] == 1100.5
    p = write_acceptance(
        tmp_path,
        pair="lab",
        now=2000.0,
        passed=False,
        checks={"identity": True, "cancel": False},
        tokens_per_second=None,
    )
    s = _samples(p)
    assert s[("pairctl_acceptance_last_success_timestamp_seconds", (("pair", "lab"),))] == 1000.0
    assert s[("pairctl_acceptance_last_run_timestamp_seconds", (("pair", "lab"),))] == 2000.0
    assert s[("pairctl_acceptance_passed", (("pair", "lab"),))] == 0.0
    assert s[("pairctl_acceptance_check_passed", (("check", "cancel"), ("pair", "lab")))] == 0.0


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_schedule_cli_install_list_remove(cli, tmp_path):
    import json

    r = cli(
        "--json",
        "schedule",
        "install",
        "--pair",
        "lab",
        "--every",
        "6h",
        "--checks",
        "identity",
        "--unit-dir",
        str(tmp_path),
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["mode"] == "systemd" and out["enabled"] is False and len(out["units"]) == 2
    service = (tmp_path / "pairctl-accept-lab.service").read_text()
    assert " accept --pair lab --scheduled --checks identity" in service
    listed = json.loads(cli("--json", "schedule", "list", "--unit-dir", str(tmp_path)).stdout)
    assert [x["unit"] for x in listed] == ["pairctl-accept-lab"]
    assert cli("schedule", "remove", "--pair", "lab", "--unit-dir", str(tmp_path)).exit_code == 0
    assert not list(tmp_path.iterdir())


def test_schedule_cli_refuses_unknown_pair_and_bad_interval(cli, tmp_path):
    assert cli("schedule", "install", "--pair", "nope", "--unit-dir", str(tmp_path)).exit_code == 3
    assert cli("schedule", "install", "--pair", "lab", "--every", "2m", "--unit-dir", str(tmp_path)).exit_code == 3
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(sched.systemd_running(), reason="systemd runs here: install would enable a real timer")
def test_schedule_cli_without_systemd_prints_the_crontab_line(cli):
    r = cli("schedule", "install", "--pair", "lab", "--every", "30m")
    assert r.exit_code == 0
    assert "*/30 * * * *" in r.stdout and "accept --pair lab --scheduled" in r.stdout
