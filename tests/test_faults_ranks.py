"""Faults in 2-rank runs: a torchrun restart after a dead rank, a rank lost without any launcher's
help, and data that turns bad on one rank mid-run. Stop signals to a launcher, an agent or every
process of a run are in test_stop_signals.py.

Every run here is 2 spawned CPU ranks on the small backbone at 32x32 (tests/support/train_helpers.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point
from facetrain.data import SAMPLERS, build_train_dataset
from facetrain.data.config import DataConfig, SynthConfig
from facetrain.data.synthetic import generate_synthetic
from tests.support.fault_helpers import (
    ENV,
    UNINTERRUPTED_EVERY,
    UNINTERRUPTED_STEPS,
    assert_same_checkpoint,
    error_lines,
    kill_all,
    rank_processes,
    signal_group,
    start,
    wait_for_step,
)
from tests.support.train_helpers import REPO, tiny_config

STEPS, EVERY, BATCH = UNINTERRUPTED_STEPS, UNINTERRUPTED_EVERY, 8
FOREVER = {"steps": 100000}


@pytest.mark.slow
def test_a_torchrun_job_restarted_after_a_dead_rank_resumes_by_itself(tmp_path, uninterrupted_two_ranks):
    config = tiny_config(tmp_path, "run", train={"steps": STEPS}, checkpoint={"every": EVERY})
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "1", "-m", "facetrain", "train", "-c", str(config)],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_step(torchrun, tmp_path / "run", EVERY + 1)
        os.kill(rank_processes(torchrun.pid)[1], signal.SIGKILL)
        stdout, stderr = torchrun.communicate(timeout=240)
    finally:
        kill_all(torchrun)
    assert torchrun.returncode == 0, stderr
    checkpoint = tmp_path / "run" / "checkpoints"
    resumed = [line for line in stdout.splitlines() if line.startswith("resumed from ")]
    assert len(resumed) == 1 and resumed[0].startswith(f"resumed from {checkpoint / 'step_0000000'}")
    assert_same_checkpoint(tmp_path / "run", uninterrupted_two_ranks)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_lost_rank_is_named_within_the_collective_timeout(tmp_path, fault):
    """Plain `facetrain train` per rank (forked from warm imports, tests/support/cli_zygote.py), as
    torchrun starts them but with no agent to stop the survivor: the collective timeout (5 s here) and
    the check-in at the store must."""
    timeout_s = 5
    config = tiny_config(
        tmp_path, "run", train=FOREVER, checkpoint={"every": 100000}, parallel={"timeout_s": timeout_s}
    )
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    ranks = [
        start("train", "-c", str(config), **rendezvous, RANK=str(rank), LOCAL_RANK=str(rank))
        for rank in range(2)
    ]
    try:
        wait_for_step(ranks[0], tmp_path / "run", 3)
        os.kill(ranks[1].pid, fault)
        lost_at = time.monotonic()
        _, stderr = ranks[0].communicate(timeout=timeout_s + 60)
        elapsed = time.monotonic() - lost_at
    finally:
        for process in ranks:
            kill_all(process)
    assert ranks[0].returncode == 2, stderr
    assert elapsed < timeout_s + 10  # the timeout, the 5 s check-in, and a margin
    [line] = error_lines(stderr)
    assert line.startswith("error: lost rank 1 at step ") and "it died or stopped answering" in line
    assert "Traceback" not in stderr


def synthetic_faces(tmp: Path) -> Path:
    """The synthetic training images as a plain image folder, so a test can break one of them."""
    generate_synthetic(  # the synthetic set tiny_config trains on
        tmp / "synth",
        SynthConfig(
            identities=12, images_per_identity=8, heldout_identities=8, heldout_images_per_identity=4,
            pairs_folds=2, pairs_per_fold=10, image_size=32,
        ),
        progress=False,
    )  # fmt: skip
    shutil.copytree(tmp / "synth" / "train", tmp / "faces")
    return tmp / "faces"


def image_read_by(faces: Path, rank: int, epoch: int, batch: int) -> Path:
    """The first image of `batch` that `rank` reads in `epoch` (2 ranks, seed 0), from the sampler itself."""
    data = DataConfig(source="folder", path=str(faces), image_size=[32, 32])
    dataset = build_train_dataset(data)
    sampler = SAMPLERS.build("distributed", dataset, BATCH, rank, 2, 0)
    sampler.set_epoch(epoch)
    return Path(dataset.table.reader.name(int(list(sampler)[batch * BATCH])))


def break_between_epochs(tmp: Path, skip_bad_images: bool, damage) -> tuple[subprocess.Popen, Path, Path]:
    """Train on the folder; once epoch 0 (6 steps) is done, pause every process, damage the image rank 1
    reads first in epoch 1's last batch (step 12), and let the run go on."""
    faces = synthetic_faces(tmp)
    victim = image_read_by(faces, rank=1, epoch=1, batch=5)
    config = tiny_config(
        tmp, "run", data={"source": "folder", "path": str(faces), "skip_bad_images": skip_bad_images},
        train={"steps": 14}, checkpoint={"every": 100},
    )  # fmt: skip
    launcher = start("train", "-c", str(config), "--nproc", "2")
    wait_for_step(launcher, tmp / "run", 6)
    signal_group(launcher, signal.SIGSTOP)
    damage(victim)
    signal_group(launcher, signal.SIGCONT)
    return launcher, victim, config


@pytest.mark.slow
def test_an_image_deleted_mid_run_on_rank_1_is_one_line_last_with_a_checkpoint_first(tmp_path):
    launcher, victim, config = break_between_epochs(tmp_path, False, Path.unlink)
    try:
        _, stderr = launcher.communicate(timeout=120)
    finally:
        kill_all(launcher)
    assert launcher.returncode == 2
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000011"
    assert error_lines(stderr) == [
        "error: rank 1 of 2 failed; stopped ranks [0]",
        f"[rank 1] error: step 12: image {victim} does not exist; fix or remove it (or its list entry), or set "
        f"data.skip_bad_images: true to skip such images; checkpoint {checkpoint} holds steps 1-11: fix the "
        "data, then resume with --resume auto",
    ]
    assert find_resume_point(tmp_path / "run")[0] == checkpoint
    assert "Traceback" not in stderr and "gloo" not in stderr


@pytest.mark.slow
def test_an_image_truncated_mid_run_is_skipped_and_counted_with_skip_bad_images(tmp_path):
    def truncate(path: Path) -> None:
        path.write_bytes(path.read_bytes()[:100])

    launcher, _, _ = break_between_epochs(tmp_path, True, truncate)
    try:
        stdout, stderr = launcher.communicate(timeout=120)
    finally:
        kill_all(launcher)
    assert launcher.returncode == 0, stderr
    assert "epoch 1: skipped 1 unreadable images (data.skip_bad_images)" in stdout.splitlines()
    assert "epoch 0: skipped" not in stdout
    assert find_resume_point(tmp_path / "run")[0].name == "step_00000014"
