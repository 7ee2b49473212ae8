"""The README's "What a job looks like" block names only commands and options that exist (issue 34:
the README's examples are checked): every `pairctl CMD --flag` line, alternatives (`a|b`) included,
against the options of CMD and its subcommands, the global ones too."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from orchestrator.cli import app

ROOT = Path(__file__).resolve().parents[2]
GLOBAL = {"--json", "--inventory", "-i", "--home", "--config", "-v", "--verbose", "--help"}


def _options(cmd) -> set[str]:
    out = {o for p in getattr(cmd, "params", []) for o in (*p.opts, *p.secondary_opts)}
    for sub in (getattr(cmd, "commands", None) or {}).values():
        out |= _options(sub)
    return out


def _job_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## What a job looks like", 1)[1].split("```", 2)[1]
    return [line.split("#", 1)[0] for line in block.splitlines() if line.startswith("pairctl ")]


def test_every_job_line_names_real_commands_and_options():
    root = typer.main.get_command(app)
    lines = _job_lines()
    assert any(line.startswith("pairctl logs") for line in lines)  # the block is the one meant
    for line in lines:
        words = line.split()
        for name in words[1].split("|"):
            cmd = root.get_command(None, name)  # type: ignore[arg-type]
            assert cmd is not None, (line, name)
            known = _options(cmd) | GLOBAL
            flags = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", " ".join(words[2:])))
            assert flags <= known, (line, name, sorted(flags - known))


def test_readme_notation_expands_into_the_commands_it_stands_for():
    """tests/plugins/readme.py, which tests/e2e/test_readme_examples.py runs the README with."""
    from tests.plugins.readme import expand

    def ex(line: str) -> list[str]:
        return [" ".join(a) for a in expand(line)]

    assert ex("pairctl rollback --pair lab --dry-run | --to RELEASE") == [
        "rollback --pair lab --dry-run",
        "rollback --pair lab --to RELEASE",
    ]
    assert ex("pairctl status --pair lab | --all [--parallel N] [--watch S [--count N]]") == [
        "status --pair lab",
        "status --all --parallel N --watch S --count N",
        "status --all",
    ]
    assert ex("pairctl restart|stop --pair lab [--dry-run]") == [
        "restart --pair lab --dry-run",
        "restart --pair lab",
        "stop --pair lab --dry-run",
        "stop --pair lab",
    ]
    assert ex("pairctl logs --pair lab [--host native|rpc]") == [
        "logs --pair lab --host native",
        "logs --pair lab",
        "logs --pair lab --host rpc",
    ]
    assert ex("pairctl receipts list [--pair P] | show HASH | verify") == [
        "receipts list --pair P",
        "receipts list",
        "receipts show HASH",
        "receipts verify",
    ]


def test_every_readme_example_line_is_found():
    from tests.plugins.readme import README, example_lines

    lines = [line for _, line in example_lines(README.read_text())]
    assert any(line.startswith("pairctl bisect") for line in lines)  # indented blocks
    assert any(line.startswith("pairctl receipts init-remote") for line in lines)  # the team block
    assert any(line.startswith("pairctl restart|stop|start") for line in lines)  # the job block
