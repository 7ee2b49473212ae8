"""Issue 32's small items that need no lab: a crontab line with `%`, an argument that is not
UTF-8, `pairctl init` and scheduled units written through a planted link."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from orchestrator.ops import schedule as sched


def _cron_command(line: str) -> tuple[str, str | None]:
    """What cron runs for a crontab(5) line: the sixth field on, cut at the first `%` not escaped
    by a backslash (the rest is stdin), `\\%` turned into `%`."""
    command = line.split(None, 5)[5]
    out, i = [], 0
    while i < len(command):
        ch = command[i]
        if ch == "\\" and command[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if ch == "%":
            return "".join(out), command[i + 1 :]
        out.append(ch)
        i += 1
    return "".join(out), None


def test_crontab_line_with_percent_runs_the_whole_argv():
    s = sched.Schedule(
        pair="lab",
        every_s=sched.parse_every("1h"),
        argv=sched.accept_argv("/opt/pairctl", home="/srv/50%/h", inventory="/etc/inv%d.yaml", pair="lab", checks=None),
        home="/srv/50%/h",
    )
    command, stdin = _cron_command(s.crontab_line())
    assert stdin is None, f"cron would cut the command at a %: {s.crontab_line()}"
    words = shlex.split(command.split("  #")[0])
    assert words[0] == "PAIRCTL_HOME=/srv/50%/h" and words[1:] == list(s.argv)


def test_an_argument_that_is_not_utf8_is_a_usage_error(tmp_path):
    """`lease take --purpose $'\\xff'` was an internal error after the leases were asked for."""
    exe = Path(sys.executable).parent / "pairctl"
    r = subprocess.run(
        [str(exe), "--home", str(tmp_path / "h"), "lease", "take", "lab", "--purpose", b"fix \xff it", "--ttl", "1m"],
        capture_output=True,
        timeout=60,
    )
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, err
    assert "argument 7" in err and "not valid UTF-8" in err and "internal error" not in err


def test_init_never_writes_through_a_link_at_its_temp_name(tmp_path, cli):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    repo = tmp_path / "ops"
    (repo / "inventories").mkdir(parents=True)
    os.symlink(victim, repo / "inventories" / ".site.yaml.tmp")
    r = cli("init", str(repo))
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "keep me\n"
    assert "hosts:" in (repo / "inventories" / "site.yaml").read_text()


def test_scheduled_units_never_written_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    s = sched.Schedule(pair="lab", every_s=3600, argv=("/opt/pairctl", "accept"), home="/h")
    os.symlink(victim, tmp_path / f"{s.unit_name}.service.tmp")
    paths = sched.write_units(s, tmp_path)
    assert victim.read_text() == "keep me\n" and all(p.is_file() and not p.is_symlink() for p in paths)


def test_lab_down_removes_the_reboot_lines_its_deploys_wrote(tmp_path):
    """Issue 32 #10: `lab down` left root's @reboot lines pointing into deleted lab homes (whoever
    recreates the path gets root at the next boot). A private lab home with one host whose root
    a deploy persisted (the real crontab of this user, as on the lab): down removes that line only."""
    import getpass
    import json

    from orchestrator.hosts import boot
    from orchestrator.hosts.layout import HostLayout
    from orchestrator.lab.lab import down_all
    from orchestrator.paths import Home
    from orchestrator.remote.local import LocalTransport
    from tests.plugins.cli import run_cli

    home = Home.resolve(tmp_path / "home")
    hdir = home.lab / "hosts" / "h-down"
    (hdir / "root").mkdir(parents=True)
    (hdir / "host.json").write_text(json.dumps({"address": "127.0.0.77", "port": 2299, "user": getpass.getuser()}))
    t, layout = LocalTransport("h-down"), HostLayout(str(hdir / "root"))
    got = boot.ensure_entry(t, layout)
    if got.get("persistence") != "cron":
        import pytest

        pytest.skip(f"no crontab here: {got}")
    try:
        assert boot.read_entry(t, layout).get("persistence") == "cron"
        # as an operator runs it: `pairctl lab down` printed "internal error" (KeyError 'pids') here
        r = run_cli(["--home", str(home.root), "lab", "down"])
        assert r.exit_code == 0 and "removed the @reboot crontab line on h-down" in r.stdout, r.output
        assert "internal error" not in r.output
        assert boot.read_entry(t, layout).get("persistence") != "cron"
        boot.ensure_entry(t, layout)
        report = down_all(home)
        assert {"host": "h-down", "what": "@reboot crontab line", "pids": []} in report.stopped
        text = boot.read_crontab(t).text or ""
        assert str(hdir / "root") not in text
    finally:
        boot.remove_entry(t, layout)
