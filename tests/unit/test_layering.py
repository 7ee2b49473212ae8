"""No import cycle among orchestrator's modules: a module that needs another's name gets it
passed in, or the two share a third. Counted are the imports at the top of a module, inside
functions (where a lazy import hides a cycle that only bites at run time), and those under
`if TYPE_CHECKING:`: they never run, but a type that names its importer is the same two-way
dependency, kept alive for the reader and for mypy."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(tree: ast.AST, *, typing: bool) -> set[str]:
    """Dotted names a module imports, also inside functions (`from A import b`: A.b, and A when A.b
    is not a module; the caller tells which); under TYPE_CHECKING only when `typing`."""
    out: set[str] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if _is_type_checking(node) and not typing:
            todo += getattr(node, "orelse", [])
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {f"{node.module}.{a.name}\t{node.module}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        todo += ast.iter_child_nodes(node)
    return out


def import_graph(root: Path, *, typing: bool = False) -> dict[str, set[str]]:
    """module -> the modules of `root` it imports, by dotted name under the package (`cli.context`)."""
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__") for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        mod = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        graph[mod] = set()
        for name in _imported(ast.parse(path.read_text(encoding="utf-8")), typing=typing):
            full, _, owner = (n.removeprefix(root.name + ".") for n in name.partition("\t"))
            target = full if full in paths else owner
            if target in paths and target != mod:
                graph[mod].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each set of modules that import each other (depth-first)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
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
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("from demo.sub.b import x\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from demo import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from demo import a\n")
    (pkg / "d.py").write_text("from demo.c import y\n")
    assert import_cycles(import_graph(pkg)) == [["a", "sub.b", "a"]]
    (pkg / "a.py").write_text("from demo import c\n")
    assert import_cycles(import_graph(pkg)) == []
    assert import_cycles(import_graph(pkg, typing=True)) == [["a", "c", "a"]]


def test_no_import_cycle_even_for_types() -> None:
    assert import_cycles(import_graph(ROOT, typing=True)) == []
