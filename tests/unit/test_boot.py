"""Boot persistence (orchestrator/hosts/boot.py): the crontab merge, cron's view of the line and
`crontab -l` parsing are pure and tested as data; `pairctl-svc boot` is run for real on this
machine (real processes through the LocalTransport, no SSH, no crontab touched): it starts
again exactly the argv the last `start` got, leaves a deliberately stopped service stopped, and
waits while a lease is held."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.hosts import boot
from orchestrator.hosts.layout import HostLayout, install_helper
from orchestrator.hosts.supervisor import parse_state
from orchestrator.lab.lab import stop_services
from orchestrator.remote.local import LocalTransport

ROOT = "/srv/pairctl"
LAYOUT = HostLayout(ROOT)
LINE = boot.entry(LAYOUT)
MARK = boot.marker(ROOT)


# -- the crontab line and its merge (pure) -------------------------------------------------------


def test_entry_runs_the_installed_helper_for_its_root():
    reboot, watch = LINE.split("\n")
    assert reboot == "@reboot sh /srv/pairctl/bin/pairctl-svc boot /srv/pairctl"
    assert watch == "* * * * * sh /srv/pairctl/bin/pairctl-svc watch /srv/pairctl"
    assert shlex.split(boot.cron_command(reboot)) == ["sh", "/srv/pairctl/bin/pairctl-svc", "boot", ROOT]
    assert shlex.split(boot.cron_command(watch)) == ["sh", "/srv/pairctl/bin/pairctl-svc", "watch", ROOT]


def test_an_older_single_reboot_line_is_replaced_by_both():
    old = f"0 3 * * * mine\n{MARK}\n@reboot sh /srv/pairctl/bin/pairctl-svc boot {ROOT}\n* * * * * theirs\n"
    assert boot.entry_state(old, ROOT, LINE) == "differs"
    merged = boot.merge_crontab(old, ROOT, LINE)
    assert merged == f"0 3 * * * mine\n{MARK}\n{LINE}\n* * * * * theirs\n"  # the user's own line stays
    assert boot.entry_state(merged, ROOT, LINE) == "installed"


def test_merge_into_an_empty_crontab():
    assert boot.merge_crontab("", ROOT, LINE) == f"{MARK}\n{LINE}\n"


def test_merge_is_idempotent_and_keeps_the_users_lines_in_order():
    user = "MAILTO=ops@example.org\n# my backup\n0 3 * * * /usr/local/bin/backup --all\n"
    once = boot.merge_crontab(user, ROOT, LINE)
    assert once == user + f"{MARK}\n{LINE}\n"
    assert boot.merge_crontab(once, ROOT, LINE) is once  # unchanged: nothing is written again
    assert once.count(LINE) == 1


def test_drop_removes_only_this_roots_line():
    """A root whose services became systemd units loses its line; the user's lines and other
    roots' stay in order, and a crontab without the line is returned unchanged (nothing written)."""
    user = "MAILTO=ops@example.org\n0 3 * * * /usr/local/bin/backup --all"
    other = HostLayout("/srv/pairctl-b")
    both = boot.merge_crontab(boot.merge_crontab(user, ROOT, LINE), other.root, boot.entry(other))
    kept = boot.drop_entry(both, ROOT)
    assert kept == boot.merge_crontab(user, other.root, boot.entry(other))
    assert boot.entry_state(kept, ROOT, LINE) == "absent"
    assert boot.entry_state(kept, other.root, boot.entry(other)) == "installed"
    assert boot.drop_entry(user, ROOT) is user  # no trailing newline added, nothing to write
    assert boot.drop_entry(f"{MARK}\n{LINE}\n", ROOT) == ""


def test_two_roots_of_one_user_coexist():
    other = HostLayout("/srv/pairctl-b")
    both = boot.merge_crontab(boot.merge_crontab("", ROOT, LINE), other.root, boot.entry(other))
    assert boot.entry_state(both, ROOT, LINE) == "installed"
    assert boot.entry_state(both, other.root, boot.entry(other)) == "installed"
    assert boot.merge_crontab(both, ROOT, LINE) == both
    # a root that is a prefix of the other's is a different root
    assert boot.entry_state(both, "/srv/pair", boot.entry(HostLayout("/srv/pair"))) == "absent"


def test_a_changed_line_is_replaced_in_place_and_strays_dropped():
    old = f"0 1 * * * a\n{MARK}\n@reboot sh /old/bin/pairctl-svc boot {ROOT}\n5 5 * * * b\n{LINE}\n{MARK}\n@reboot x\n"
    merged = boot.merge_crontab(old, ROOT, LINE)
    assert merged == f"0 1 * * * a\n{MARK}\n{LINE}\n5 5 * * * b\n"
    assert boot.entry_state(old, ROOT, LINE) == "differs"
    assert boot.entry_state(merged, ROOT, LINE) == "installed"


def test_a_user_line_after_our_marker_that_is_not_reboot_is_kept():
    text = f"{MARK}\n0 3 * * * mine\n"
    assert boot.merge_crontab(text, ROOT, LINE) == f"{MARK}\n{LINE}\n0 3 * * * mine\n"


def test_no_trailing_newline_in_the_users_crontab():
    assert boot.merge_crontab("0 3 * * * mine", ROOT, LINE) == f"0 3 * * * mine\n{MARK}\n{LINE}\n"


def test_entry_state():
    assert boot.entry_state("", ROOT, LINE) == "absent"
    assert boot.entry_state(f"{MARK}\n{LINE}\n", ROOT, LINE) == "installed"
    assert boot.entry_state(f"{MARK}\n{LINE}\n{LINE}\n", ROOT, LINE) == "differs"
    assert boot.entry_state(f"{LINE}\n", ROOT, LINE) == "differs"  # without its marker


def test_cron_command_percent_rules():
    assert boot.cron_command("@reboot echo a\\%b") == "echo a%b"
    assert boot.cron_command("@reboot echo a%b") == "echo a"  # the rest would be stdin
    assert boot.cron_command("@reboot echo a\\b") == "echo a\\b"
    assert boot.cron_command("*/5 * * * * echo hi") == "echo hi"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1))
def test_any_root_cron_can_carry_reaches_sh_as_its_argv(name):
    root = "/" + name
    if boot.unfit_for_cron(root):
        assert "\n" in root or "\r" in root or "\\%" in root
        return
    layout = HostLayout(root)
    line = boot.entry(layout)
    reboot, watch = line.split("\n")
    assert shlex.split(boot.cron_command(reboot)) == boot.boot_argv(layout)
    assert shlex.split(boot.cron_command(watch)) == ["sh", layout.svc, "watch", root]
    merged = boot.merge_crontab("0 3 * * * mine\n", root, line)
    assert boot.entry_state(merged, root, line) == "installed"


@pytest.mark.parametrize(
    ("status", "out", "err", "want"),
    [
        (0, "0 3 * * * x\n", "", boot.CrontabRead("0 3 * * * x\n")),
        (1, "", "no crontab for root\n", boot.CrontabRead("")),
        (127, "", "sh: 1: crontab: not found\n", boot.CrontabRead(None, missing=True)),
        (127, "", "crontab: command not found\n", boot.CrontabRead(None, missing=True)),
    ],
)
def test_parse_crontab_list(status, out, err, want):
    assert boot.parse_crontab_list(status, out, err) == want


def test_parse_crontab_list_other_failures_are_errors():
    got = boot.parse_crontab_list(1, "", "crontab: your UID isn't in the passwd file. bailing out.\n")
    assert got.text is None and not got.missing and "exited 1" in (got.error or "")


def test_roots_cron_cannot_carry_are_named():
    assert boot.unfit_for_cron("/a\nb") and boot.unfit_for_cron("/a\\%b")
    assert boot.unfit_for_cron("/a%b c$d'e") is None


# -- pairctl-svc boot, run for real ----------------------------------------------------------------

NAME = "llama-server"
ODD = "a\nb $HOME %y 'q' \\"  # a line break, $, %, quotes and a backslash survive the round trip


@pytest.fixture
def host(tmp_path):
    t = LocalTransport("boot-test")
    layout = HostLayout(str(tmp_path / "root dir"))
    install_helper(t, layout)
    b = Path(layout.release("pkg"), "bin")
    b.mkdir(parents=True)
    shutil.copy2("/bin/dash", b / NAME)  # argv[0] names the service
    os.mkfifo(Path(layout.root, "never"))  # opening it for reading blocks: a service with no child
    yield t, layout
    t.run(layout.stop_cmd(NAME), check=False)


def _argv(layout: HostLayout) -> list[str]:
    return [layout.binary("pkg", NAME), "-c", 'read _ <"$1"', ODD, str(Path(layout.root, "never"))]


SUP = ["sup.backoff=0.1", "sup.backoff_max=0.2", "sup.probe_s=0.1"]


def _pid(layout: HostLayout) -> int | None:
    try:
        return int(Path(layout.log(f"{NAME}.pid")).read_text())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    except OSError:
        return None


def _power_loss(layout: HostLayout) -> None:
    """SIGKILL the supervisor and the service, their pid files left behind (as a power loss)."""
    for f in (f"{NAME}.sup.pid", f"{NAME}.pid"):
        pid = int(Path(layout.log(f)).read_text())
        os.kill(pid, 9)
    time.sleep(0.2)


def _boot_as_cron(layout: HostLayout, which: int = 0) -> None:
    """A crontab line's command (0: @reboot, 1: the watchdog), run the way cron runs it (`/bin/sh -c`,
    cron's environment)."""
    cmd = boot.cron_command(boot.entry(layout).split("\n")[which])
    env = {"HOME": "/root", "LOGNAME": "root", "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"}
    subprocess.run(["/bin/sh", "-c", cmd], env=env, check=True, timeout=30)


def _wait(cond, within_s: float = 10.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < within_s, "not within the bound"
        time.sleep(0.05)


def test_start_keeps_its_arguments_0600_and_boot_restores_exactly_them(host):
    t, layout = host
    t.run(layout.start_cmd(NAME, _argv(layout), SUP))
    f = Path(layout.log(f"{NAME}.boot"))
    assert f.stat().st_mode & 0o777 == 0o600
    assert f.read_bytes() == b"".join(a.encode() + b"\0" for a in [*SUP, *_argv(layout)])
    old = _pid(layout)
    assert old is not None and _cmdline(old) == _argv(layout)
    _power_loss(layout)
    _boot_as_cron(layout)
    _wait(lambda: _pid(layout) not in (None, old) and _cmdline(_pid(layout) or 0) == _argv(layout))
    _wait(lambda: parse_state(Path(layout.log(f"{NAME}.state")).read_text()).state == "running")
    assert parse_state(Path(layout.log(f"{NAME}.state")).read_text()).restarts == 0
    assert "started_by=boot" in Path(layout.log(f"{NAME}.state")).read_text()
    assert f"boot={NAME}:started" in Path(layout.log("boot.log")).read_text()
    # a second boot run (cron started twice, or by hand) starts nothing more
    new = _pid(layout)
    _boot_as_cron(layout)
    assert _pid(layout) == new and f"boot={NAME}:supervised" in Path(layout.log("boot.log")).read_text()


def test_a_deliberately_stopped_service_stays_stopped_at_boot(host):
    t, layout = host
    t.run(layout.start_cmd(NAME, _argv(layout), SUP))
    t.run(layout.stop_cmd(NAME))
    assert not Path(layout.log(f"{NAME}.boot")).exists()
    _boot_as_cron(layout)
    time.sleep(1.0)  # ten probe intervals
    assert _pid(layout) is None
    assert parse_state(Path(layout.log(f"{NAME}.state")).read_text()).state == "stopped"


def test_boot_waits_while_a_lease_left_by_a_cut_short_run_is_held(host):
    t, layout = host
    t.run(layout.start_cmd(NAME, _argv(layout), SUP))
    old = _pid(layout)
    _power_loss(layout)
    lock = Path(layout.leases, "host.lock")
    lock.mkdir()
    _boot_as_cron(layout)
    time.sleep(1.0)
    assert _pid(layout) is None  # nothing started (boot cleared the stale pid file)
    assert parse_state(Path(layout.log(f"{NAME}.state")).read_text()).state == "passive-lease"
    lock.rmdir()
    _wait(lambda: _pid(layout) not in (None, old) and _cmdline(_pid(layout) or 0) == _argv(layout))


def test_lab_down_is_a_deliberate_stop_for_boot_too(tmp_path):
    """`lab down` stops the lab's services itself (by pid file): their run/NAME.boot go too."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("llama-server", "ggml-rpc-server"):
        (run / f"{name}.boot").write_bytes(b"/x/bin/" + name.encode() + b"\0")
    stop_services(tmp_path)
    assert not list(run.glob("*.boot"))


def test_the_watchdog_brings_back_a_killed_supervisor_once_its_service_is_killed_too(host):
    """Without a service manager nothing supervised the supervisor: a kill -9 of it, then of its
    service, stayed down. The per-minute watchdog line, run as cron runs it: nothing while all is
    supervised, while the service outlives its supervisor, or while a lease is held, and the
    service back (same argv) once both are gone."""
    t, layout = host
    t.run(layout.start_cmd(NAME, _argv(layout), SUP))
    old = _pid(layout)
    _boot_as_cron(layout, 1)  # all supervised: nothing started, nothing logged
    assert _pid(layout) == old and not Path(layout.log("boot.log")).exists()
    sup = int(Path(layout.log(f"{NAME}.sup.pid")).read_text())
    os.kill(sup, 9)
    _wait(lambda: _cmdline(sup) is None)
    assert old is not None and _cmdline(old) == _argv(layout)  # the service itself still runs
    _boot_as_cron(layout, 1)  # so no `boot` each minute (it found it running and logged so, every time)
    assert not Path(layout.log("boot.log")).exists()
    os.kill(old, 9)
    _wait(lambda: _cmdline(old) is None)
    lock = Path(layout.leases, "host.lock")
    lock.mkdir()  # a lease being made holds the host: its holder starts what it wants
    _boot_as_cron(layout, 1)
    time.sleep(0.5)
    assert not Path(layout.log("boot.log")).exists()
    lock.rmdir()
    _boot_as_cron(layout, 1)
    _wait(lambda: _pid(layout) not in (None, old) and _cmdline(_pid(layout) or 0) == _argv(layout))
    assert f"boot={NAME}:started" in Path(layout.log("boot.log")).read_text()


def test_the_watchdog_leaves_a_supervisor_that_gave_up_alone(host):
    t, layout = host
    t.run(layout.start_cmd(NAME, _argv(layout), SUP))
    sup, svc = (int(Path(layout.log(f)).read_text()) for f in (f"{NAME}.sup.pid", f"{NAME}.pid"))
    os.killpg(sup, 9)  # its whole group: a `mv` it forked could otherwise replace the state file below
    with contextlib.suppress(ProcessLookupError):  # gone already where it was in that group
        os.kill(svc, 9)
    _wait(lambda: _cmdline(sup) is None and _cmdline(svc) is None)
    state = Path(layout.log(f"{NAME}.state"))
    state.write_text(state.read_text() + "state=given-up\n")  # as a crash loop ends it
    _boot_as_cron(layout, 1)
    time.sleep(0.5)
    assert not Path(layout.log("boot.log")).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the runtime dir of root: /run/pairctl-0")
def test_lab_teardown_stops_a_service_left_in_the_runtime_dir(tmp_path):
    """review-f49: a lab service started while run/ was read-only keeps its pidfiles in the runtime
    dir (/run/pairctl-0/ROOTTAG of this test's own root): stop_services finds and stops it too."""
    from orchestrator.hosts.units import root_tag

    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    exe = tmp_path / "llama-server"
    shutil.copy2("/bin/sleep", exe)
    rt = Path(f"/run/pairctl-0/{root_tag(str(root))}")
    rt.mkdir(mode=0o700, parents=True)
    p = subprocess.Popen([str(exe), "30"])
    try:
        (rt / "llama-server.pid").write_text(f"{p.pid}\n")
        assert stop_services(root) == [p.pid]
        assert p.wait(timeout=10) != 0
    finally:
        p.kill()
        shutil.rmtree(rt)
