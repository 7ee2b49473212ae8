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


def test_a_library_planted_in_the_running_release_is_never_loaded_by_a_restart(deployed_lab, cli):
    """Issue 49 item 5: a library planted in the active release was refused by deploy and named by
    `status --verify-files`, but llama-server's supervisor restarted the crashed server with it on
    LD_LIBRARY_PATH, and plain `status` stayed 0. Now the supervisor re-checks the release against
    its manifest before every start: the kill -9 leaves llama-server down (refused, not loaded),
    plain `status` names the refusal (exit 1), and once the file is gone `restart` brings it back."""
    import signal
    import time

    a = deployed_lab.package_id
    root = Path(deployed_lab.roots()["native"])
    r = cli("restart", "--pair", PAIR)  # supervisors started by this pairctl (sup.files in their arguments)
    assert r.exit_code == 0, r.output
    lib = root / "releases" / a / "lib"
    made_lib = not lib.exists()
    lib.mkdir(exist_ok=True)
    planted = lib / "libgomp.so.1"
    planted.write_bytes(b"\x7fELF not really")
    state = root / "run" / "llama-server.state"
    try:
        os.kill(int((root / "run" / "llama-server.pid").read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while "state=refused" not in state.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "state=refused" in state.read_text(), state.read_text()
        r = cli("--json", "status", "--pair", PAIR)
        assert r.exit_code == 1, r.output
        problems = json.loads(r.stdout)["problems"]
        assert any("refused to start llama-server" in p and "differ from its manifest" in p for p in problems), problems
        r = cli("restart", "--pair", PAIR)  # pairctl's own start refuses it too (the release verify), nothing loaded
        assert r.exit_code == 6 and "lib/libgomp.so.1" in r.stderr, r.output
    finally:
        planted.unlink()
        if made_lib:
            lib.rmdir()
    r = cli("restart", "--pair", PAIR)
    assert r.exit_code == 0, r.output
    assert is_active(lab_status(cli), a)
