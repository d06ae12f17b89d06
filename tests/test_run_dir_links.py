"""A run folder whose files lead out of it (#57, high): a resume never writes through a symlink into a
file or folder outside the run, and a file of the run that is a folder (or the reverse) is one line.
Before, `ln -sf OUTSIDE RUN/classes.json` and a resume exited 0 with the class list written into
OUTSIDE; `summary.json`, `.facetrain-lock` and `eval/step_N.json` were overwritten the same way, and
`train.log` and `metrics.csv` appended to."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from facetrain.checkpoint.run_dir import check_run_dir
from facetrain.errors import FacetrainError
from facetrain.files import links_leaving, open_appending
from tests.support.fault_helpers import error_lines
from tests.support.train_helpers import run_cli


def copied_run(finished_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run in tmp_path/run and its config."""
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    return tmp_path / "run", config


def plant_link(run: Path, name: str, tmp_path: Path) -> tuple[Path, Path, Path]:
    """RUN/NAME replaced by a link to a file (or, for a folder, a folder) of the user's outside the run;
    returns the link, its target and the user's folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "thesis.txt").write_text("precious\n")
    target = outside if name in ("eval", "tensorboard", "checkpoints") else outside / "thesis.txt"
    link = run / name
    shutil.rmtree(link) if link.is_dir() and not link.is_symlink() else link.unlink(missing_ok=True)
    link.symlink_to(target)
    return link, target, outside


def link_refusal(link: Path, target: Path, run: Path) -> str:
    return (
        f"{link} is a symlink to {target}, outside the run folder {run}, and training writes only "
        "inside its run: replace the link with a copy of what it names, or remove it"
    )


@pytest.mark.parametrize("name", ["classes.json", "train.log", "eval"])
def test_a_resume_refuses_a_link_out_of_the_run_and_writes_nothing_outside(finished_run, tmp_path, name):
    run, config = copied_run(finished_run, tmp_path)
    link, target, outside = plant_link(run, name, tmp_path)
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=3")
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [f"error: {link_refusal(link, target, run)}"]
    assert sorted(os.listdir(outside)) == ["thesis.txt"]
    assert (outside / "thesis.txt").read_text() == "precious\n"


@pytest.mark.parametrize(
    "name",
    ["summary.json", ".facetrain-lock", ".facetrain-run", "metrics.csv", "config.yaml", "curves.png",
     "tensorboard", "checkpoints", "checkpoints/last", "checkpoints/step_00000002/meta.json"],
)  # fmt: skip
def test_every_file_and_folder_of_a_run_linked_out_of_it_is_refused(finished_run, tmp_path, name):
    """The check every start of a run makes before anything is written (`check_run_dir`)."""
    shutil.copytree(finished_run / "run", tmp_path / "run")
    run = tmp_path / "run"
    link, target, _ = plant_link(run, name, tmp_path)
    with pytest.raises(FacetrainError) as error:
        check_run_dir(run)
    assert str(error.value) == link_refusal(link, target, run)


FOLDER_FOR_FILE = "a folder where the run keeps a file of its own"


def test_a_log_that_is_a_folder_is_one_line(finished_run, tmp_path):
    run, config = copied_run(finished_run, tmp_path)
    (run / "train.log").unlink()
    (run / "train.log").mkdir()
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=3")
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"error: {run / 'train.log'} is {FOLDER_FOR_FILE}; move it out of the run"
    ]


@pytest.mark.parametrize(
    "name, make, kind",
    [
        ("metrics.csv", Path.mkdir, FOLDER_FOR_FILE),
        ("summary.json", Path.mkdir, FOLDER_FOR_FILE),
        ("tensorboard", Path.touch, "a file where the run keeps a folder of its own"),
        ("checkpoints", Path.touch, "a file where the run keeps a folder of its own"),
    ],
)
def test_a_run_file_of_the_wrong_kind_is_one_line(finished_run, tmp_path, name, make, kind):
    shutil.copytree(finished_run / "run", tmp_path / "run")
    path = tmp_path / "run" / name
    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    make(path)
    with pytest.raises(FacetrainError) as error:
        check_run_dir(tmp_path / "run")
    assert str(error.value) == f"{path} is {kind}; move it out of the run"


def test_the_writers_never_follow_a_link(tmp_path):
    """What the run appends to is opened without following a last-component link (a link planted after
    the run's check); what it rewrites is replaced by a rename, which replaces the link itself."""
    outside = tmp_path / "thesis.txt"
    outside.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").symlink_to(outside)
    with pytest.raises(OSError) as error:
        open_appending(run / "train.log")
    assert error.value.errno == 40  # ELOOP
    (run / "inside.txt").write_text("")
    (run / "linked_inside").symlink_to(run / "inside.txt")
    assert list(links_leaving(run)) == [(run / "train.log", str(outside))]
    assert outside.read_text() == "precious\n"
