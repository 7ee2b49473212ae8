"""Host files trusted by owner or by name (issue 32, items 3 and 4), end to end on the lab pair
`lab` over real sshd: a planted library in the active release, and a helper someone else owns.
Each case is planted on the host as the attacker left it and removed afterwards; the baseline
stays active and verified."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.plugins.pairs import is_active, lab_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PAIR = "lab"
NOBODY = 65534


def test_a_library_added_to_the_active_release_fails_every_verify(deployed_lab, cli):
    """A planted lib/libgomp.so.1 passed `status --verify-files` ("all 6 files match") and the
    verify of a redeploy, and was loaded first. Now both name it and the redeploy stops nothing."""
    a = deployed_lab.package_id
    root = Path(deployed_lab.roots()["native"])
    lib = root / "releases" / a / "lib"
    made_lib = not lib.exists()
    lib.mkdir(exist_ok=True)
    planted = lib / "libgomp.so.1"
    planted.write_bytes(b"\x7fELF not really")
    try:
        r = cli("--json", "status", "--pair", PAIR, "--verify-files")
        assert r.exit_code == 1, r.output
        problems = json.loads(r.stdout)["problems"]
        assert any("lib/libgomp.so.1: not in the manifest" in p and "lab-native" in p for p in problems), problems
        before = lab_status(cli)["hosts"]
        r = cli("deploy", "--pair", PAIR, "--packages", a, a, "--skip-accept")
        assert r.exit_code == 6 and "lib/libgomp.so.1: not in the manifest" in r.stderr, (r.exit_code, r.stderr)
        after = lab_status(cli)["hosts"]
        assert {h: v["running"] for h, v in after.items()} == {h: v["running"] for h, v in before.items()}
    finally:
        planted.unlink()
        if made_lib:
            lib.rmdir()
    assert is_active(lab_status(cli), a)


def test_a_helper_owned_by_another_user_is_never_run(deployed_lab, cli):
    """As `nobody`, replacing bin/pairctl-svc made `status` (a read) run it as root. Now a helper,
    or a folder on the way to it, that another user owns or can write refuses status and deploy
    (exit 6, host and path named) before the helper runs."""
    a = deployed_lab.package_id
    root = Path(deployed_lab.roots()["native"])
    svc = root / "bin" / "pairctl-svc"
    marker = root / "run" / "pwned"
    original = svc.read_bytes()
    evil = original.replace(b"#!/bin/sh\n", f"#!/bin/sh\ntouch {marker}\n".encode(), 1)
    assert evil != original
    cases = [("owner", lambda: os.chown(svc, NOBODY, NOBODY)), ("mode", lambda: os.chmod(svc.parent, 0o777))]
    try:
        for what, plant in cases:
            svc.write_bytes(evil)
            plant()
            for args in (("status", "--pair", PAIR), ("deploy", "--pair", PAIR, "--packages", a, a, "--skip-accept")):
                r = cli(*args)
                assert r.exit_code == 6, (what, args, r.exit_code, r.output)
                assert "refusing install root" in r.stderr and "lab-native" in r.stderr, r.stderr
                assert not marker.exists(), f"{what}: the planted helper ran"
            os.chown(svc, 0, 0)
            os.chmod(svc.parent, 0o755)
    finally:
        svc.write_bytes(original)
        os.chown(svc, 0, 0)
        os.chmod(svc, 0o755)
        os.chmod(svc.parent, 0o755)
        marker.unlink(missing_ok=True)
    assert is_active(lab_status(cli), a)
