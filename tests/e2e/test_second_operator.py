"""Issue 48 item 5: a second operator follows docs/guides/team-evidence.md's walk-through ("A second
operator, from an empty home") line by line, as written, from an empty home to the first rollback
of the deploy another home made, on the lab pair `lab` with a real evidence remote on lab-native.

The first home (the lab's) runs `receipts init-remote` and deploys the baseline, then the second
revision; the walk-through's lines then run in the second home: `export` sets the environment,
shell lines run in sh, `pairctl` lines in-process, each ending with the exit its comment names
(`# exit N`, else 0). Placeholders: ALICE_HOME the first home, ID the package the previous line
named as missing (the rollback's target). The pair ends on the baseline, deployed by the lab home
and rolled back to by the second.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.config.loader import read_yaml
from orchestrator.evidence.store import EvidenceStore
from tests.plugins.pairs import PAIR, is_active, lab_status
from tests.plugins.readme import GUIDES, walk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

GUIDE = GUIDES / "team-evidence.md"
_MISSING = re.compile(r"package '?([a-z0-9][a-z0-9.-]*-[0-9a-f]{10}-[a-z0-9.-]+)'?[ )]")  # ... not in this home


def test_a_second_home_follows_the_guide_to_its_first_rollback(lab, lab_packages, lab_packages_b, cli, tmp_path,
                                                               monkeypatch):  # fmt: skip
    a_home = lab.home.root
    pid, other = lab_packages.id, lab_packages_b.id
    home = tmp_path / "bob"  # the reader's HOME: `~` of the walk-through
    home.mkdir()
    b_home = home / "pairctl-bob"
    repo = lab.home.lab / "hosts" / "lab-native" / "evidence-second.git"
    subprocess.run(["rm", "-rf", str(repo)], check=True)
    a_id = EvidenceStore(a_home / "evidence").home_id()
    with monkeypatch.context() as m:  # the id his key's line names (made on first use, as the walk-through's home)
        m.setenv("PAIRCTL_OPERATOR", "bob")
        b_id = EvidenceStore(b_home / "evidence").home_id()
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        f'team@pairctl,homes/{a_id},homes/{b_id} namespaces="git" '
        f"{lab.operator_key.with_suffix('.pub').read_text().strip()}\n"
    )
    inv = json.loads(json.dumps(read_yaml(lab.inventory_path)).replace("${PAIRCTL_HOME}", str(a_home)))
    inv["evidence_remote"] = {"url": f"ssh://lab-native{repo}", "allowed_signers": str(signers)}
    inventory = tmp_path / "team.yaml"
    inventory.write_text(json.dumps(inv))

    def a(*args: str):
        r = cli("--json", *args, home=a_home, inventory=str(inventory))
        assert r.exit_code == 0, f"{args}: exit {r.exit_code}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        return r

    a("receipts", "init-remote")
    a("deploy", "--pair", PAIR, "--packages", pid, pid, "--profile", "lab", "--skip-accept")
    deployed = json.loads(a("deploy", "--pair", PAIR, "--packages", other, other, "--profile", "lab",
                            "--skip-accept").stdout)["receipt"]  # fmt: skip

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PAIRCTL_INVENTORY", str(inventory))
    monkeypatch.delenv("PAIRCTL_HOME", raising=False)

    def fill(line: str, said: list[str]) -> str:
        """ALICE_HOME: the first home; ID: the package the last failed line named as missing here."""
        named = [m.group(1) for out in said[-1:] for m in [_MISSING.search(out)] if m]
        return re.sub(r"\bID\b", named[0] if named else "ID", line.replace("ALICE_HOME", str(a_home)))

    def pairctl(words: list[str]) -> tuple[int, str]:
        r = cli(*words, home=Path(os.environ["PAIRCTL_HOME"]))
        return r.exit_code, r.stdout + r.stderr

    said = walk(GUIDE, "second-home", fill, pairctl, monkeypatch.setenv)
    assert b_home.is_dir() and os.environ["PAIRCTL_HOME"] == str(b_home)
    status, refused = said[1], said[2]  # what is missing, and the lines that get it
    assert f"package {other} (current) is not in this home" in status, status[-3000:]
    assert "does not match the manifest" not in status
    assert f"no package '{pid}'" in refused and "pairctl build --rev" in refused, refused[-3000:]
    assert "pairctl packages verify" in status and "pairctl packages verify" in refused
    # the rollback was the second home's, back to the pair the first home's deploy replaced, and
    # the remote holds it: a pull in the first home sees the second's rollback after its deploy
    assert is_active(lab_status(cli), pid)
    rows = json.loads(a("receipts", "list", "--pair", PAIR).stdout)
    mine = [r for r in rows if r["home"] == b_id]
    # the refused first try is sealed too (nothing changed on the hosts), then the rollback that ran
    assert [(r["command"], r["outcome"]) for r in mine] == [("rollback", "failed"), ("rollback", "passed")], mine
    b_store = EvidenceStore(b_home / "evidence")
    assert b_id.startswith("bob-") and {b_store.load(r["hash"]).operator for r in mine} == {"bob"}  # PAIRCTL_OPERATOR
    assert deployed in {r["hash"] for r in rows if r["home"] == a_id}
