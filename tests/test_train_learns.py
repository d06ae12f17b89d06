"""Training learns: verification on held-out identities ends well above the untrained network's.

Thresholds were set from measured runs (docs/training.md lists the figures) with a wide safety margin.
"""

from __future__ import annotations

import csv
import itertools
import json

import pytest
import torch

from facetrain.config import load_config
from facetrain.eval.pair_making import balanced_pair_set, write_pairs_csv
from facetrain.eval.verification import load_pairs, verify
from facetrain.export.loading import load_model
from facetrain.models import build_backbone
from tests.train_helpers import run_cli, tiny_config


def untrained_result(config_path, pairs_path):
    cfg = load_config(config_path)
    torch.manual_seed(cfg.train.seed)  # the trainer's initial weights
    backbone = build_backbone(cfg.model, tuple(cfg.data.image_size)).eval()
    return verify(load_pairs(pairs_path), backbone, tuple(cfg.data.image_size), progress=False)


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
        train={
            "steps": 150,
            "batch_size": 16,
            "log_every": 10,
            "checkpoint_every": 150,
            "deterministic": False,
        },
        eval={"pairs": str(tmp_path / "synth" / "heldout" / "pairs.txt")},
    )
    result = run_cli("train", "-c", str(config), "--nproc", "2", timeout=600)
    assert result.returncode == 0, result.stderr
    trained = trained_result(tmp_path / "run")
    untrained = untrained_result(config, tmp_path / "synth" / "heldout" / "pairs.txt")
    print(f"synthetic held-out: trained {trained['accuracy']:.3f} vs untrained {untrained.accuracy:.3f}")
    assert trained["accuracy"] >= untrained.accuracy + 0.10  # measured: 0.733 vs 0.503
    assert trained["accuracy"] >= 0.65


# Measured on the balanced ORL pairs (2-core CPU machine): accuracy 0.871 with the trainer of commit
# f1919ff (three runs alike; 0.866-0.882 over mismatched samples of seeds 0-5) and 0.900 with the
# refactored trainer; the margin below covers other machines' runs.
ORL_BALANCED_ACCURACY = 0.84


def write_orl_split(orl, tmp_path):
    """Train list: subjects s1-s30. Held out s31-s40 (100 images) scored two ways: balanced pairs (all
    450 matched pairs, 450 mismatched pairs sampled with seed 0, 10 stratified folds), the protocol
    reported, and all 4,950 pairs, 91% mismatched, kept beside it with its all-"different" baseline."""
    train_list = tmp_path / "orl_train.csv"
    with train_list.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        for subject in range(1, 31):
            for image in range(1, 11):
                writer.writerow([orl / f"s{subject}" / f"{image}.pgm", subject - 1])
    held_out = [(s, orl / f"s{s}" / f"{k}.pgm") for s in range(31, 41) for k in range(1, 11)]
    balanced = tmp_path / "orl_balanced_pairs.csv"
    subjects, paths = zip(*held_out)
    write_pairs_csv(balanced_pair_set(paths, subjects, "orl s31-s40", seed=0), balanced)
    all_pairs = tmp_path / "orl_all_pairs.csv"
    with all_pairs.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path1", "path2", "same"])
        for (s1, p1), (s2, p2) in itertools.combinations(held_out, 2):
            writer.writerow([p1, p2, int(s1 == s2)])
    return train_list, balanced, all_pairs


@pytest.mark.slow
def test_orl_real_faces(shared_data, tmp_path):
    """Trained on s1-s30, verified on held-out s31-s40; the thresholds below sit under measured runs
    (2 ranks, 600 steps, ~50 s each), quoted in the comments."""
    train_list, balanced, all_pairs = write_orl_split(shared_data / "orl", tmp_path)
    augment = {
        "horizontal_flip": True,
        "random_resized_crop": True,
        "crop_scale": [0.8, 1.0],
        "color_jitter": 0.2,
    }
    config = tiny_config(
        tmp_path,
        "orl",
        data={"source": "list", "path": str(train_list), "image_size": [64, 56], "augment": augment},
        model={"backbone": "small", "embedding_size": 64},
        head={"margin": "cosface", "scale": 30.0, "margin_params": {"m": 0.2}},
        optim={"lr": 0.1, "schedule": "polynomial", "warmup_steps": 30},
        train={
            "steps": 600,
            "batch_size": 16,
            "log_every": 50,
            "checkpoint_every": 600,
            "deterministic": False,
        },
        eval={"pairs": str(balanced)},
    )
    result = run_cli("train", "-c", str(config), "--nproc", "2", timeout=900)
    assert result.returncode == 0, result.stderr
    trained = trained_result(tmp_path / "orl")
    untrained = untrained_result(config, balanced)
    model = load_model(tmp_path / "orl")
    everything = verify(load_pairs(all_pairs), model.module, model.image_size, progress=False).metrics
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
    assert trained["accuracy"] >= untrained.accuracy + 0.04  # measured: 0.871 / 0.900 vs 0.79
    assert trained["auc"] >= max(0.91, untrained.metrics.auc + 0.03)  # measured: 0.943 / 0.958 vs 0.88
    # measured: threshold 0.470 at FAR 0.064, TAR 0.809 / 0.392 at FAR 0.087, TAR 0.891 (at f1919ff the
    # accuracy-best threshold on all pairs, used before, sat at 0.651: TAR 0.673, a third of genuine
    # pairs called "different")
    assert trained["threshold_tar"] >= 0.7 and trained["threshold_far"] <= 0.2
    assert everything.num_pairs == 4950 and everything.baseline_accuracy == pytest.approx(4500 / 4950)
    assert everything.accuracy_mean >= everything.baseline_accuracy + 0.03  # measured: 0.964 vs 0.909
