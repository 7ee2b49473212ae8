"""`lease take` judges what it asks for before it contacts any host: a TTL out of range (or an
empty purpose) is a config error (exit 3) naming the bound, even when the host is unreachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugins.cli import run_cli


def _inventory(tmp_path: Path) -> Path:
    known = tmp_path / "known_hosts"
    known.write_text("")
    p = tmp_path / "inv.yaml"
    p.write_text(
        f"known_hosts: {known}\n"
        "hosts:\n"
        # TEST-NET-1 on port 1: a host that never answers
        "  far: {address: 192.0.2.1, port: 1, user: ops, install_root: /srv/p, role: native}\n"
    )
    return p


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ttl", "30d", "--purpose", "x"], "between 1 s and 7 days"),
        (["--ttl", "2h", "--purpose", " "], "needs an owner and a purpose"),
    ],
)
def test_a_bad_request_reaches_no_host(tmp_path, args, message):
    r = run_cli(
        ["--home", str(tmp_path / "home"), "--inventory", str(_inventory(tmp_path)), "lease", "take", "far", *args]
    )
    assert r.exit_code == 3, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
