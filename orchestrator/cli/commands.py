"""Registers every sub-app on the root app. One line per command module."""

from __future__ import annotations

from orchestrator.cli import app
from orchestrator.cli import config_cmd

app.add_typer(config_cmd.app, name="config")
