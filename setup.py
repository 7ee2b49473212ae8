"""Packaging that pyproject.toml's static tables cannot express: the repo's top-level
`manifests/`, `playbooks/` and `kernels/` (where the product layout keeps them) ship inside the
wheel as `orchestrator/_data/<name>/` (package data read through importlib.resources, see
orchestrator/paths.py), alongside every `orchestrator*` package found in the tree."""

from setuptools import find_namespace_packages, setup

DATA_DIRS = {f"orchestrator._data.{name}": name for name in ("manifests", "playbooks", "kernels")}

setup(
    packages=find_namespace_packages(include=["orchestrator*"], exclude=["*.__pycache__"]) + sorted(DATA_DIRS),
    package_dir=DATA_DIRS,
    package_data={
        **{pkg: ["**/*"] for pkg in DATA_DIRS},
        "orchestrator.hosts": ["*.sh"],
    },
    exclude_package_data={pkg: ["**/__pycache__/*", "**/*.pyc"] for pkg in DATA_DIRS},
)
