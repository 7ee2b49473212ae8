"""Issue 34, item 1: the hooks example (docs/guides/fleets-and-hooks.md) passes `config check` as written (a bare `on:`,
which YAML 1.1 reads as the boolean true), and a pre-deploy hook vetoes a deploy before any
host is touched (exit 1, its reason named, no receipt, nothing changed). Run through the real
CLI; the hook is a real child process."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from orchestrator.config.inventory import HookSpec
from tests.plugins.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = ROOT / "manifests" / "inventories" / "lab.yaml"


def _readme_hooks_block() -> str:
    text = (ROOT / "docs" / "guides" / "fleets-and-hooks.md").read_text()
    section = text.split("## Hooks", 1)[1]
    m = re.search(r"```yaml\n(hooks:\n.*?)```", section, re.S)
    assert m, "the fleets-and-hooks guide's hooks example is gone"
    return m.group(1)


def _inventory_with(tmp_path: Path, hooks_yaml: str) -> Path:
    inv = tmp_path / "site.yaml"
    inv.write_text(LAB_INVENTORY.read_text() + "\n" + hooks_yaml)
    return inv


def test_the_readme_hooks_example_passes_config_check_as_written(tmp_path):
    block = _readme_hooks_block()
    assert re.search(r"^  - on:", block, re.M), "the example keeps the bare `on:` operators write"
    inv = _inventory_with(tmp_path, block)
    r = run_cli(["--home", str(tmp_path / "home"), "config", "check", str(inv)])
    assert r.exit_code == 0, r.output
    assert "ok" in r.stdout
    quoted = _inventory_with(tmp_path, block.replace("  - on:", '  - "on":'))
    assert run_cli(["--home", str(tmp_path / "home"), "config", "check", str(quoted)]).exit_code == 0


def test_bare_and_quoted_on_mean_the_same_and_both_at_once_is_refused():
    bare = yaml.safe_load("on: [fleet.finished]\nargv: [x]\n")
    assert True in bare  # what PyYAML does with a bare `on`
    assert HookSpec.model_validate(bare).on == ["fleet.finished"]
    both = yaml.safe_load('on: [fleet.finished]\n"on": [deploy.passed]\nargv: [x]\n')
    try:
        HookSpec.model_validate(both)
    except ValueError as exc:
        assert "keep one" in str(exc)
    else:
        raise AssertionError("both keys accepted")


def test_a_failing_pre_deploy_hook_vetoes_the_deploy_before_any_host(tmp_path):
    got = tmp_path / "event.json"
    hook = (
        f"import sys; open({str(got)!r}, 'w').write(sys.stdin.read()); "
        "print('change freeze until monday', file=sys.stderr); sys.exit(3)"
    )
    hooks = "hooks:\n" + f"  - on: [pre-deploy]\n    argv: [{json.dumps(sys.executable)}, -c, {json.dumps(hook)}]\n"
    inv = _inventory_with(tmp_path, hooks)
    home = tmp_path / "home"
    argv = ["--home", str(home), "-i", str(inv), "deploy", "--pair", "lab", "--native", "n1", "--rpc", "r1"]
    r = run_cli(argv)
    assert r.exit_code == 1, r.output
    assert "pre-deploy hook" in r.stderr and "vetoed the deploy" in r.stderr and "exit 3" in r.stderr, r.stderr
    assert "change freeze until monday" in r.stderr and "nothing was changed" in r.stderr
    assert "Traceback" not in r.output
    event = json.loads(got.read_text())
    assert event["event"] == "pre-deploy" and event["pair"] == "lab" and event["packages"] == ["n1", "r1"]
    assert not list((home / "evidence").rglob("*.json")), "a vetoed deploy wrote a receipt"
    logged = [json.loads(line) for line in (home / "logs" / "hooks.jsonl").read_text().splitlines()]
    assert logged[-1]["event"] == "pre-deploy" and logged[-1]["ok"] is False
    # --json: one document, the veto as its error
    r = run_cli([*argv[:4], "--json", *argv[4:]])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["error"]["kind"] == "HookVetoed" and doc["error"]["exit_code"] == 1, doc
    # a dry run runs no hook (it changes nothing)
    got.unlink()
    run_cli([*argv, "--dry-run"])
    assert not got.exists()
