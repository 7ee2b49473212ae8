"""What every command gets: the state home, the inventory, output mode, a bound logger.

Built once in the app callback and passed down (httpie's Environment idea), so tests drive
the real CLI with their own home and inventory.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from orchestrator.config import search
from orchestrator.config.inventory import Inventory, load_inventory
from orchestrator.errors import ConfigError
from orchestrator.paths import Home


@dataclass
class Ctx:
    home: Home
    inventory_ref: str
    json_output: bool = False
    verbosity: int = 0
    console: Console = field(default_factory=lambda: Console(stderr=False, highlight=False, soft_wrap=True))
    _inventory: Inventory | None = None
    config_dir: Path | None = None  # --config / PAIRCTL_CONFIG: the first layer of the config search path

    @property
    def variables(self) -> dict[str, str]:
        return {"PAIRCTL_HOME": str(self.home.root)}

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.inventory_ref, self.variables)
        return self._inventory

    def emit_json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()


def get_ctx(ctx: typer.Context) -> Ctx:
    obj = ctx.find_root().obj
    assert isinstance(obj, Ctx), "pairctl's app callback did not run"
    return obj


def set_config_dir(config: Path | None) -> Path | None:
    """`--config DIR` into PAIRCTL_CONFIG, which every loader (and child process) reads through
    orchestrator.config.search; a directory that does not exist is refused here, once."""
    if config is None:
        return None
    d = config.expanduser().resolve()
    if not d.is_dir():
        raise ConfigError(f"--config {config}: no such directory", hint="create one with `pairctl init DIR`")
    os.environ[search.CONFIG_ENV] = str(d)
    return d


def resolve_path(p: str | Path) -> Path:
    return Path(p).expanduser().resolve()
