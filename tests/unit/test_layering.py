"""The folders' layering holds: no import cycle inside a package (a module that needs another
package's module gets it passed in, or the two share a third), counting every import a module
makes, also inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"


def _imports(path: Path, package: str) -> set[str]:
    """Modules of `package` that the module at `path` imports anywhere in its body."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {
            n.rsplit(".", 1)[-1]
            for n in names
            if n.startswith(package + ".") and n.count(".") == package.count(".") + 1
        }
    return out


def import_cycles(folder: Path) -> list[list[str]]:
    """Cycles among the modules of one package folder (names without the package prefix)."""
    package = "orchestrator." + folder.name
    graph = {p.stem: _imports(p, package) - {p.stem} for p in folder.glob("*.py") if p.stem != "__init__"}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return cycles


def test_cycle_detector_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "a.py").write_text("from orchestrator.demo.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from orchestrator.demo import a\n")
    (pkg / "c.py").write_text("from orchestrator.demo.a import y\n")
    assert import_cycles(pkg) == [["a", "b", "a"]]


@pytest.mark.parametrize("folder", ["remote", "evidence"])
def test_no_import_cycle(folder: str) -> None:
    assert import_cycles(ROOT / folder) == []
