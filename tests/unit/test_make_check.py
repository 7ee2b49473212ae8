"""`make check` (issue 45) passes a clean tree and fails on a lint error, an unformatted file, a type
error and a broken unit test; and it leaves `unit_slow` tests to `make test`.

Each case runs the repository's own Makefile target, unchanged, in a small project: this
repository's pyproject.toml (the same ruff rules, strict mypy over `orchestrator`, pytest markers
and options), a one-module `orchestrator` package and one unit test file, with this test session's
venv (`-o VENV/.installed` keeps make from reinstalling it). One defect per case, so the case
shows which step caught it and that the steps after it did not run.

Marked `unit_slow`: it starts make, ruff, mypy and pytest (about 15 s), so `make check` itself
does not run it; `make test` and `make test-unit` do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent  # the venv this session runs in (make's VENV)

pytestmark = [pytest.mark.unit_slow, pytest.mark.timeout(600)]

CLEAN = {
    "orchestrator/__init__.py": '"""A one-module stand-in for the package, checked by the real configuration."""\n',
    "orchestrator/m.py": "def double(x: int) -> int:\n    return 2 * x\n",
    "tests/__init__.py": "",
    "tests/unit/__init__.py": "",
    "tests/unit/test_m.py": (
        "import pytest\n\n\n"
        "def test_double() -> None:\n    assert 2 * 21 == 42\n\n\n"
        "@pytest.mark.unit_slow\n"
        'def test_left_to_make_test() -> None:\n    raise AssertionError("make check must not run a unit_slow test")\n'
    ),
}

DEFECTS = {
    # step that must catch it, file, new text, what its output shows
    "lint": ("orchestrator/m.py", "import os\n\n\ndef double(x: int) -> int:\n    return 2 * x\n", "F401"),
    "format": ("orchestrator/m.py", "def double(x: int) -> int:\n    return 2*x\n", "would be reformatted"),
    "type": ("orchestrator/m.py", "def double(x: int) -> int:\n    return str(2 * x)\n", "Incompatible return value"),
    "unit": ("tests/unit/test_m.py", "def test_double() -> None:\n    assert 2 * 21 == 43\n", "1 failed"),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("make-check")
    shutil.copy(REPO / "Makefile", root / "Makefile")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "setup.py").write_text("")
    for rel, text in CLEAN.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _make_check(root: Path) -> subprocess.CompletedProcess[str]:
    # not the outer run's settings: its pairctl/pytest variables, nor `make test VAR=...` passed down
    drop = ("PAIRCTL_", "PYTEST_", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["MYPY_CACHE_DIR"] = str(root / ".mypy_cache")
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(root), "check", f"VENV={VENV}", "-o", f"{VENV}/.installed"],
        capture_output=True, text=True, timeout=540, env=env, check=False,
    )  # fmt: skip


def test_a_clean_tree_passes_and_unit_slow_is_left_to_make_test(project: Path) -> None:
    r = _make_check(project)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "All checks passed!" in out and "Success: no issues found" in out, out
    assert "1 passed, 1 deselected" in out, out  # the unit_slow test was not run
    durations = project / ".state" / "runs" / "check" / "junit.xml"
    assert durations.is_file(), "the check tier keeps its junit XML under .state/runs/check"


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_make_check_fails_on(project: Path, defect: str) -> None:
    rel, text, shows = DEFECTS[defect]
    path = project / rel
    clean = path.read_text()
    path.write_text(text)
    try:
        r = _make_check(project)
    finally:
        path.write_text(clean)
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"make check passed with a {defect} error:\n{out}"
    assert shows in out, out
    ran_pytest = re.search(r"^=+ .*\b\d+ (passed|failed)\b.* in [\d.]+s", out, re.M) is not None
    if defect == "lint":  # make stops at the first failing step: neither mypy nor pytest ran
        assert "Success: no issues found" not in out and "Incompatible" not in out and not ran_pytest, out
    if defect == "format":  # ruff's rules pass; the layout does not: neither mypy nor pytest ran
        assert "All checks passed!" in out and "Success: no issues found" not in out and not ran_pytest, out
    if defect == "type":
        assert "All checks passed!" in out and not ran_pytest, out
    if defect == "unit":
        assert "All checks passed!" in out and "Success: no issues found" in out, out
