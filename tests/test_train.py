"""`facetrain train` end to end: resuming on other rank counts, errors, failures, and that training learns.

Resume equality is tests/test_resume_exact.py's (2 ranks, workers, every augmentation, a weight average)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from facetrain import run_lock
from tests.support.fault_helpers import kill_all, rank_processes, start, wait_for_step
from tests.support.train_helpers import run_cli, run_cli_at_once, tiny_config


@pytest.mark.slow
def test_two_rank_run_resumes_on_one_and_three_ranks(tmp_path):
    config = tiny_config(tmp_path, "run", train={"steps": 2}, checkpoint={"every": 2})
    assert run_cli("train", "-c", str(config), "--nproc", "2").returncode == 0
    for nproc, steps in ((1, 3), (3, 4)):
        result = run_cli(
            "train",
            "-c",
            str(config),
            "--nproc",
            str(nproc),
            "--set",
            f"train.steps={steps}",
            "--resume",
            "auto",
        )
        assert result.returncode == 0, result.stderr
        meta = json.loads((tmp_path / "run" / "checkpoints" / f"step_{steps:08d}" / "meta.json").read_text())
        assert (meta["step"], meta["world_size"]) == (steps, nproc)


def test_existing_run_is_not_trained_over(tmp_path):
    """Also while another process holds the run (here this one; in the race it was the other of two
    starts at once): the folder's checkpoints are named before its lock is tried, by a single process
    and by the launcher alike."""
    config = tiny_config(tmp_path, "run", train={"steps": 1})
    assert run_cli("train", "-c", str(config)).returncode == 0
    run_lock.acquire(tmp_path / "run", "test", "")
    try:
        results = run_cli_at_once(*(("train", "-c", str(config), "--nproc", nproc) for nproc in ("1", "2")))
    finally:
        run_lock.release(tmp_path / "run")
    for result in results:
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"error: {tmp_path / 'run'} already holds checkpoints; pass --resume auto to continue that run, "
            "or choose another train.output_dir"
        ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "train.bogus=1"], "unknown key train.bogus"),
        (["--set", "train.steps=many"], "train.steps must be an integer"),
        (["--set", "data.source=folder", "--set", "data.path=/no/such/faces"], "/no/such/faces"),
        (["--set", "head.margin=bogus"], "head.margin = 'bogus': must be one of"),
    ],
)
def test_user_errors_are_one_line(tmp_path, args, message):
    config = tiny_config(tmp_path, "run")
    result = run_cli("train", "-c", str(config), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_missing_pairs_file_stops_train_before_any_rank_starts(tmp_path):
    """Named by its key, before torch is imported or the data scanned: no run directory appears."""
    config = tiny_config(tmp_path, "run", eval={"pairs": "/data/lfw/pairs.txt"})
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: config {config}: eval.pairs = '/data/lfw/pairs.txt': does not exist; set eval.pairs=null "
        "or give the file"
    ]
    assert not (tmp_path / "run").exists() and not (tmp_path / "synth").exists()


def test_a_set_too_small_for_a_batch_per_rank_gives_the_numbers(tmp_path):
    config = tiny_config(tmp_path, "run", train={"batch_size": 64})
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the training set gives no full batch per rank: 96 images over 2 ranks is 48 a rank, fewer "
        "than train.batch_size 64; set train.batch_size=48 or less, or train on at most 1 rank, or add images"
    )


def test_more_ranks_than_classes_is_one_line(tmp_path):
    from facetrain.data.config import SynthConfig
    from facetrain.data.synthetic import generate_synthetic

    two_identities = SynthConfig(
        identities=2,
        heldout_identities=4,
        heldout_images_per_identity=2,
        pairs_folds=2,
        pairs_per_fold=2,
        image_size=32,
    )
    generate_synthetic(tmp_path / "synth", two_identities, progress=False)
    config = tiny_config(tmp_path, "run")
    result = run_cli("train", "-c", str(config), "--nproc", "3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: 2 classes cannot be sharded over 3 ranks; use at most 2 ranks"
    ]


@pytest.mark.slow
def test_a_dead_rank_stops_the_others(tmp_path):
    config = tiny_config(tmp_path, "run", train={"steps": 100000}, checkpoint={"every": 100000})
    launcher = start("train", "-c", str(config), "--nproc", "2")
    try:
        wait_for_step(launcher, tmp_path / "run", 2)
        os.kill(rank_processes(launcher.pid)[1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
    finally:
        kill_all(launcher)
    assert time.monotonic() - killed_at < 30
    assert launcher.returncode != 0
    assert "error: rank 1 exited with code -9" in stderr
    # the killed rank held no named semaphore for the launcher's resource tracker to clean up and report
    assert "leaked semaphore" not in stderr
