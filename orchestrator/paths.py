"""Where pairctl finds its bundled defaults and keeps its state on the operator's machine.

Bundled defaults ship as package data under `orchestrator/_data/` (pyproject.toml maps `manifests/`,
`playbooks/` and `kernels/` there); in a checkout they are the repo's own folders. State lives under
one home (`PAIRCTL_HOME` or `--home`), so a test or CI run gets a separate world with one variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import platformdirs

REPO_ROOT = Path(__file__).resolve().parent.parent


def bundled(name: str) -> Path:
    """The bundled folder NAME: the wheel's package data, else the checkout's top-level folder (a
    zipped install is not supported: the path then does not exist)."""
    data = files("orchestrator").joinpath("_data", name)
    if data.is_dir():
        return Path(str(data))
    return REPO_ROOT / name


MANIFESTS = bundled("manifests")
PLAYBOOKS = bundled("playbooks")
KERNELS = bundled("kernels")


def default_home() -> Path:
    env = os.environ.get("PAIRCTL_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return Path(platformdirs.user_state_dir("pairctl")).resolve()


@dataclass(frozen=True)
class Home:
    """The layout of pairctl's state directory."""

    root: Path

    @classmethod
    def resolve(cls, root: Path | str | None = None) -> Home:
        return cls(Path(root).expanduser().resolve() if root else default_home())

    @property
    def store(self) -> Path:
        """Immutable packages, one folder per package id."""
        return self.root / "packages"

    @property
    def build_cache(self) -> Path:
        return self.root / "build-cache"

    @property
    def evidence(self) -> Path:
        return self.root / "evidence"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def lab(self) -> Path:
        return self.root / "lab"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    def ensure(self) -> Home:
        for p in (self.root, self.store, self.build_cache, self.evidence, self.logs):
            p.mkdir(parents=True, exist_ok=True)
        return self
