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
