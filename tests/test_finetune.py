"""Fine-tuning: `--init` starts the backbone from an earlier model with a fresh head; the head can train
alone on the frozen backbone first; the backbone can learn at a fraction of the head's rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from facetrain.checkpoint import load_full_head
from facetrain.interop import load_model
from facetrain.models import ModelConfig, build_backbone
from facetrain.models.backbone import stage_of
from facetrain.train.optim import OptimConfig, build_lr_scheduler, build_optimizer
from tests.support.train_helpers import run_cli, tiny_config, trained_tiny_run


def backbone_state(run: Path) -> dict[str, torch.Tensor]:
    backbone = load_model(run).module
    return backbone.state_dict()


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    return trained_tiny_run(tmp_path_factory.mktemp("earlier"), steps=3)


def test_head_only_steps_keep_the_initial_backbone_exactly(earlier_run, tmp_path):
    config = tiny_config(
        tmp_path, "finetune", data={"path": str(earlier_run / "synth")}, optim={"head_only_steps": 3}
    )
    result = run_cli("train", "-c", str(config), "--init", str(earlier_run / "run"), "--set", "train.steps=3")
    assert result.returncode == 0, result.stderr
    assert "initialised from" in result.stdout
    initial, tuned = backbone_state(earlier_run / "run"), backbone_state(tmp_path / "finetune")
    assert all(torch.equal(initial[key], tuned[key]) for key in initial)  # weights and BN statistics
    assert not torch.equal(load_full_head(earlier_run / "run"), load_full_head(tmp_path / "finetune"))


def test_after_the_head_only_steps_the_backbone_learns_from_the_initial_weights(earlier_run, tmp_path):
    config = tiny_config(tmp_path, "finetune", data={"path": str(earlier_run / "synth")})
    export = tmp_path / "export"
    assert (
        run_cli("export", str(earlier_run / "run"), "-o", str(export), "--formats", "safetensors").returncode
        == 0
    )
    result = run_cli(
        "train", "-c", str(config), "--init", str(export), "--set", "optim.head_only_steps=1",
        "--set", "train.steps=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    initial, tuned = backbone_state(earlier_run / "run"), backbone_state(tmp_path / "finetune")
    weights = [key for key in initial if initial[key].is_floating_point() and "running" not in key]
    assert any(not torch.equal(initial[key], tuned[key]) for key in weights)  # one step of learning...
    moved = torch.cat([(tuned[key] - initial[key]).flatten() for key in weights]).norm()
    assert moved <= 0.1 * torch.cat([initial[key].flatten() for key in weights]).norm()  # not a fresh start


def test_a_backbone_of_another_shape_is_one_line(earlier_run, tmp_path):
    config = tiny_config(tmp_path, "finetune", data={"path": str(earlier_run / "synth")})
    result = run_cli(
        "train", "-c", str(config), "--init", str(earlier_run / "run"), "--set", "model.embedding_size=16"
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.init: ") and "set model.backbone" in lines[0]
    missing = run_cli("train", "-c", str(config), "--init", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "model.init" in missing.stderr and "does not exist" in missing.stderr


def test_the_backbone_learns_at_its_own_scale_of_the_schedule():
    cfg = OptimConfig(lr=0.1, backbone_lr_scale=0.1, warmup_steps=2)
    backbone, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)
    optimizer = build_optimizer(cfg, backbone, head)
    schedule = build_lr_scheduler(optimizer, cfg, total_steps=10)
    backbone_lr, head_lr = (group["lr"] for group in optimizer.param_groups)
    assert (backbone_lr, head_lr) == pytest.approx((0.005, 0.05))  # warmup step 1 of 2
    optimizer.step()  # no gradients: changes nothing, keeps the optimizer-then-schedule order
    schedule.step()
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.01, 0.1])


def test_a_fine_tune_verifies_its_start_and_keeps_it_as_best_when_no_step_beats_it(earlier_run, tmp_path):
    """#42: the starting model's verification at step 0, beside the fine-tuned one. With the backbone
    frozen throughout (head_only_steps = steps) the embeddings never change, so no step beats the start
    and best/ must keep step 0's model."""
    pairs = str(earlier_run / "synth" / "heldout" / "pairs.txt")
    config = tiny_config(
        tmp_path, "finetune", data={"path": str(earlier_run / "synth")}, eval={"pairs": pairs, "every": 2},
        optim={"head_only_steps": 4}, train={"steps": 4}, checkpoint={"every": 100},
    )  # fmt: skip
    result = run_cli("train", "-c", str(config), "--init", str(earlier_run / "run"))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "finetune"
    verified = sorted(path.name for path in (run / "eval").glob("step_*.json"))
    assert verified[0] == "step_00000000.json" and len(verified) == 3  # the start, steps 2 and 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_step"] == 0
    start = json.loads((run / "eval" / "step_00000000.json").read_text())
    assert summary["best_accuracy"] == start["accuracy"] == summary["evaluation"]["accuracy"]
    assert (run / "checkpoints" / "best").read_text().strip() == "step_00000000"  # the pointer to best/
    assert json.loads((run / "checkpoints" / "step_00000000" / "meta.json").read_text())["step"] == 0
    assert "(the starting model, model.init: no step beat it, and best/ keeps it" in result.stdout


def test_best_min_gain_keeps_the_start_when_the_learning_steps_do_not_beat_it_by_that_much(
    earlier_run, tmp_path
):
    """#42: on a small validation set noise picks a step over the start; with eval.best_min_gain a step
    must beat the kept model by more than it. Here the backbone learns from step 2, and no step can
    beat the start by more than 0.99, so best/, the summary and the closing table all keep step 0."""
    pairs = str(earlier_run / "synth" / "heldout" / "pairs.txt")
    config = tiny_config(
        tmp_path, "finetune", data={"path": str(earlier_run / "synth")},
        eval={"pairs": pairs, "every": 2, "best_min_gain": 0.99}, optim={"head_only_steps": 1},
        train={"steps": 4}, checkpoint={"every": 100},
    )  # fmt: skip
    result = run_cli("train", "-c", str(config), "--init", str(earlier_run / "run"))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "finetune"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_step"] == 0 and summary["evaluation"]["best_step"] == 0
    assert (run / "checkpoints" / "best").read_text().strip() == "step_00000000"
    assert "no step beat it, and best/ keeps it" in result.stdout
    initial, tuned = backbone_state(earlier_run / "run"), backbone_state(run)
    assert any(not torch.equal(initial[key], tuned[key]) for key in initial)  # the last step did learn


def test_a_run_without_init_verifies_no_step_0(earlier_run, tmp_path):
    pairs = str(earlier_run / "synth" / "heldout" / "pairs.txt")
    config = tiny_config(
        tmp_path, "scratch", data={"path": str(earlier_run / "synth")}, eval={"pairs": pairs, "every": 2},
        train={"steps": 2},
    )  # fmt: skip
    assert run_cli("train", "-c", str(config)).returncode == 0
    assert [path.name for path in (tmp_path / "scratch" / "eval").glob("step_*.json")] == [
        "step_00000002.json"
    ]


FROZEN = {"freeze_stages": 2, "layer_decay": 0.7, "momentum": 0.9}


def test_frozen_stages_keep_the_initial_weights_and_statistics_while_the_later_ones_learn(
    earlier_run, tmp_path
):
    config = tiny_config(tmp_path, "finetune", data={"path": str(earlier_run / "synth")}, optim=FROZEN)
    result = run_cli("train", "-c", str(config), "--init", str(earlier_run / "run"), "--set", "train.steps=3")
    assert result.returncode == 0, result.stderr
    with torch.device("meta"):  # tiny_config's backbone, for the names of its stages
        stages = build_backbone(ModelConfig(backbone="small", embedding_size=32), (32, 32)).stages
    initial, tuned = backbone_state(earlier_run / "run"), backbone_state(tmp_path / "finetune")
    frozen = [key for key in initial if stage_of(key, stages) < FROZEN["freeze_stages"]]
    assert any("running_mean" in key for key in frozen) and any("weight" in key for key in frozen)
    assert all(torch.equal(initial[key], tuned[key]) for key in frozen)  # weights and BN statistics
    learning = [key for key in initial if key not in frozen and initial[key].is_floating_point()]
    assert sum(not torch.equal(initial[key], tuned[key]) for key in learning) > len(learning) // 2


def test_a_resume_that_changes_the_freeze_or_the_decay_is_refused_in_one_line(earlier_run, tmp_path):
    config = tiny_config(
        tmp_path, "frozen", data={"path": str(earlier_run / "synth")}, optim=FROZEN, train={"steps": 1}
    )
    assert run_cli("train", "-c", str(config)).returncode == 0
    for key, value in (("freeze_stages", "1"), ("layer_decay", "0.5")):
        result = run_cli(
            "train", "-c", str(config), "--resume", "auto", "--set", "train.steps=2",
            "--set", f"optim.{key}={value}",
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: optim.{key}: checkpoint "), lines
        assert f"resume with --set optim.{key}={FROZEN[key]}" in lines[0] and "--init" in lines[0]


def test_freezing_more_stages_than_the_backbone_has_is_one_line_naming_the_key(earlier_run, tmp_path):
    config = tiny_config(
        tmp_path, "frozen", data={"path": str(earlier_run / "synth")}, optim={"freeze_stages": 6}
    )
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: optim.freeze_stages: 6 is more than this backbone's 5 stages below its embedding layer "
        "(stem, stage1, stage2, stage3, squeeze); use at most 5"
    ]
