"""The CLI's own promises, through the real `pairctl` in-process (no lab needed).

Options mean the same in every position; a two-value flag cannot swallow an option; `--json`
prints exactly one document, with an `error` object on failure; reads write no receipt; output
without a TTY keeps whole hashes; commands load lazily (`--help` imports none of them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from orchestrator.cli import app, main
from orchestrator.cli.commands import COMMANDS
from orchestrator.cli.outputs import validate_output
from orchestrator.evidence.store import EvidenceStore

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> tuple[int, str, str]:
    """`pairctl ARGV` in-process: (exit code, stdout, stderr)."""
    runner = CliRunner()
    with runner.isolation() as streams:
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def receipts_in(home: Path) -> list[str]:
    ev = home / "evidence"
    return [] if not ev.exists() else [r["hash"] for r in EvidenceStore(ev).summaries(pair=...)]


def all_commands() -> list[list[str]]:
    """Every runnable command path, e.g. ['deploy'], ['packages', 'list'] (loads every module)."""
    root = typer.main.get_command(app)
    paths = []
    for name in COMMANDS:
        cmd = root.get_command(None, name)  # type: ignore[arg-type]
        subs = getattr(cmd, "commands", None)
        paths.append([name])
        for sub in subs or {}:
            paths.append([name, sub])
    return paths


# --- option positions ---------------------------------------------------------------------


@pytest.mark.parametrize("path", all_commands(), ids=lambda p: " ".join(p))
def test_every_command_takes_the_global_options_and_shows_readable_metavars(path):
    code, out, err = run(*path, "--help")
    assert code == 0, err
    for opt in ("--json", "--inventory", "--home", "--verbose"):
        assert opt in out, (path, opt)
    assert "<" not in out.replace("<home>", "").replace("<name>", ""), out  # no <str>, <list[str]>, <str,str>...


def test_global_options_work_before_and_after_the_subcommand(tmp_path):
    for argv in (
        ["--home", str(tmp_path), "--json", "packages", "list"],
        ["packages", "list", "--json", "--home", str(tmp_path)],
        ["packages", "--json", "list", "--home", str(tmp_path)],
    ):
        code, out, err = run(*argv)
        assert code == 0, (argv, err)
        assert json.loads(out) == [], argv
    assert (tmp_path / "logs" / "pairctl.jsonl").exists()  # --home after the command chose the home


def test_the_last_home_given_wins(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    code, _, err = run("--home", str(first), "packages", "list", "--home", str(second))
    assert code == 0, err
    assert (second / "logs").exists() and not (first / "logs").exists()


def test_inventory_after_the_subcommand_is_used(tmp_path):
    for argv in (
        ["-i", "no-such-inventory", "lab", "status"],
        ["lab", "status", "-i", "no-such-inventory"],
        ["lease", "show", "p1", "--inventory", "no-such-inventory"],
    ):
        code, _, err = run("--home", str(tmp_path), *argv)
        assert code == 3, (argv, err)
        assert "no-such-inventory" in err, (argv, err)


def test_checks_is_the_one_name_and_only_still_parses():
    for argv in (["deploy", "--help"], ["accept", "--help"], ["schedule", "install", "--help"]):
        assert "--checks" in run(*argv)[1], argv
    # issue 34: an option that works is in --help (an operator reads --help, not the source)
    assert "--only" in run("accept", "--help")[1] and "same as --checks" in run("accept", "--help")[1]


def test_an_unknown_check_is_a_usage_error(tmp_path):
    for argv in (["accept", "--pair", "lab", "--checks", "bogus"], ["accept", "--pair", "lab", "--only", "x,identity"],
                 ["deploy", "--pair", "lab", "--native", "a", "--rpc", "b", "--checks", "bogus"]):  # fmt: skip
        code, out, err = run("--home", str(tmp_path), *argv)
        assert code == 2, (argv, code, err)
        assert "unknown check(s)" in err and "identity" in err, err
        code, out, err = run("--home", str(tmp_path), "--json", *argv)
        assert code == 2 and json.loads(out)["error"]["exit_code"] == 2


# --- --packages cannot swallow an option --------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["deploy", "--pair", "lab", "--packages", "nat1", "--dry-run"],
        ["deploy", "--pair", "lab", "--native", "--dry-run", "--rpc", "r1"],
        ["deploy", "--pair", "lab", "--native", "n1", "--rpc", "-x"],
        ["qualify", "--pair", "lab", "--baseline", "a", "--json", "--candidate", "c", "c", "--plan", "lab"],
    ],
    ids=["packages-dry-run", "native-dry-run", "rpc-dash", "qualify-baseline"],
)
def test_an_id_that_looks_like_an_option_is_refused_before_anything_happens(tmp_path, argv):
    code, _, err = run("--home", str(tmp_path), *argv)
    assert code == 2, err
    assert "is not a package id" in err and "--native ID --rpc ID" in err
    assert receipts_in(tmp_path) == []  # nothing ran: no receipt, no host touched


def test_native_and_rpc_are_both_needed_and_exclusive_with_packages(tmp_path):
    code, _, err = run("--home", str(tmp_path), "deploy", "--pair", "lab", "--native", "n1")
    assert code == 2 and "missing --rpc" in err, err
    code, _, err = run("--home", str(tmp_path), "deploy", "--pair", "lab", "--native", "n1", "--packages", "a", "b")
    assert code == 2 and "not both" in err, err


def test_native_and_rpc_reach_the_deploy(tmp_path):
    """The ids arrive in order: the (empty) store names the native one it cannot find."""
    code, out, err = run(
        "--home", str(tmp_path), "--json", "deploy", "--pair", "lab", "--native", "nat-x", "--rpc", "rpc-y", "--dry-run"
    )
    assert code != 2, err
    assert "nat-x" in json.loads(out)["error"]["message"]


# --- JSON always --------------------------------------------------------------------------


def test_json_success_is_one_document_that_matches_its_schema(tmp_path):
    code, out, _ = run("--home", str(tmp_path), "packages", "list", "--json")
    assert code == 0
    validate_output("packages-list", json.loads(out))
    target = str(REPO / "manifests/targets/cpu-lab.yaml")
    code, out, _ = run("--home", str(tmp_path), "config", "check", target, "--json")
    assert code == 0
    validate_output("config-check", json.loads(out))


@pytest.mark.parametrize(
    "argv,exit_code,kind",
    [
        (["packages", "show", "nope"], 2, "BadParameter"),  # an argument naming nothing: a usage error
        (["deploy", "--pair", "lab", "--no-such-option"], 2, "NoSuchOption"),
        (["no-such-command"], 2, "UsageError"),
        (["lab", "status", "-i", "no-such-inventory"], 3, "ConfigError"),
        (["receipts", "show", "0000dead"], 2, "BadParameter"),  # 10 is for receipts that do not verify
        (["packages", "verify", "nope"], 2, "BadParameter"),
        (["qualify", "report", "--receipt", "0000dead"], 2, "BadParameter"),
        (["qualify", "report", "0000dead"], 2, "BadParameter"),  # positional, as `receipts show HASH`
        (["qualify", "report"], 2, "UsageError"),
    ],
)
def test_json_failure_is_one_document_with_an_error_object(tmp_path, argv, exit_code, kind):
    code, out, err = run("--home", str(tmp_path), *argv, "--json")
    assert code == exit_code, err
    doc = json.loads(out)  # exactly one document: json.loads refuses trailing data
    validate_output("error", doc)
    assert doc["error"]["exit_code"] == exit_code and doc["error"]["kind"] == kind, doc
    assert doc["error"]["message"] and doc["error"]["meaning"]


def test_a_failing_command_keeps_its_own_document_and_adds_the_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nno_such_field: 1\n")
    code, out, _ = run("--home", str(tmp_path), "--json", "config", "check", "--kind", "target", str(bad))
    assert code == 3
    doc = json.loads(out)
    assert doc["error"]["exit_code"] == 3
    assert doc["result"][0]["ok"] is False  # a list output is kept under `result`


def test_help_with_json_prints_help_only():
    code, out, _ = run("--json", "deploy", "--help")
    assert code == 0 and out.startswith("Usage: pairctl deploy")


def test_config_schema_publishes_every_output():
    code, out, _ = run("--json", "config", "schema", "output")
    assert code == 0
    schemas = json.loads(out)
    assert {"error", "deploy", "status", "packages-list", "receipts-list"} <= set(schemas)
    assert "receipt" in json.dumps(schemas["error"])


# --- reads are not receipts ---------------------------------------------------------------


def test_reads_write_no_receipt(tmp_path):
    home = str(tmp_path)
    store = EvidenceStore(tmp_path / "evidence")
    with store.begin("lease take", argv=["x"], pair=None) as j:
        sha = j.finish("passed", "seed")
    before = receipts_in(tmp_path)
    for argv in (
        ["receipts", "list"],
        ["receipts", "show", sha[:12]],
        ["packages", "list"],
        ["config", "check", str(REPO / "manifests/targets/cpu-lab.yaml")],
        ["config", "schema", "target"],
        ["doctor", "--no-inventory"],
        ["receipts", "verify"],
    ):
        run("--home", home, *argv)
        run("--home", home, "--json", *argv)
    assert receipts_in(tmp_path) == before


# --- output without a TTY -----------------------------------------------------------------


def test_receipts_list_without_a_tty_keeps_whole_hashes_and_the_first_line_of_reasons(tmp_path):
    store = EvidenceStore(tmp_path / "evidence")
    with store.begin("lease take", argv=["x"], pair=None) as j:
        sha = j.finish("failed", "llama-server did not start\n" + "\n".join(f"log line {i}" for i in range(30)))
    code, out, err = run("--home", str(tmp_path), "receipts", "list")
    assert code == 0, err
    assert sha in out  # 64 hex digits, not `lab-9d3…`
    assert "llama-server did not start" in out and "log line 5" not in out
    code, out, _ = run("--home", str(tmp_path), "receipts", "show", sha)
    assert "log line 29" in out  # the whole reason stays in `receipts show`


# --- lazy commands ------------------------------------------------------------------------


def _modules_after(*argv: str) -> set[str]:
    code = (
        "import sys\nfrom orchestrator.cli import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit:\n    pass\nprint('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=REPO, timeout=60)
    return set(p.stderr.split())


def test_root_help_and_version_import_no_command_module():
    for argv in (["--help"], ["--version"]):
        mods = _modules_after(*argv)
        assert not [m for m in mods if m.endswith("_cmd")], argv
        assert not {"paramiko", "httpx", "numpy", "matplotlib", "structlog", "pydantic"} & mods, argv


def test_command_help_loads_only_that_command_and_no_heavy_dependency():
    mods = _modules_after("deploy", "--help")
    assert "orchestrator.cli.deploy_cmd" in mods
    assert not [m for m in mods if m.endswith("_cmd") and m != "orchestrator.cli.deploy_cmd"]
    assert not {"paramiko", "httpx", "numpy", "matplotlib"} & mods


def test_every_registered_command_loads_under_its_name():
    root = typer.main.get_command(app)
    for name in COMMANDS:
        assert root.get_command(None, name).name == name  # type: ignore[arg-type,union-attr]


def test_root_help_lists_exit_codes_as_one_table():
    code, out, _ = run("--help")
    assert code == 0
    block = out.split("Exit codes:")[1].split("\n\n")[0].splitlines()
    codes = [ln.split()[0] for ln in block if ln.strip()]
    assert codes == [str(c) for c in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 130)]


# --- commands reach their work (no lab: hosts on a closed port) ---------------------------


def _unreachable_inventory(tmp_path: Path) -> Path:
    import yaml

    key = tmp_path / "op"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    hosts = {
        name: {
            "address": "127.0.0.1",
            "port": 1,
            "user": "root",
            "key": str(key),
            "install_root": "/srv/p",
            "role": role,
        }
        for name, role in (("n", "native"), ("r", "rpc"))
    }
    p = tmp_path / "inv.yaml"
    p.write_text(
        yaml.safe_dump(
            {"known_hosts": str(tmp_path / "kh"), "hosts": hosts, "pairs": {"p": {"native": "n", "rpc": "r"}}}
        )
    )
    return p


@pytest.mark.parametrize(
    "argv",
    [
        ["accept", "--pair", "p", "--checks", "identity"],
        ["accept", "--pair", "p", "--only", "identity"],
        ["status", "--pair", "p"],
        ["status", "--all"],
        ["lease", "show", "p"],
        ["logs", "--pair", "p", "-n", "3"],
        ["diff", "--pair", "p"],
        ["restart", "--pair", "p", "--dry-run"],
        ["stop", "--pair", "p"],
        ["start", "--pair", "p"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_commands_parse_their_options_and_fail_as_documented(tmp_path, argv, monkeypatch):
    """Each gets past its option handling to the hosts and fails cleanly: a documented exit code
    and an error document, never an internal error."""
    inv = _unreachable_inventory(tmp_path)
    # The connect is retried as always (RetryPolicy: four attempts per host); its backoff waits go
    # through tenacity's sleep hook and are recorded, not slept: 1.4-2.9 s a case (issue 45).
    import tenacity.nap

    waits: list[float] = []
    monkeypatch.setattr(tenacity.nap, "time", types.SimpleNamespace(sleep=waits.append))
    code, out, err = run("--home", str(tmp_path), *argv, "-i", str(inv), "--json")
    assert waits, "the connect to an unreachable host was retried with backoff"
    assert "internal error" not in err, err
    doc = json.loads(out)
    assert code in (1, 3, 4), (code, err)
    if "error" in doc:
        assert doc["error"]["exit_code"] == code and doc["error"]["kind"] != "InternalError", doc
