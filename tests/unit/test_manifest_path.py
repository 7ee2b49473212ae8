"""One name-or-path rule for every manifest a command names."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.inventory import inventories_dir
from orchestrator.config.loader import manifest_path
from orchestrator.config.profiles import load_profile, profiles_dir
from orchestrator.config.targets import load_target, targets_dir


def test_a_bare_name_is_in_the_folder_a_suffix_is_a_path(tmp_path: Path) -> None:
    assert manifest_path("lab", inventories_dir()) == inventories_dir() / "lab.yaml"
    assert manifest_path("x/y.yaml", tmp_path) == Path("x/y.yaml")
    assert manifest_path(tmp_path / "p.yml", profiles_dir()) == tmp_path / "p.yml"


def test_loaders_take_a_name_or_the_same_file_by_path() -> None:
    for load, folder in ((load_profile, profiles_dir()), (load_target, targets_dir())):
        name = sorted(folder.glob("*.yaml"))[0]
        assert load(name.stem) == load(str(name))
