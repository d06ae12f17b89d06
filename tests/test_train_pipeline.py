"""`facetrain train` with a pipelined backbone (stages x replicas) and its checkpoints."""

from __future__ import annotations

import pytest

from facetrain.checkpoint import load_full_head, read_meta, resolve_checkpoint
from facetrain.interop import load_model
from facetrain.train.run_config import checkpoint_config
from tests.support.train_helpers import logged_losses, run_cli, tiny_config


@pytest.mark.slow
def test_two_stages_two_replicas_train_checkpoint_and_resume_without_pipeline(tmp_path):
    config = tiny_config(
        tmp_path,
        "run",
        train={"steps": 3},
        checkpoint={"every": 3},
        parallel={"pipeline_stages": 2, "microbatches": 2},
    )
    result = run_cli("train", "-c", str(config), "--nproc", "4")
    assert result.returncode == 0, result.stderr
    losses = logged_losses(tmp_path / "run")
    assert len(losses) == 3 and all(loss > 0 for loss in losses)

    # every stage wrote its part: the whole backbone and head load without a process group
    load_model(tmp_path / "run")
    meta = read_meta(resolve_checkpoint(tmp_path / "run"))
    cfg = checkpoint_config(resolve_checkpoint(tmp_path / "run"))
    assert meta["world_size"] == 4 and cfg.parallel.pipeline_stages == 2
    assert load_full_head(tmp_path / "run").shape == (12, 32)

    # and the run continues as plain data parallelism on 2 ranks
    result = run_cli(
        "train",
        "-c",
        str(config),
        "--nproc",
        "2",
        "--resume",
        "auto",
        "--set",
        "parallel.pipeline_stages=1",
        "--set",
        "train.steps=5",
    )
    assert result.returncode == 0, result.stderr
    assert read_meta(resolve_checkpoint(tmp_path / "run"))["step"] == 5


def test_pipeline_settings_are_checked(tmp_path):
    config = tiny_config(tmp_path, "run", parallel={"pipeline_stages": 2})
    result = run_cli("train", "-c", str(config), "--nproc", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: config {config}: parallel.pipeline_stages = 2: must divide the world size 3 "
        "(world = stages x replicas)"
    ]
