"""Where pairctl keeps its state on the operator's machine.

Everything lives under one home so a test, a CI run or an operator can point pairctl at a
separate world with one variable (`PAIRCTL_HOME`) or `--home`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = REPO_ROOT / "manifests"
PLAYBOOKS = REPO_ROOT / "playbooks"
KERNELS = REPO_ROOT / "kernels"


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
    def resolve(cls, root: Path | str | None = None) -> "Home":
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

    def ensure(self) -> "Home":
        for p in (self.root, self.store, self.build_cache, self.evidence, self.logs):
            p.mkdir(parents=True, exist_ok=True)
        return self
