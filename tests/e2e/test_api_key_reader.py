"""Issue 29: one API-key reader for every command.

A key file that starts with a comment line (`# the pair key, rotated 2026-12`) is a file
llama-server and pairctl's documented reader accept. Deploy used to keep its own reading (the
first non-empty line, the comment) as the Bearer value: verify got HTTP 401, its rollback too,
exit 8 and the pair down. Here, on the lab's sshd hosts with a real llama-server: deploy,
accept and rollback of such a pair all pass, and the server enforces the key.
"""

from __future__ import annotations

import json

import httpx
import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.engine.plan import pair_view
from tests.faults.harness import FaultPair, fresh_pair

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHECKS = ("--checks", "identity")


@pytest.fixture(scope="module")
def keyc_pair(request, pairctl_home):
    with fresh_pair(request, pairctl_home, "keyc", (8196, 50196)) as fp:  # no route from an earlier run
        key_file = fp.home.root / "keyc" / "api-key"
        key_file.write_text(f"# the pair key, rotated 2026-12\n{fp.api_key}\n")
        yield fp


def _ok(p, what: str) -> dict:
    assert p.returncode == 0, f"{what}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


def test_comment_first_key_file_deploys_accepts_and_rolls_back(keyc_pair: FaultPair) -> None:
    fp = keyc_pair
    a, b = fp.packages
    assert (
        _ok(fp.cli("--json", "deploy", "--pair", fp.name, "--packages", a, a, *CHECKS), "deploy A")["outcome"]
        == "passed"
    )
    url = pair_view(load_inventory(str(fp.inventory_path)), fp.name).base_url
    with httpx.Client(timeout=10, trust_env=False) as c:
        assert c.get(url + "/props").status_code == 401  # the key is enforced ...
        assert c.get(url + "/props", headers={"Authorization": f"Bearer {fp.api_key}"}).status_code == 200
        # ... and the comment line is not a key
        comment = {"Authorization": "Bearer # the pair key, rotated 2026-12"}
        assert c.get(url + "/props", headers=comment).status_code == 401
    acc = fp.cli("--json", "accept", "--pair", fp.name, *CHECKS)
    assert acc.returncode == 0, acc.stderr[-3000:]
    assert (
        _ok(fp.cli("--json", "deploy", "--pair", fp.name, "--packages", b, b, *CHECKS), "deploy B")["outcome"]
        == "passed"
    )
    rb = _ok(fp.cli("--json", "rollback", "--pair", fp.name), "rollback")
    assert rb["outcome"] == "passed"
    assert (rb["active"]["native_package"], rb["active"]["rpc_package"]) == (a, a)
