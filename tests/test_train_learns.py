"""Training learns: verification on held-out identities ends well above the untrained network's.

Thresholds were set from measured runs (docs/training.md lists the figures) with a wide safety margin.
"""

from __future__ import annotations

import json

import pytest
import torch

from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.verify_pairs import load_pairs, verify
from facetrain.interop.loading import load_model
from facetrain.models import build_backbone
from facetrain.train.run_config import load_config
from tests.support.train_helpers import REPO, run_cli, tiny_config
from tools.ablate_orl import write_orl_split


def untrained_result(config_path, pairs_path):
    cfg = load_config(config_path)
    torch.manual_seed(cfg.train.seed)  # the trainer's initial weights
    backbone = build_backbone(cfg.model, tuple(cfg.data.image_size)).eval()
    return verify(load_pairs(pairs_path), backbone, EmbedSettings(tuple(cfg.data.image_size), progress=False))


def trained_result(run_dir):
    return json.loads((run_dir / "summary.json").read_text())["evaluation"]


@pytest.mark.slow
def test_synthetic_training_beats_the_untrained_network(tmp_path):
    config = tiny_config(
        tmp_path,
        "run",
        data={
            "synth": {
                "identities": 40,
                "images_per_identity": 10,
                "heldout_identities": 20,
                "heldout_images_per_identity": 6,
                "pairs_folds": 5,
                "pairs_per_fold": 30,
                "image_size": 32,
            }
        },
        optim={"lr": 0.1, "schedule": "polynomial", "warmup_steps": 10},
        train={"steps": 150, "batch_size": 16, "log_every": 10, "deterministic": False},
        checkpoint={"every": 150},
        eval={"pairs": str(tmp_path / "synth" / "heldout" / "pairs.txt")},
    )
    result = run_cli("train", "-c", str(config), "--nproc", "2", timeout=600)
    assert result.returncode == 0, result.stderr
    trained = trained_result(tmp_path / "run")
    console = result.stdout + result.stderr  # each verification and the final summary are printed
    assert f"step 150: verification {100 * trained['accuracy']:.1f} ± " in console
    assert "done: 150 steps; last step 150: verification" in console and "curves.png" in console
    untrained = untrained_result(config, tmp_path / "synth" / "heldout" / "pairs.txt")
    print(f"synthetic held-out: trained {trained['accuracy']:.3f} vs untrained {untrained.accuracy:.3f}")
    assert trained["accuracy"] >= untrained.accuracy + 0.10  # measured: 0.733 vs 0.503
    assert trained["accuracy"] >= 0.65


# The recipe of configs/orl_small.yaml at 300 of its 600 steps on the balanced ORL pairs, on the 2-core
# test machine (docs/accuracy.md, "The recipe at 300 steps"): seed 0 (this test's) 0.900, seed 1 0.911,
# the two-seed screen 0.911 (the full recipe: 0.889-0.924 over seeds 0-4); the threshold sits 5 points
# under seed 0 for other machines' runs (their thread counts change the float sums, hence the weights).
ORL_BALANCED_ACCURACY = 0.85


@pytest.mark.slow
def test_orl_real_faces(shared_data, tmp_path):
    """configs/orl_small.yaml trained on s1-s30 (2 ranks) at half its schedule, 300 steps, verified on
    held-out s31-s40 the way tools/ablate_orl.py measures it; the thresholds sit under measured runs,
    quoted in comments. Half the schedule is the recipe's documented short run (docs/accuracy.md, "The
    recipe at 300 steps"): the test is about training learning on real faces, at half the wall."""
    train_list, balanced, all_pairs = write_orl_split(shared_data / "orl", tmp_path)
    run = tmp_path / "orl"
    overrides = {
        "data.source": "list",
        "data.path": train_list,
        "eval.pairs": balanced,
        "train.output_dir": run,
        "train.seed": 0,
        "train.steps": 300,
        "checkpoint.every": 300,
    }
    sets = [f"--set={key}={value}" for key, value in overrides.items()]
    result = run_cli(
        "train", "-c", str(REPO / "configs" / "orl_small.yaml"), *sets, "--nproc", "2", timeout=900
    )
    assert result.returncode == 0, result.stderr
    trained = trained_result(run)
    untrained = untrained_result(run / "config.yaml", balanced)
    model = load_model(run)
    everything = verify(
        load_pairs(all_pairs), model.module, EmbedSettings(model.image_size, progress=False)
    ).metrics
    print(
        f"ORL s31-s40, balanced {trained['num_pairs']} pairs: trained accuracy {trained['accuracy']:.3f} "
        f"AUC {trained['auc']:.3f} EER {trained['eer']:.3f}, threshold {trained['threshold']:.3f} at FAR "
        f"{trained['threshold_far']:.3f} TAR {trained['threshold_tar']:.3f}; untrained accuracy "
        f"{untrained.accuracy:.3f} AUC {untrained.metrics.auc:.3f}. All {everything.num_pairs} pairs: "
        f"accuracy {everything.accuracy_mean:.3f} AUC {everything.auc:.3f}, all-different baseline "
        f"{everything.baseline_accuracy:.3f}"
    )
    assert trained["num_pairs"] == 900 and trained["num_matched"] == 450
    assert trained["folds"] == 10 and trained["baseline_accuracy"] == 0.5
    assert trained["accuracy"] >= ORL_BALANCED_ACCURACY
    assert trained["accuracy"] >= untrained.accuracy + 0.05  # untrained: 0.79
    assert trained["auc"] >= 0.94  # measured 0.956 at 300 steps (600: 0.953-0.979)
    assert trained["threshold_tar"] >= 0.7 and trained["threshold_far"] <= 0.3  # a balanced operating point
    assert everything.num_pairs == 4950 and everything.baseline_accuracy == pytest.approx(4500 / 4950)
    # measured +0.062 at 300 steps (600: +0.060 to +0.069)
    assert everything.accuracy_mean >= everything.baseline_accuracy + 0.03
