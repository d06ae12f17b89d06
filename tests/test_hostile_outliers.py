"""`facetrain outliers` on runs that are not what it expects (#57, round 4): relative paths read from
elsewhere, a diverged head, a folder as -o; each one line or the right data."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from facetrain.cli import main
from tests.support.hostile_helpers import one_line_error
from tests.support.train_helpers import run_cli, tiny_config


@pytest.fixture(scope="module")
def relative_run(tmp_path_factory) -> Path:
    """A tiny run trained from `tmp` with relative paths (data.path synth, train.output_dir runs/r)."""
    tmp = tmp_path_factory.mktemp("relative")
    config = tiny_config(
        tmp, "r", data={"path": "synth"}, train={"output_dir": "runs/r", "steps": 2}, checkpoint={"every": 2}
    )
    result = run_cli("train", "-c", str(config), "-q", cwd=tmp)
    assert result.returncode == 0, result.stderr
    return tmp


def test_relative_paths_are_read_where_the_run_trained(relative_run, tmp_path):
    """Was: data.path read relative to the current folder (`no synthetic set at synth`, or another set
    of that name); now relative to the folder train ran in, which the run's output_dir tells."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    report = tmp_path / "report.csv"
    result = run_cli("outliers", str(relative_run / "runs" / "r"), "-o", str(report), "-q", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    with report.open(newline="") as handle:
        paths = [row["path"] for row in csv.DictReader(handle)]
    assert paths and all(path.startswith(str(relative_run / "synth")) for path in paths)
    assert list(elsewhere.iterdir()) == []


def test_a_diverged_head_is_one_line_not_0_flagged(relative_run, monkeypatch):
    """Was: `0 of N images flagged` from a head of NaN (every cosine NaN flags nothing)."""
    run = relative_run / "runs" / "r"

    def nan_head(checkpoint):
        from facetrain.checkpoint import read_entries
        from facetrain.checkpoint.names import HEAD_WEIGHT

        return torch.full_like(read_entries(checkpoint, [HEAD_WEIGHT])[HEAD_WEIGHT], float("nan"))

    monkeypatch.setattr("facetrain.train.outliers.load_full_head", nan_head)
    line = one_line_error("outliers", run, "-o", relative_run / "nan.csv", "-q")
    assert line.startswith(f"error: checkpoint {run / 'checkpoints' / 'step_00000002'}: its head holds NaN")
    assert not (relative_run / "nan.csv").exists()


def test_a_folder_as_the_report_is_one_line_before_any_work(relative_run, monkeypatch):
    """Was: an IsADirectoryError traceback naming a temporary file, after every image was embedded."""
    folder = relative_run / "a_folder.csv"
    folder.mkdir()
    monkeypatch.setattr(
        "facetrain.train.outliers.compute_embeddings", lambda *a, **k: pytest.fail("embedded")
    )
    line = one_line_error("outliers", relative_run / "runs" / "r", "-o", folder, "-q", "--overwrite")
    assert (
        line
        == f"error: -o: {folder} is a folder, where a file of that name is written; move it or choose another -o"
    )


def test_embed_norms_onto_a_folder_is_one_line_before_any_work(tmp_path):
    """Was: a traceback after the embedding, X.npy already written beside the folder X.norms.npy."""
    (tmp_path / "emb.norms.npy").mkdir()
    result = CliRunner().invoke(
        main, ["embed", str(tmp_path / "no_model"), str(tmp_path), "-o", str(tmp_path / "emb.npy"), "--norms"]
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: -o: {tmp_path / 'emb.norms.npy'} is a folder, where a file of that name is written; move it or "
        "choose another -o"
    )
    assert not (tmp_path / "emb.npy").exists()
