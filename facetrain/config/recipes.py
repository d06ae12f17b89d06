"""The recipes: the configs facetrain ships, which `-c NAME` names without a path.

They are the checkout's `configs/*.yaml`, the one copy: the package's `recipes` folder is a link to
that folder, which the wheel holds as package data, so a clone, an editable install and a pip install
read the same files through `importlib.resources`. Each recipe's first line is a comment saying what
it is for, which `facetrain config --recipes` lists, so a new recipe describes itself.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from facetrain.errors import FacetrainError

SUFFIXES = (".yaml", ".yml")


def recipe_folder() -> Traversable:
    return files("facetrain") / "recipes"


def recipe_names() -> list[str]:
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in recipe_folder().iterdir()
        if entry.name.endswith(".yaml")
    )


def recipe_purposes() -> dict[str, str]:
    """Each recipe's name and its first line, the one-line purpose (without the comment mark)."""
    return {name: _first_line(name).lstrip("#").strip() for name in recipe_names()}


def _first_line(name: str) -> str:
    return (recipe_folder() / f"{name}.yaml").read_text(encoding="utf-8").partition("\n")[0]


def is_recipe_name(given: str | Path) -> bool:
    """A config given without a folder or a YAML suffix (`-c laptop`) names a recipe; anything else
    is a file's path (`-c configs/laptop.yaml`, `-c ./mine`)."""
    text = str(given)
    return not isinstance(given, Path) and "/" not in text and not text.endswith(SUFFIXES)


def config_file(given: str | Path) -> Path:
    """The file a `-c` value names: a recipe's file for a recipe's name, else the path as given."""
    if not is_recipe_name(given):
        return Path(given)
    entry = recipe_folder() / f"{given}.yaml"
    if not entry.is_file():
        raise FacetrainError(
            f"config {given}: no recipe of that name; the recipes: {', '.join(recipe_names())} "
            "(`facetrain config --recipes` says what each is for); a file's path has a / or ends in .yaml"
        )
    return Path(str(entry))  # an installed package's files are files (pip unpacks wheels)
