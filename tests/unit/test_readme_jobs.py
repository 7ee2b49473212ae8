"""Every example line of README.md and the guides (docs/guides/*.md) names only commands and options
that exist: every `pairctl CMD --flag` line, alternatives (`a|b`) included, against the options of
CMD and its subcommands, the global ones too. tests/e2e/test_readme_examples.py runs them."""

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
    from tests.plugins.readme import documents, example_lines

    return [line for doc in documents() for _, line in example_lines(doc.read_text())]


def test_every_job_line_names_real_commands_and_options():
    root = typer.main.get_command(app)
    lines = _job_lines()
    assert any(line.startswith("pairctl logs") for line in lines)  # the guides are read too
    for line in lines:
        words = line.split()
        if words[1].startswith("-"):  # `pairctl --version`, `pairctl --help`
            assert words[1] in {"--version", "--help"}, line
            continue
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
    from tests.plugins.readme import README, documents, example_lines, example_lines_in_context

    lines = [line for doc in documents() for _, line in example_lines(doc.read_text())]
    assert any(line.startswith("pairctl bisect") for line in lines)  # indented blocks
    assert any(line.startswith("pairctl receipts init-remote") for line in lines)  # the team block
    assert any(line.startswith("pairctl restart|stop|start") for line in lines)  # the rollback guide
    # the README's tour: the ten commands of an operator's day, set-up in its own config repo
    tour = example_lines_in_context(README.read_text())
    words = {line.split()[1] for _, line, _ in tour}
    assert {"init", "config", "build", "deploy", "status", "accept", "qualify", "rollback", "receipts"} <= words
    assert any("--rev" in line and "--all" in line for _, line, _ in tour)  # the fleet
    assert [c for _, line, c in tour if line.startswith(("pairctl init", "pairctl config"))] == ["config-repo"] * 2


def test_every_guide_is_read_and_the_readme_is_short():
    from tests.plugins.readme import GUIDES, README, documents

    names = {p.name for p in documents()[1:]}
    want = {"first-deploy.md", "rollback-and-repair.md", "acceptance.md", "qualification.md", "fleets-and-hooks.md"}
    want |= {"bisect.md", "team-evidence.md", "monitoring.md", "upgrading.md", "gpu.md"}
    assert want <= names, sorted(want - names)
    assert all((GUIDES / n).is_file() for n in names)
    assert len(README.read_text().splitlines()) <= 200


def test_examples_contexts_follow_their_markers():
    from tests.plugins.readme import example_lines_in_context

    text = "\n".join(
        [
            "<!-- examples: config-repo -->",
            "```",
            "pairctl init ~/ops/pairctl  # a comment",
            "```",
            "```sh",
            "$ pairctl status --pair lab",
            "```",
            "<!-- examples: config-repo -->",
            "",
            "    pairctl config check",
            "",
            "    pairctl config show",
            "text",
            "",
            "    pairctl lease show --pair lab",
            "```yaml",
            "pairctl not-an-example",
            "```",
        ]
    )
    assert example_lines_in_context(text) == [
        (3, "pairctl init ~/ops/pairctl", "config-repo"),
        (6, "pairctl status --pair lab", "lab"),
        (10, "pairctl config check", "config-repo"),
        (12, "pairctl config show", "config-repo"),
        (15, "pairctl lease show --pair lab", "lab"),
    ]
