"""Resuming after a setting changed, and loading state that is not finite (#57, state and numbers).

A resume that changes what the checkpoint's weights mean (the margin, its parameters, sub-centers, the
frozen steps still to come) is one line naming the key and the checkpoint's value; one that changes only
how they are computed (precision) goes on and says so. A checkpoint whose margin state is NaN or of
another shape is one line, a missing one a warning. NaN weights from a checkpoint, an `--init` or a
teacher are one line naming the file and tensor, where they were a NaN loss blamed on the learning
rate. The real CLI on a 2-step AdaFace run (AdaFace keeps a running state in the head)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from facetrain.checkpoint import find_resume_point
from facetrain.checkpoint.storage import save_entries
from facetrain.errors import FacetrainError
from facetrain.models import build_backbone
from facetrain.train.data_checks import check_training_set
from facetrain.train.distillation import build_distillation
from facetrain.train.resume import check_resumed_settings, load_initial_backbone
from facetrain.train.run_config import load_config
from tests.support.fault_helpers import checkpoint_tensors, error_lines
from tests.support.train_helpers import run_cli, tiny_config

ADAFACE = {"margin": "adaface", "scale": 16.0, "margin_params": {}}
CHECKPOINT = Path("runs/x/checkpoints/step_00000002")
MEAN = "app.model.head.margin_state.batch_mean"


@pytest.fixture(scope="module")
def adaface_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("adaface")
    config = tiny_config(tmp, "run", head=ADAFACE, train={"steps": 2}, checkpoint={"every": 2})
    assert run_cli("train", "-c", str(config)).returncode == 0
    return tmp


def copied(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run and its config; the checkpoint to resume from."""
    shutil.copytree(run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(run), str(tmp_path)))
    return config, find_resume_point(tmp_path / "run")[0]


def rewrite(checkpoint: Path, change) -> None:
    """The checkpoint's tensors, changed in place by `change(tensors)`, written back as DCP writes them."""
    tensors = checkpoint_tensors(checkpoint)
    change(tensors)
    for path in [*checkpoint.glob("*.distcp"), checkpoint / ".metadata"]:
        path.unlink()
    save_entries(tensors, checkpoint)


def resume(config: Path, *settings: str):
    sets = [arg for setting in settings for arg in ("--set", setting)]
    return run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=3", *sets)


def test_raising_head_only_steps_on_resume_is_refused_naming_the_key(adaface_run, tmp_path):
    """Before: optim.head_only_steps=5 on a run at step 2 froze its trained backbone again, silently."""
    config, checkpoint = copied(adaface_run, tmp_path)
    result = resume(config, "optim.head_only_steps=5")
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"error: optim.head_only_steps: checkpoint {checkpoint} was trained with 0, this run sets 5; resume "
        f"with --set optim.head_only_steps=0, or start a new run from it with --init {checkpoint} to change it"
    ]


@pytest.mark.parametrize(
    "setting, key, was, now",
    [
        ("head.margin=arcface", "head.margin", "'adaface'", "'arcface'"),
        ("head.margin_params={h: 0.1}", "head.margin_params", "{}", "{'h': 0.1}"),
        ("head.sub_centers=2", "head.sub_centers", "1", "2"),
        ("optim.freeze_stages=1", "optim.freeze_stages", "0", "1"),
    ],
)
def test_a_resume_that_changes_what_the_weights_mean_is_refused_naming_the_key(setting, key, was, now):
    """The check every resume makes (`check_resumed_settings`): before, the margin and its parameters
    changed silently."""
    trained = load_config(None, [f"head.margin={ADAFACE['margin']}"])
    with pytest.raises(FacetrainError) as error:
        check_resumed_settings(
            trained, load_config(None, [f"head.margin={ADAFACE['margin']}", setting]), CHECKPOINT, 2
        )
    assert str(error.value) == (
        f"{key}: checkpoint {CHECKPOINT} was trained with {was}, this run sets {now}; resume with --set "
        f"{key}={was}, or start a new run from it with --init {CHECKPOINT} to change it"
    )
    same = [f"head.margin={ADAFACE['margin']}", "head.margin_params={m: 0.4}", "optim.head_only_steps=2"]
    assert check_resumed_settings(trained, load_config(None, same), CHECKPOINT, 2) == []


def test_head_only_steps_already_behind_the_checkpoint_may_change(finished_run, tmp_path):
    """A run at step 2 with optim.head_only_steps 0 or 1: no step still to come is frozen either way."""
    config, checkpoint = copied(finished_run, tmp_path)
    result = resume(config, "optim.head_only_steps=1", "train.precision=bf16")
    assert result.returncode == 0, result.stderr
    assert (
        f"note: resuming with train.precision 'fp32' -> 'bf16' (checkpoint {checkpoint.name}): the same "
        "weights, computed another way"
    ) in result.stdout


def test_a_margin_state_that_is_nan_or_of_another_shape_is_one_line(adaface_run, tmp_path):
    config, checkpoint = copied(adaface_run, tmp_path)
    rewrite(checkpoint, lambda tensors: tensors[MEAN].fill_(float("nan")))
    result = resume(config)
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"error: checkpoint {checkpoint}: 'head.margin_state.batch_mean' holds 1 NaN or infinite values of 1; "
        "it comes from a diverged run or is damaged: start a new run"
    ]
    rewrite(checkpoint, lambda tensors: tensors.update({MEAN: torch.zeros(3)}))
    result = resume(config)
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"error: checkpoint {checkpoint}: its head.margin_state.batch_mean has shape [3], where this run's "
        "margin keeps []; the checkpoint is damaged or was not written by facetrain: use another checkpoint"
    ]


def test_a_missing_margin_state_starts_from_its_initial_value_and_says_so(adaface_run, tmp_path):
    config, checkpoint = copied(adaface_run, tmp_path)
    rewrite(checkpoint, lambda tensors: tensors.pop(MEAN))
    result = resume(config)
    assert result.returncode == 0, result.stderr
    assert (
        f"warning: checkpoint {checkpoint} holds no head.margin_state.batch_mean, the margin's running state; "
        "it starts from its initial value, 20"
    ) in result.stdout + result.stderr


def test_nan_weights_from_a_checkpoint_an_init_or_a_teacher_are_one_line_naming_the_tensor(
    adaface_run, tmp_path
):
    """Before: each trained to a NaN loss at step 1, blamed on optim.lr, and named the poisoned
    checkpoint the last good one."""
    config, checkpoint = copied(adaface_run, tmp_path)
    key = next(
        k for k in checkpoint_tensors(checkpoint) if k.startswith("app.model.backbone.") and "weight" in k
    )
    name = key.removeprefix("app.model.")
    rewrite(checkpoint, lambda tensors: tensors[key].view(-1)[0].fill_(float("inf")))
    result = resume(config)
    assert result.returncode == 2, result.stderr
    [line] = error_lines(result.stderr)
    assert re.fullmatch(
        rf"error: checkpoint {checkpoint}: '{re.escape(name)}' holds 1 NaN or infinite values of \d+; it comes from "
        "a diverged run or is damaged: start a new run", line
    ), line  # fmt: skip
    backbone_name = name.removeprefix("backbone.")
    cfg = load_config(tmp_path / "run.yaml")
    with pytest.raises(FacetrainError) as error:
        load_initial_backbone(checkpoint, build_backbone(cfg.model, tuple(cfg.data.image_size)), "small")
    assert str(error.value).startswith(f"model.init: {checkpoint}: '{backbone_name}' holds 1 NaN or infinite")
    cfg.loss.teacher = str(checkpoint)
    with pytest.raises(FacetrainError) as error:
        build_distillation(cfg.loss, cfg.model.embedding_size, torch.device("cpu"))
    assert str(error.value).startswith(
        f"loss.teacher: {checkpoint}: '{backbone_name}' holds 1 NaN or infinite"
    )


def test_the_last_good_checkpoint_holds_finite_weights_whose_loss_was_finite(tmp_path):
    """optim.lr=1e30: the weights were 2.5e31 after step 1 and the loss NaN at step 2, and the checkpoint
    of step 1 was named the last good one."""
    config = tiny_config(tmp_path, "run", optim={"lr": 1e30, "grad_clip": None, "momentum": 0.0},
                         train={"steps": 8}, checkpoint={"every": 1, "keep": 10})  # fmt: skip
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 2, result.stderr
    [line] = error_lines(result.stderr)
    match = re.fullmatch(
        r"error: the (loss|weights) became (?:non-finite at|NaN or infinite by) step (\d+)(?:, so no checkpoint "
        r"of them was written)?; last good checkpoint: (\S+); lower optim.lr or use train.precision=fp32", line
    )  # fmt: skip
    assert match, line
    kind, step, good = match[1], int(match[2]), match[3]
    weights_of = step - 1 if kind == "loss" else step  # the loss of step k is the weights of step k - 1
    assert good == "none" or int(good.rsplit("_", 1)[1]) < weights_of
    for written in (tmp_path / "run" / "checkpoints").glob("step_*"):
        assert all(
            torch.isfinite(t).all() for t in checkpoint_tensors(written).values() if t.is_floating_point()
        )


class Folder:
    """A training set as the checks see it."""

    def __init__(self, labels: list[int], image=lambda index: torch.rand(3, 8, 8)):
        self.labels, self.image = np.asarray(labels), image
        self.num_classes = int(self.labels.max()) + 1
        self.class_names = [f"id{i}" for i in range(self.num_classes)]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.image(index), int(self.labels[index])


def test_a_set_of_one_identity_is_one_line_and_degenerate_sets_a_warning():
    with pytest.raises(FacetrainError) as error:
        check_training_set(Folder([0] * 8), "D")
    assert str(error.value) == (
        "data.path D holds 1 identity (id0); the margin-softmax head learns to tell identities apart, so it "
        "needs at least 2: add identity folders"
    )
    [one_image] = check_training_set(Folder(list(range(8))), "D")
    assert one_image.startswith("warning: every identity in data.path D has one image")
    [black] = check_training_set(Folder([0, 0, 1, 1], image=lambda index: torch.full((3, 8, 8), -1.0)), "D")
    assert black.startswith("warning: the 4 images sampled from data.path D are each one flat colour")
    assert check_training_set(Folder([0, 0, 1, 1]), "D") == []


def test_one_identity_stops_train_before_the_first_step(finished_run, tmp_path):
    synth = tmp_path / "one"
    shutil.copytree(finished_run / "synth" / "train" / "id00000", synth / "id00000")
    config = tiny_config(tmp_path, "run", data={"source": "folder", "path": str(synth)})
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr)[-1].startswith(f"error: data.path {synth} holds 1 identity (id00000)")


def test_a_trained_run_is_unaffected(finished_run):
    """The checks leave a run on a sane set alone: the fixture trained without a warning."""
    assert "warning" not in (finished_run / "run" / "train.log").read_text()
