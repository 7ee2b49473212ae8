"""Packaging that pyproject.toml's static tables cannot express: the repo's top-level
`manifests/`, `playbooks/` and `kernels/` (where the product layout keeps them) ship inside the
wheel as `orchestrator/_data/<name>/` (package data read through importlib.resources, see
orchestrator/paths.py), alongside every `orchestrator*` package found in the tree."""

from pathlib import Path

from setuptools import find_namespace_packages, setup

DATA_DIRS = {f"orchestrator._data.{name}": name for name in ("manifests", "playbooks", "kernels")}


def data_packages() -> dict[str, list[str]]:
    """Each data folder and each of its subfolders named like a package (listed, so setuptools
    does not warn that it would ignore them), with the files directly in it."""
    here = Path(__file__).resolve().parent
    out: dict[str, list[str]] = {}
    for pkg, top in DATA_DIRS.items():
        root = here / top
        out[pkg] = ["*"]
        for d in sorted(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"):
            rel = d.relative_to(root).parts
            if all(part.isidentifier() for part in rel):
                out[".".join((pkg, *rel))] = ["*"]
            else:  # not a package name (e.g. mmvf-warp-per-row): its files belong to the nearest package
                i = next(n for n, part in enumerate(rel) if not part.isidentifier())
                owner = ".".join((pkg, *rel[:i]))
                out.setdefault(owner, ["*"]).append("/".join((*rel[i:], "*")))
    return out


PACKAGE_DATA = data_packages()

setup(
    packages=find_namespace_packages(include=["orchestrator*"], exclude=["*.__pycache__"]) + sorted(PACKAGE_DATA),
    package_dir=DATA_DIRS,
    package_data={**PACKAGE_DATA, "orchestrator.hosts": ["*.sh", "*.c"], "orchestrator.evidence": ["*.sh"]},
    exclude_package_data={pkg: ["*.pyc"] for pkg in PACKAGE_DATA},
)
