"""optim.freeze_stages and optim.layer_decay as parameter groups: frozen stages never change (weights,
momentum or not, and batch-norm statistics), the others learn at a rate that decays with depth, and the
schedule scales every group alike. The CLI side (checkpointed, resumed, refused when changed) is in
tests/test_finetune.py and tests/test_resume_exact.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.models import ModelConfig, build_backbone
from facetrain.models.backbone import stage_of
from facetrain.parallel.pipeline_split import pipeline_units, split_backbone
from facetrain.train.optim import OptimConfig, build_lr_scheduler, build_optimizer, head_learning_rate
from facetrain.train.run_config import load_config
from facetrain.train.stage_groups import check_freeze_stages, set_train_mode

REPO = Path(__file__).resolve().parents[1]


def small_backbone() -> nn.Module:
    torch.manual_seed(0)
    return build_backbone(ModelConfig(backbone="small", embedding_size=16), (32, 32))


def test_stage_k_learns_at_the_decayed_rate_and_the_schedule_scales_every_group_alike():
    backbone, head = small_backbone(), nn.Linear(16, 5)
    cfg = OptimConfig(lr=0.1, freeze_stages=1, layer_decay=0.5, schedule="cosine", warmup_steps=2)
    optimizer = build_optimizer(cfg, backbone, head)
    below = len(backbone.stages) - 1  # small: stem, stage1..3, squeeze below the embedding layer
    expected = {"backbone": 0.1, "backbone.frozen": 0.0, "head": 0.1}
    expected |= {f"backbone.{backbone.stages[k][0]}": 0.1 * 0.5 ** (below - k) for k in range(1, below)}
    initial = {group["name"]: group["initial_lr"] for group in optimizer.param_groups}
    assert initial == pytest.approx(expected)
    assert optimizer.param_groups[0]["name"] == "backbone"  # the full rate the trainer logs

    schedule = build_lr_scheduler(optimizer, cfg, total_steps=8)
    factors = []
    for _ in range(8):
        lrs = {group["name"]: group["lr"] for group in optimizer.param_groups}
        factor = lrs["head"] / 0.1
        assert lrs == pytest.approx({name: lr * factor for name, lr in expected.items()})
        assert head_learning_rate(optimizer) == lrs["head"]  # what a fused head optimizer is handed
        factors.append(factor)
        optimizer.step()
        schedule.step()
    assert factors[0] == pytest.approx(0.5) and factors[1] == pytest.approx(1.0)  # warmup, then cosine
    assert factors[-1] < factors[2]


def test_every_parameter_is_in_one_group_and_without_the_settings_the_backbone_is_one_group():
    backbone = small_backbone()
    plain = build_optimizer(OptimConfig(), backbone, None)
    assert [group["name"] for group in plain.param_groups] == ["backbone"]
    staged = build_optimizer(OptimConfig(freeze_stages=2, layer_decay=0.8), backbone, None)
    grouped = [param for group in staged.param_groups for param in group["params"]]
    assert len(grouped) == len(set(grouped)) == len(list(backbone.parameters()))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_frozen_stages_keep_their_weights_and_statistics_while_the_rest_learns(name):
    backbone, head = small_backbone(), nn.Linear(16, 5)
    frozen_count = 2
    cfg = OptimConfig(name=name, lr=0.1, weight_decay=0.01, freeze_stages=frozen_count, layer_decay=0.7)
    optimizer = build_optimizer(cfg, backbone, head)
    before = {key: value.clone() for key, value in backbone.state_dict().items()}
    for _ in range(3):
        set_train_mode(backbone, True)
        images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 5, (8,))
        loss = nn.functional.cross_entropy(head(backbone(images)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = backbone.state_dict()
    frozen = {key for key in before if stage_of(key, backbone.stages) < frozen_count}
    assert any("running_mean" in key for key in frozen) and any(key.endswith("weight") for key in frozen)
    for key in frozen:  # weights, and batch-norm statistics too: those layers stayed in eval mode
        assert torch.equal(before[key], after[key]), key
    for key in ("stage2.conv.0.weight", "stage3.conv.1.running_mean", "output.fc.weight"):
        assert not torch.equal(before[key], after[key]), key
    assert all(not param.requires_grad for key, param in backbone.named_parameters() if key in frozen)
    assert backbone.training and not backbone.stem.conv[1].training and backbone.stage2.conv[1].training


def test_more_frozen_stages_than_lie_below_the_embedding_layer_is_one_line_naming_the_key():
    with pytest.raises(FacetrainError) as error:
        build_optimizer(OptimConfig(freeze_stages=6), small_backbone(), None)
    message = str(error.value)
    assert "\n" not in message and message.startswith("optim.freeze_stages: 6 is more than")
    assert "use at most 5" in message


def test_each_shipped_config_freezes_no_more_stages_than_its_backbone_has():
    configs = [load_config(path) for path in sorted((REPO / "configs").glob("*.yaml"))]
    freezing = [cfg for cfg in configs if cfg.optim.freeze_stages or cfg.optim.layer_decay != 1]
    assert freezing  # configs/finetune_dlib_frozen.yaml at least
    for cfg in freezing:
        with torch.device("meta"):
            backbone = build_backbone(cfg.model, tuple(cfg.data.image_size))
        check_freeze_stages(cfg.optim.freeze_stages, backbone.stages)


def test_pipeline_stages_cut_through_a_stage_get_the_rates_of_the_whole_backbones_stages():
    backbone = small_backbone()
    units = [unit.name for unit in pipeline_units(backbone)]
    cuts = [units.index("stage2.conv"), units.index("output.fc")]  # inside stage2 and the output
    parts = split_backbone(backbone, cuts)
    cfg = OptimConfig(lr=0.1, layer_decay=0.5)
    whole = {id(param): group["lr"] for group in build_optimizer(cfg, backbone, None).param_groups
             for param in group["params"]}  # fmt: skip
    seen = []
    for part in parts:
        for group in build_optimizer(cfg, part, None, stages=backbone.stages).param_groups:
            assert all(whole[id(param)] == group["lr"] for param in group["params"]), group["name"]
            seen += [id(param) for param in group["params"]]
    assert sorted(seen) == sorted(whole)
