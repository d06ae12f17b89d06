"""Fine-tuning: `--init` starts the backbone from an earlier model with a fresh head; the head can train
alone on the frozen backbone first; the backbone can learn at a fraction of the head's rate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from facetrain.checkpoint import load_backbone, load_full_head
from facetrain.train.optim import OptimConfig, build_lr_scheduler, build_optimizer
from tests.train_helpers import run_cli, tiny_config


def backbone_state(run: Path) -> dict[str, torch.Tensor]:
    backbone, _ = load_backbone(run)
    return backbone.state_dict()


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("earlier")
    result = run_cli("train", "-c", str(tiny_config(tmp, "run", train={"steps": 3})))
    assert result.returncode == 0, result.stderr
    return tmp


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
