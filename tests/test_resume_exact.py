"""A run resumed mid-way continues exactly, with DataLoader workers, every augmentation and a weight
average (model.ema_decay) on, resumed inside the margin's warmup.

Augmentation draws come from a per-sample seed (train seed, epoch, position), not from the workers'
random streams, so stopping after k steps and resuming gives the losses, the trained weights and the
weight average of 2k steps trained straight. Only the CLI is used, so this holds whatever the trainer
looks like inside.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from facetrain.checkpoint.names import BACKBONE, EMA, OPTIM_STATE
from facetrain.models import build_backbone
from facetrain.train.run_config import load_config
from tests.support.fault_helpers import assert_same_checkpoint, checkpoint_tensors
from tests.support.train_helpers import logged_losses, run_cli, run_cli_at_once, tiny_config

HALF = 3
AUGMENTED_WITH_WORKERS = {
    "num_workers": 2,
    "augment": {
        "horizontal_flip": True,
        "random_resized_crop": True,
        "crop_scale": [0.6, 1.0],
        "color_jitter": 0.3,
    },
}
# a weight average, and an ArcFace margin still warming up when the run is resumed at step HALF
RUN = {
    "data": AUGMENTED_WITH_WORKERS,
    "model": {"backbone": "small", "embedding_size": 32, "ema_decay": 0.9},
    "head": {"margin": "arcface", "scale": 16.0, "margin_params": {"m": 0.3}, "margin_warmup_steps": 4},
}


def final_weights(run: Path, out: Path) -> dict[str, torch.Tensor]:
    result = run_cli("export", str(run), "-o", str(out), "--formats", "safetensors", "--with-head", "--quiet")
    assert result.returncode == 0, result.stderr
    head = {f"head.{name}": tensor for name, tensor in load_file(out / "head.safetensors").items()}
    return {**load_file(out / "model.safetensors"), **head}


def test_persistent_workers_resume_exactly_across_epochs(tmp_path):
    """data.persistent_workers keeps the loader's workers from one epoch to the next (the default on
    CUDA). At 32 a step the 96 images make 3 steps an epoch: both runs go through an epoch boundary with
    the same workers, the resumed one after starting new workers mid-epoch (at step 2); both end bit for
    bit alike, losses, weights, momentum and RNG states."""
    data = {**AUGMENTED_WITH_WORKERS, "persistent_workers": True}
    train, checkpoint = {"batch_size": 32}, {"every": 100}
    straight = tiny_config(
        tmp_path, "straight", data=data, train={**train, "steps": 5}, checkpoint=checkpoint
    )
    halves = tiny_config(tmp_path, "halves", data=data, train={**train, "steps": 2}, checkpoint=checkpoint)
    results = [run_cli("train", "-c", str(halves))]  # which writes the synthetic set, then at once:
    resumed = ("train", "-c", str(halves), "--set", "train.steps=5", "--resume", "auto")
    results += run_cli_at_once(("train", "-c", str(straight)), resumed)
    for result in results:
        assert result.returncode == 0, result.stderr
        assert "persistent_workers on" in result.stdout
    assert logged_losses(tmp_path / "halves") == logged_losses(tmp_path / "straight")
    assert_same_checkpoint(tmp_path / "halves", tmp_path / "straight")


@pytest.mark.slow
def test_two_ranks_with_workers_resume_to_the_same_losses_and_weights(tmp_path):
    straight = tiny_config(tmp_path, "straight", **RUN, train={"steps": 2 * HALF}, checkpoint={"every": HALF})
    halves = tiny_config(tmp_path, "halves", **RUN, train={"steps": HALF})
    for args in (
        ("-c", str(straight)),
        ("-c", str(halves)),
        ("-c", str(halves), "--set", f"train.steps={2 * HALF}", "--resume", "auto"),
    ):
        result = run_cli("train", *args, "--nproc", "2")
        assert result.returncode == 0, result.stderr

    expected, resumed = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "halves")
    assert len(expected) == len(resumed) == 2 * HALF
    assert resumed == pytest.approx(expected, abs=1e-6)

    for prefix in (EMA, BACKBONE):  # the weight average and the trained weights beside it
        expected_entries = checkpoint_tensors(tmp_path / "straight", prefix)
        resumed_entries = checkpoint_tensors(tmp_path / "halves", prefix)
        assert sorted(expected_entries) == sorted(resumed_entries) and expected_entries
        for name, tensor in expected_entries.items():
            torch.testing.assert_close(resumed_entries[name], tensor, rtol=0, atol=1e-6, msg=prefix + name)

    weights = final_weights(tmp_path / "straight", tmp_path / "straight_export")
    resumed_weights = final_weights(tmp_path / "halves", tmp_path / "halves_export")
    assert sorted(weights) == sorted(resumed_weights) and "head.weight" in weights
    for name, tensor in weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_frozen_and_decayed_stages_resume_to_the_same_checkpoint(tmp_path):
    """optim.freeze_stages and optim.layer_decay: the parameter groups are rebuilt on resume, each with
    its own rate inside a warmup and a cosine decay, and the frozen stages have no optimizer state: the
    resumed run ends bit for bit where the straight one does (weights, BN statistics, momentum, RNG)."""
    optim = {"freeze_stages": 2, "layer_decay": 0.7, "schedule": "cosine", "warmup_steps": 2}
    straight = tiny_config(tmp_path, "straight", optim=optim, train={"steps": 2 * HALF})
    halves = tiny_config(tmp_path, "halves", optim=optim, train={"steps": HALF})
    for args in (
        ("-c", str(straight)),
        ("-c", str(halves)),
        ("-c", str(halves), "--set", f"train.steps={2 * HALF}", "--resume", "auto"),
    ):
        result = run_cli("train", *args)
        assert result.returncode == 0, result.stderr
    assert logged_losses(tmp_path / "halves") == logged_losses(tmp_path / "straight")
    assert_same_checkpoint(tmp_path / "halves", tmp_path / "straight")
    momentum = checkpoint_tensors(tmp_path / "straight", OPTIM_STATE + "backbone.")  # by parameter name
    assert any(key.startswith("stage3.") for key in momentum)
    assert not any(key.startswith(("stem.", "stage1.")) for key in momentum)  # frozen: never stepped


@pytest.mark.slow
def test_frozen_stages_train_under_ddp_and_stay_frozen_when_two_ranks_resume_on_one(tmp_path):
    """DDP reads which parameters require gradients when it wraps the backbone, so the freeze comes
    first; the optimizer state is saved by parameter name, so two ranks' groups reshard onto one."""
    optim = {"freeze_stages": 2, "layer_decay": 0.7}
    config = tiny_config(tmp_path, "run", optim=optim, train={"steps": 2}, checkpoint={"every": 2})
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 0, result.stderr
    resumed = run_cli("train", "-c", str(config), "--set", "train.steps=4", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    two_ranks, one_rank = (
        checkpoint_tensors(checkpoints / name, BACKBONE) for name in ("step_00000002", "step_00000004")
    )
    cfg = load_config(config)
    torch.manual_seed(cfg.train.seed)  # the initial weights, as the run drew them
    initial = build_backbone(cfg.model, tuple(cfg.data.image_size)).state_dict()
    frozen = [key for key in two_ranks if key.startswith(("stem.", "stage1."))]
    assert any("running_var" in key for key in frozen)
    for key in frozen:  # weights and BN statistics, through DDP's steps and the resumed ones
        assert torch.equal(two_ranks[key], initial[key]) and torch.equal(one_rank[key], initial[key]), key
    assert not torch.equal(two_ranks["stage3.conv.0.weight"], one_rank["stage3.conv.0.weight"])
