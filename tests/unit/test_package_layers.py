"""Package-level layering (issue 29): no import from a lower layer of orchestrator/ to a higher
one, counting every import a module makes (top level, inside functions, under TYPE_CHECKING).

The layers, lowest first; a package may import its own layer and those below, and no import
points up: none is allowed as an exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"

LAYERS: list[set[str]] = [
    # leaves: no pairctl imports beyond each other
    {
        "__version__",
        "errors",
        "hashing",
        "durations",
        "paths",
        "roles",
        "filelock",
        "terminal",
        "interrupt",
        "progress",
        "faults",  # the test-only fault hook at step boundaries, fired by the engine and by checks
    },
    {"evidence", "log"},  # receipts and logging mask secrets the same way (evidence/masking.py)
    {"config"},  # pydantic models and loaders of the operator's manifests
    {"remote"},  # the Transport contract and its implementations
    {"server", "build", "hosts"},  # llama-server client, packages, what is on a host (identity included)
    {"checks"},  # acceptance checks against a running pair; they are handed what they probe
    {"engine"},  # plans and runs deploy / rollback / repair; its accept step runs the checks
    {"qualify"},  # qualification drives the engine's deploys
    {"ops", "bisect"},  # fleets, schedules, metrics; bisect (builds, deploys and qualifies per step)
    {"lab", "cli", "__main__", "docs"},  # entry points (docs: python -m orchestrator.docs writes docs/reference)
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def package_imports() -> dict[tuple[str, str], set[str]]:
    """(from package, to package) -> the modules (paths under orchestrator/) that import so."""
    out: dict[tuple[str, str], set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        src = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "orchestrator":
                mods = [f"orchestrator.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator."):
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names if a.name.startswith("orchestrator.")]
            else:
                continue
            for m in mods:
                dst = m.split(".")[1]
                if dst != src:
                    out.setdefault((src, dst), set()).add(str(rel))
    return out


def upward(edges: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    return {(a, b): where for (a, b), where in edges.items() if LAYER_OF[a] < LAYER_OF[b]}


def test_every_package_has_a_layer() -> None:
    pkgs = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    pkgs |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    assert pkgs - set(LAYER_OF) == set(), "give each new package or module a layer in LAYERS"


def test_no_import_points_up_a_layer() -> None:
    up = {k: sorted(v) for k, v in upward(package_imports()).items()}
    assert up == {}, f"imports from a lower layer to a higher one: {up}"


def test_the_reading_finds_an_upward_arrow(tmp_path: Path) -> None:
    """The reader sees an import inside a function, which is where a lazy upward import hides."""
    src = "def f():\n    from orchestrator.cli import main\n"
    tree = ast.parse(src)
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert found == ["orchestrator.cli"]
    assert upward({("config", "cli"): {"x.py"}}) == {("config", "cli"): {"x.py"}}
    assert upward({("cli", "config"): {"x.py"}}) == {}
