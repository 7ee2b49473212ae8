"""Session fixture `installed_pairctl`: pairctl as an operator installs it, from the built wheel.

The wheel is built from a copy of the checkout (`pip wheel --no-deps --no-build-isolation`, so
no network and no build files in the checkout) and installed with `pip install --no-deps
--no-index` into a fresh venv. That venv reaches its dependencies through one `.pth` line naming
the test venv's site-packages as a plain path: the packages already installed there (no network,
no wheelhouse of every dependency needed) become importable, while the test venv's editable
install of pairctl is NOT (an editable install is a hook in a `.pth` file, and `.pth` files are
only run in site directories, not in directories a `.pth` line adds). So `orchestrator` can only
come from the wheel, and the fixture checks that it does. (`--system-site-packages` would not
do: it exposes the base interpreter's site-packages, not the test venv's.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_TOP_SKIP = {
    ".git",
    ".venv",
    ".state",
    "build",
    "dist",
    ".pytest_cache",
    ".hypothesis",
    ".whl",
    ".gl",
    ".carry",
    "benchmarks",
    "docs",
    "tests",
}


def _skip(folder: str, names: list[str]) -> set[str]:
    """Build outputs and what the wheel does not need: top-level names only (orchestrator/build
    is code), caches and egg-info anywhere."""
    top = {n for n in names if n in _TOP_SKIP} if Path(folder) == REPO else set()
    return top | {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    pairctl: Path
    python: Path

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The environment of an operator's shell: no PYTHONPATH, no config dir unless given."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PAIRCTL_CONFIG", "PAIRCTL_INVENTORY")}
        env.update(PAIRCTL_HOME=str(home), **extra)
        return env

    def run(
        self, cwd: Path, home: Path, *args: str, timeout: float = 600, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.pairctl), *args],
            cwd=cwd,
            env=self.env(home, **extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _run(*argv: str | Path, cwd: Path | None = None, timeout: float = 300) -> None:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )


@pytest.fixture(scope="session")
def installed_pairctl(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=_skip, symlinks=True)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", base / "dist", src)
    (wheel,) = sorted((base / "dist").glob("pairctl-*.whl"))
    venv = base / "venv"
    _run(sys.executable, "-m", "venv", venv)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "pairctl-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    return Installed(venv=venv, wheel=wheel, pairctl=venv / "bin" / "pairctl", python=py)


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())
