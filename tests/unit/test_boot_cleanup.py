"""A test session's boot lines go with it (tests/plugins/lab.py `_boot_lines_removed`): every
deploy of a lab host writes its root's @reboot and watchdog lines into this machine user's
crontab, which other labs and sessions share; `make test` left ~30 per run. The session's
teardown removes every line of a root under its own homes, and only those."""

from __future__ import annotations

import json
import shutil

import pytest

from orchestrator.hosts import boot
from orchestrator.hosts.layout import HostLayout
from orchestrator.remote.local import LocalTransport
from tests.plugins.lab import drop_boot_lines


def test_entries_under_a_folder_go_and_every_other_line_stays():
    mine, sibling = "/t/home/lab/hosts/a/root", "/t/home2/root"
    text = "MAILTO=x\n"
    for root in (mine, sibling, "/t/home/keyc/k-root"):
        text = boot.merge_crontab(text, root, boot.entry(HostLayout(root)))
    kept = boot.drop_entries_under(text, "/t/home/")
    assert kept == boot.merge_crontab("MAILTO=x\n", sibling, boot.entry(HostLayout(sibling)))
    assert boot.drop_entries_under(kept, "/t/home") == kept


@pytest.mark.parametrize("prefix", ["/", "", "//", "/t", "/t/", "t/home"])
def test_a_prefix_of_fewer_than_two_folders_is_refused(prefix):
    """ "/" (or "") is a prefix of every root: it would take every lab's and session's lines."""
    text = boot.merge_crontab("", "/t/home/root", boot.entry(HostLayout("/t/home/root")))
    with pytest.raises(ValueError, match="two levels deep"):
        boot.drop_entries_under(text, prefix)


def test_the_session_teardown_leaves_no_boot_line_for_its_roots(tmp_path_factory):
    """As a pair fixture's deploy writes them (ensure_entry, the real crontab of this user) for
    two roots of a test home, beside one of another home: the teardown's call removes the two."""
    if shutil.which("crontab") is None:
        pytest.skip("no crontab program here")
    home, other = tmp_path_factory.mktemp("test-home"), tmp_path_factory.mktemp("other-home")
    t = LocalTransport("h")
    roots = [home / "lab" / "hosts" / "lab-rpc" / "root-prod", home / "keyc" / "k1-root", other / "root"]
    for r in roots:
        r.mkdir(parents=True)
        got = boot.ensure_entry(t, HostLayout(str(r)))
        if got.get("persistence") != "cron":
            pytest.skip(f"no crontab here: {json.dumps(got)}")
    try:
        drop_boot_lines(home)
        left = boot.read_crontab(t).text or ""
        assert str(home) not in left, left
        assert boot.read_entry(t, HostLayout(str(other / "root"))).get("persistence") == "cron"
    finally:
        for r in roots:
            boot.remove_entry(t, HostLayout(str(r)))
