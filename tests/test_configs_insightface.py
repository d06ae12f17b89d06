"""The large-scale configs reproduce insightface arcface_torch's recipes (configs/ms1mv3_r100.py,
glint360k_r100.py, ms1mv3_mbf.py over base.py), each value checked against the recipe here."""

from __future__ import annotations

from pathlib import Path

import pytest

from facetrain.config.validate import field_problems
from facetrain.heads.margins import build_margin
from facetrain.models import BACKBONES
from facetrain.train.run_config import load_config

REPO = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 8 * 128  # insightface's recipes are for 8 GPUs x 128
VALIDATION = ["lfw.bin", "cfp_fp.bin", "agedb_30.bin"]

# insightface's values: network, margin, m, weight decay, images, epochs (lr 0.1, momentum 0.9, scale 64,
# sample_rate 1.0, polynomial power 2, no warmup, clip 5, seed 2048 and validation every 2000 in all three)
RECIPES = {
    "ms1mv3_r100.yaml": ("iresnet100", "arcface", 0.5, 5e-4, 5_179_510, 20),
    "glint360k_r100.yaml": ("iresnet100", "cosface", 0.4, 1e-4, 17_091_657, 20),
    "ms1mv3_mbf.yaml": ("mbf", "arcface", 0.5, 1e-4, 5_179_510, 40),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_config_is_insightfaces_recipe(name: str):
    backbone, margin, m, weight_decay, images, epochs = RECIPES[name]
    path = REPO / "configs" / name
    text = path.read_text()
    insightface_file = f"recognition/arcface_torch/configs/{name.replace('.yaml', '.py')}"
    assert f"Mirrors insightface {insightface_file}" in " ".join(text.split()), "the comment names its recipe"
    assert "Deliberate differences:" in text
    cfg = load_config(path)
    assert cfg.model.backbone == backbone and cfg.model.embedding_size == 512 and cfg.model.dropout == 0
    assert (cfg.head.margin, cfg.head.margin_params, cfg.head.scale) == (margin, {"m": m}, 64.0)
    assert cfg.head.sample_rate == 1.0 and cfg.head.sub_centers == 1
    optim = cfg.optim
    assert (optim.name, optim.lr, optim.momentum, optim.weight_decay) == ("sgd", 0.1, 0.9, weight_decay)
    assert optim.head_weight_decay is None, "insightface decays the head's weight like the backbone's"
    assert (optim.schedule, optim.power, optim.warmup_steps, optim.grad_clip) == ("polynomial", 2.0, 0, 5.0)
    assert cfg.train.batch_size * 8 == GLOBAL_BATCH and cfg.train.seed == 2048
    assert cfg.train.steps == images // GLOBAL_BATCH * epochs, "epochs -> steps as insightface's total_step"
    assert [Path(pairs).name for pairs in cfg.eval.pairs] == VALIDATION and cfg.eval.every == 2000
    assert cfg.eval.best_by == "cfp_fp" and cfg.eval.flip
    assert cfg.data.source == "recordio" and cfg.data.augment.horizontal_flip
    assert not cfg.data.augment.random_resized_crop and cfg.data.augment.color_jitter == 0
    assert cfg.train.precision == "bf16"  # the documented difference: insightface's fp16 + loss scaler
    build_margin(cfg.head.margin, **cfg.head.margin_params)
    if backbone not in BACKBONES:
        pytest.skip(
            f"backbone {backbone!r} is not registered in this tree (the mbf backbone lands separately)"
        )
    assert list(field_problems(cfg)) == []
