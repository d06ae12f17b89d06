"""The recipes: `-c NAME` reads configs/NAME.yaml through the package (facetrain/recipes), from any
folder; `facetrain config --recipes` lists them with their first lines; `facetrain slurm-script` and
`facetrain --version`."""

from __future__ import annotations

import re
import subprocess

import yaml
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.config.recipes import config_file, recipe_purposes
from facetrain.train.run_config import load_config
from tests.support.train_helpers import REPO

SHIPPED = sorted(path.stem for path in (REPO / "configs").glob("*.yaml"))


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_recipe_by_name_is_the_checkouts_file_read_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SHIPPED:
        assert config_file(name).read_bytes() == (REPO / "configs" / f"{name}.yaml").read_bytes()
        assert load_config(name) == load_config(REPO / "configs" / f"{name}.yaml")


def test_a_path_is_read_as_a_path_even_beside_a_recipe_of_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "laptop.yaml").write_text("train: {steps: 7}\n")
    assert load_config("laptop.yaml").train.steps == 7
    assert load_config("./laptop.yaml").train.steps == 7
    assert load_config("laptop").train.steps == 300  # the recipe


def test_an_unknown_recipe_is_one_line_listing_the_recipes():
    result = invoke("config", "-c", "laptp")
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line.startswith("error: config laptp: no recipe of that name; the recipes: " + ", ".join(SHIPPED))


def test_config_recipes_lists_every_recipe_with_its_first_line():
    result = invoke("config", "--recipes")
    assert result.exit_code == 0, result.output
    listed = [re.split(r"\s{2,}", line, maxsplit=1) for line in result.output.splitlines()]
    assert [name for name, _ in listed] == SHIPPED
    for name, purpose in listed:
        first = (REPO / "configs" / f"{name}.yaml").read_text().splitlines()[0]
        assert first == f"# {purpose}" and purpose.endswith(".") and len(first) <= 110, name


def test_each_recipe_of_what_to_use_says_its_rows_first_column():
    """docs/accuracy.md's "What to use": a recipe a row names first says that row's data (its first
    column, less a closing aside) in its own first line, so `--recipes` and the table agree."""
    table = (REPO / "docs" / "accuracy.md").read_text().split("## What to use")[1].split("\n\n")[1]
    rows = [row.split(" | ") for row in table.splitlines()[2:]]
    purposes = {name: purpose.lower() for name, purpose in recipe_purposes().items()}
    named = {}
    for row in rows:
        first = re.search(r"configs/(\w+)\.yaml", row[1])
        data = re.sub(r"\s*\([^)]*\)$", "", row[0].strip("| ").replace("`", ""))  # less a closing aside
        named.setdefault(first.group(1), []).append(data)
    assert {"laptop", "lfw_small", "orl_small", "finetune_dlib", "faces_small"} <= set(named)
    for name, data in named.items():
        assert any(purposes[name].replace("`", "").startswith(text.lower()) for text in data), (name, data)


def test_config_writes_a_recipe_to_start_from_with_a_note_on_its_placeholder_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("config", "-c", "laptop")
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(result.stdout)
    assert written["data"]["path"] == "faces" and written["train"]["steps"] == 300
    assert result.stderr.splitlines() == [
        "note: data.path = 'faces' is recipe laptop's placeholder and is not here: set it to yours "
        "(--set data.path=PATH, or in the file written) before training"
    ]
    (tmp_path / "my.yaml").write_text(result.stdout)
    # the same path from a file or --set is the user's own: missing, it is an error as ever
    assert invoke("config", "-c", "my.yaml").exit_code == 2
    assert invoke("config", "-c", "laptop", "--set", "data.path=nowhere").exit_code == 2


def test_slurm_script_prints_the_packaged_scripts_the_multinode_one_with_its_nodes():
    one = invoke("slurm-script")
    assert one.exit_code == 0
    assert one.stdout == (REPO / "facetrain" / "cli" / "slurm" / "train.sbatch").read_text()
    several = invoke("slurm-script", "--nodes", "4")
    shipped = (REPO / "facetrain" / "cli" / "slurm" / "train_multinode.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in shipped
    assert several.stdout == shipped.replace("#SBATCH --nodes=2\n", "#SBATCH --nodes=4\n")


def test_version_names_the_commit_in_a_checkout_and_goes_on_without_git(monkeypatch):
    from facetrain import __version__

    result = invoke("--version")
    assert result.exit_code == 0
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if commit:  # a clone (CI's is one)
        assert result.stdout.startswith(f"facetrain {__version__} (commit {commit}")
        assert result.stdout.rstrip().endswith(f", checkout {REPO})")
    monkeypatch.setenv("PATH", "/nonexistent")  # no git
    assert invoke("--version").stdout == f"facetrain {__version__}\n"
