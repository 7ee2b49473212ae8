"""Pushing 1,000 receipts to the team's evidence remote and pulling them into an empty home
(issue 35). Target: each a few seconds (TARGET_S).

The remote is a real bare repository on the lab host lab-native, reached over the lab's sshd
with pairctl's strict host-key settings (`pairctl lab up` first). Home: PAIRCTL_HOME (else the
test session's .state/test); inventory: PAIRCTL_BENCH_INVENTORY, else PAIRCTL_INVENTORY, else
`lab`. Timed: `team.push` (hash 1,000 files into the mirror, one signed commit, git push over
SSH) and `team.pull` into an empty home (fetch, then 1,000 receipts written from one
`git cat-file --batch`), then verifying the pulled copy (every receipt rehashed, the chain
walked) and the commit signatures. Writing the receipts is reported, not targeted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

N = int(os.environ.get("PAIRCTL_BENCH_RECEIPTS", "1000"))
TARGET_S = 10.0
REPO = Path(__file__).resolve().parents[1]


def run() -> dict[str, Any]:
    from orchestrator.config.evidence_remote import EvidenceRemote, resolve_remote
    from orchestrator.config.inventory import load_inventory
    from orchestrator.evidence import team
    from orchestrator.evidence.store import EvidenceStore
    from orchestrator.paths import Home

    home = Home.resolve(os.environ.get("PAIRCTL_HOME") or REPO / ".state" / "test")
    ref = os.environ.get("PAIRCTL_BENCH_INVENTORY") or os.environ.get("PAIRCTL_INVENTORY") or "lab"
    inv = load_inventory(ref, {"PAIRCTL_HOME": str(home.root)})
    repo = Path(inv.hosts["lab-native"].install_root).parent / "bench-evidence.git"
    shutil.rmtree(repo, ignore_errors=True)
    inv = inv.model_copy(update={"evidence_remote": EvidenceRemote(url=f"ssh://lab-native{repo}")})
    access = resolve_remote(inv)
    assert access is not None
    team.init_remote(access)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pairctl-bench-remote-") as tmp:
        writer, reader = EvidenceStore(Path(tmp) / "a"), EvidenceStore(Path(tmp) / "c")
        t0 = time.perf_counter()
        for i in range(N):
            j = writer.begin("deploy", ["deploy", "--pair", "bench"], pair="bench", inputs={"i": str(i)})
            with j.step("route") as s:
                s.data["revision"] = i + 1
            j.finish("passed", f"benchmark receipt {i}")
        t1 = time.perf_counter()
        pushed = team.push(writer, access, "bench")
        t2 = time.perf_counter()
        pulled = team.pull(reader, access)
        t3 = time.perf_counter()
        copy = reader.team_store(writer.home_id())
        assert copy is not None
        rep = copy.verify()
        t4 = time.perf_counter()
        signers = Path(tmp) / "allowed_signers"
        pub = Path(f"{access.signing_key}.pub").read_text().strip()
        signers.write_text(f'bench namespaces="git" {pub}\n')
        sig = team.signature_problems(reader, writer.home_id(), str(signers))
        t5 = time.perf_counter()
        ok = pushed.added == N and pulled.homes.get(writer.home_id()) == N and rep.ok and rep.receipts == N and not sig
    shutil.rmtree(repo, ignore_errors=True)
    push_s, pull_s = t2 - t1, t3 - t2
    passed = ok and push_s < TARGET_S and pull_s < TARGET_S
    return {
        "receipts": N,
        "write_s": round(t1 - t0, 3),
        "push_s": round(push_s, 3),
        "pull_s": round(pull_s, 3),
        "verify_copy_s": round(t4 - t3, 3),
        "verify_signatures_s": round(t5 - t4, 3),
        "target_s": TARGET_S,
        "all_pulled_and_verified": ok,
        "added": pushed.added,
        "pulled": pulled.homes,
        "copy_receipts": rep.receipts,
        "copy_problems": [p.message for p in rep.problems][:3],
        "signature_problems": sig[:3],
        "passed": passed,
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "line": f"evidence_remote: push {N} receipts {push_s:.2f} s, pull into an empty home {pull_s:.2f} s "
        f"(verify copy {t4 - t3:.2f} s, signatures {t5 - t4:.2f} s; target < {TARGET_S:.0f} s each): "
        + ("ok" if passed else "FAILED"),
    }
