"""Issue 34 item 7 (and the refusals of items 8 and 10) on one lab pair with a real llama-server
and ggml-rpc-server (pair `verbs`: its own install roots and ports on the lab's sshd hosts),
run as an operator runs them:

- a never-deployed pair: `accept`, `restart` and `diff` refuse in one line, exit 6, nothing changes;
- `diff`: what runs against what the profile asks (exit 0 / 1, a unified diff of flags);
- `restart` and `stop`/`start`: their `--dry-run` commands are the commands the run records in
  its receipt, byte for byte; the pair comes back under new pids, the route record unchanged;
  `start` of a running pair starts nothing;
- `logs`: the last lines of both services, `-f` prints what a request appends and ends at `--for`;
- `status --watch --count`: bounded looks; `status` and `logs` with the RPC host's sshd down show
  what the native host says, name the unreachable host and exit 4.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
import pytest

from orchestrator.cli.outputs import validate_output
from orchestrator.config.inventory import load_inventory
from orchestrator.engine.plan import pair_view
from orchestrator.evidence.store import EvidenceStore
from tests.faults.harness import FaultPair, fresh_pair, service_pid_of
from tests.plugins.tty import run_in_pty

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NAME = "verbs"
PORTS = (8198, 50198)
PLANNED = ("stop", "restart-rpc", "start-server")


@pytest.fixture(scope="module")
def verbs(request, pairctl_home):
    with fresh_pair(request, pairctl_home, NAME, PORTS) as fp:  # no route from an earlier run
        yield fp


def _json(p: Any, what: str, code: int = 0) -> dict[str, Any]:
    assert p.returncode == code, f"{what}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


def _planned(plan: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    return {(s["name"], h): a for s in plan if s["action"] in PLANNED for h, a in s["argv"].items()}


def _ran(fp: FaultPair, receipt: str) -> dict[tuple[str, str], list[str]]:
    out = {}
    for s in EvidenceStore(fp.home.evidence).load(receipt).steps:
        for host, d in (s.data or {}).items():
            if host != "planned" and isinstance(d, dict) and "argv" in d and s.data.get("action") in PLANNED:
                out[(s.name, host)] = d["argv"]
    return out


def _dry_equals_run(fp: FaultPair, verb: str) -> dict[str, Any]:
    dry = _json(fp.cli("--json", verb, "--pair", NAME, "--dry-run"), f"{verb} --dry-run")
    assert dry["outcome"] == "dry-run"
    out = _json(fp.cli("--json", verb, "--pair", NAME), verb)
    validate_output(verb, out)
    want, got = _planned(dry["plan"]), _ran(fp, out["receipt"])
    assert want and got == want, (want, got)
    # every step, not only the commands: the receipt records each step it ran as the dry run printed it
    ran = [s.data["planned"] for s in EvidenceStore(fp.home.evidence).load(out["receipt"]).steps if "planned" in s.data]
    assert json.dumps(ran, sort_keys=True) == json.dumps(dry["plan"], sort_keys=True), (dry["plan"], ran)
    return out


def _pids(fp: FaultPair) -> dict[str, int | None]:
    return {r: service_pid_of(fp, r) for r in ("native", "rpc")}


def test_a_never_deployed_pair_is_refused_in_one_line(verbs: FaultPair) -> None:
    fp = verbs
    for args in (("accept",), ("restart",), ("diff",)):
        p = fp.cli(*args, "--pair", NAME)
        assert p.returncode == 6, (args, p.returncode, p.stderr)
        said = [line for line in p.stderr.splitlines() if not re.match(r"pairctl: \[\d", line)]  # not progress
        assert "never deployed" in said[0] and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (fp.roots["native"] / "run" / "route.json").exists()


def test_verbs_on_a_deployed_pair(verbs: FaultPair) -> None:
    fp = verbs
    a, _b = fp.packages
    _json(fp.cli("--json", "deploy", "--pair", NAME, "--packages", a, a, "--skip-accept"), "deploy")
    route_before = (fp.roots["native"] / "run" / "route.json").read_bytes()

    # diff: nothing differs from the profile it was deployed with; another profile shows its flags
    same = validate_output("diff", _json(fp.cli("--json", "diff", "--pair", NAME), "diff")).model_dump()
    assert same["same"] and all(h["diff"] == [] for h in same["hosts"].values()), same
    other = fp.cli("diff", "--pair", NAME, "--profile", "lab-draft-other")
    assert other.returncode == 1, other.stderr
    assert any(line.startswith("+--") or line.startswith("+-") for line in other.stdout.splitlines()), other.stdout
    assert f"--- {NAME}-native: running from {a}" in other.stdout, other.stdout

    # restart: the dry run's commands are the run's; new pids, the same record
    pids = _pids(fp)
    out = _dry_equals_run(fp, "restart")
    assert out["active"]["native_package"] == a
    new = _pids(fp)
    assert None not in new.values() and all(new[r] != pids[r] for r in new), (pids, new)
    assert (fp.roots["native"] / "run" / "route.json").read_bytes() == route_before
    code, st = fp.status()
    assert code == 0 and not st["problems"], st["problems"]

    # logs: both hosts' last lines; -f prints what a request appends, and stops at --for
    logs = _json(fp.cli("--json", "logs", "--pair", NAME, "-n", "5"), "logs")
    validate_output("logs", logs)
    assert [g["host"] for g in logs["logs"]] == [f"{NAME}-native", f"{NAME}-rpc"]
    assert all(g["lines"] and len(g["lines"]) <= 5 and g["error"] is None for g in logs["logs"]), logs
    inv = load_inventory(str(fp.inventory_path), {"PAIRCTL_HOME": str(fp.home.root)})
    url = pair_view(inv, NAME).base_url + "/completion"

    def ask() -> None:
        time.sleep(1.0)
        httpx.post(
            url,
            json={"prompt": "hello", "n_predict": 4},
            headers={"Authorization": f"Bearer {fp.api_key}"},
            timeout=30,
        )

    th = threading.Thread(target=ask)
    t0 = time.monotonic()
    th.start()
    follow = fp.cli("logs", "--pair", NAME, "--host", "native", "-n", "0", "-f", "--for", "4")
    th.join()
    took = time.monotonic() - t0
    assert follow.returncode == 0, follow.stderr
    appended = [line for line in follow.stdout.splitlines() if line.startswith(f"{NAME}-native | ")]
    assert appended, follow.stdout  # the request's lines, as they were written
    assert 3.5 < took < 30, took

    # stop, then start: the same commands as their dry runs; a running pair is not started twice
    stopped = _dry_equals_run(fp, "stop")
    assert stopped["outcome"] == "passed" and _pids(fp) == {"native": None, "rpc": None}
    code, st = fp.status()
    assert code == 1 and not any(h["running"] for h in st["hosts"].values()), st
    # the host is untrusted: a log that is a link (here to /dev/zero) is refused, never read
    out_file = fp.roots["native"] / "run" / "llama-server.out"
    aside = out_file.with_name("llama-server.out.aside")
    out_file.rename(aside)
    out_file.symlink_to("/dev/zero")
    try:
        bad = fp.cli("logs", "--pair", NAME, "--host", "native")
        assert bad.returncode == 6 and "not a regular file" in bad.stderr, (bad.returncode, bad.stderr)
    finally:
        out_file.unlink()
        aside.rename(out_file)
    _dry_equals_run(fp, "start")
    assert None not in _pids(fp).values()
    again = _json(fp.cli("--json", "start", "--pair", NAME), "start of a running pair")
    assert again["outcome"] == "nothing to start"
    assert (fp.roots["native"] / "run" / "route.json").read_bytes() == route_before

    # status --watch: bounded looks, each a whole status
    watch = fp.cli("status", "--pair", NAME, "--watch", "0.2", "--count", "2")
    assert watch.returncode == 0, watch.stderr
    assert watch.stdout.count("look ") == 2 and watch.stdout.count(f"pair {NAME}") == 2, watch.stdout
    # on a terminal each look is drawn on a cleared screen: the last one alone is left
    code, raw = run_in_pty(
        fp.argv("status", "--pair", NAME, "--watch", "0.2", "--count", "2"), env=fp.env(), timeout_s=120
    )
    text = raw.decode("utf-8", "replace")
    assert code == 0 and text.count("\x1b[2J") == 2, text[-2000:]
    last = text.rsplit("\x1b[2J", 1)[1]
    assert "look 2/2" in last and "look 1/2" not in last and last.count(f"pair {NAME}") == 1, last


def test_status_and_logs_with_one_host_down(verbs: FaultPair) -> None:
    fp = verbs
    if fp.status()[1]["route"] is None:  # run alone (-k): deploy the pair the test above leaves
        _json(fp.cli("--json", "deploy", "--pair", NAME, "--packages", *fp.packages[:1] * 2, "--skip-accept"), "deploy")
    sshd = fp.sshd("rpc")
    sshd.down()
    try:
        p = fp.cli("--json", "status", "--pair", NAME)
        doc = _json(p, "status with the rpc host down", code=4)
        validate_output("status", doc)
        native, rpc = doc["hosts"][f"{NAME}-native"], doc["hosts"][f"{NAME}-rpc"]
        assert native["reachable"] and native["running"] and native["current"] == fp.packages[0], native
        assert rpc["reachable"] is False and rpc["error"], rpc
        assert list(doc["unreachable"]) == [f"{NAME}-rpc"] and doc["error"]["exit_code"] == 4
        assert doc["route"]["read_from"] == f"{NAME}-native" and doc["route"]["active_packages"][0] == fp.packages[0]
        text = fp.cli("status", "--pair", NAME)
        assert text.returncode == 4 and "UNREACHABLE" in text.stdout and f"{NAME}-rpc" in text.stderr, text
        errors = [line for line in text.stderr.splitlines() if line.startswith("pairctl: error:")]
        assert len(errors) == 1 and f"{NAME}-rpc not reachable" in errors[0], text.stderr  # one line naming it
        lg = fp.cli("logs", "--pair", NAME, "-n", "3")
        assert lg.returncode == 4 and f"{NAME}-native | " in lg.stdout and f"{NAME}-rpc" in lg.stderr, lg
    finally:
        sshd.up(fp.operator_pub())
    assert fp.status()[0] == 0
