"""The re-id output's transfer options: generalised-mean pooling (`model.pooling: gem`) and IBN-a
(`model.ibn`), each against the formula written out here, where they sit in the backbones, the errors
for backbones without a pooled output, and a run that trains, resumes and exports with both."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from facetrain.errors import FacetrainError
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.models.gem import GeneralizedMeanPooling
from facetrain.models.ibn import InstanceBatchNorm2d
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from tests.support.reid_helpers import reid_config, write_cuhk03_style
from tests.support.train_helpers import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")


def test_gem_is_the_power_mean_of_each_channel_and_learns_its_power():
    torch.manual_seed(0)
    x = torch.rand(3, 5, 4, 2, dtype=torch.float64) + 0.1
    pool = GeneralizedMeanPooling().double()
    pooled = pool(x)
    expected = torch.stack(
        [torch.stack([(x[b, c] ** 3).mean() ** (1 / 3) for c in range(5)]) for b in range(3)]
    )
    assert pooled.shape == (3, 5, 1, 1)
    assert torch.allclose(pooled.flatten(1), expected, rtol=0, atol=1e-12)
    pooled.sum().backward()
    assert pool.power.grad is not None and float(pool.power.grad) != 0.0

    with torch.no_grad():
        pool.power.fill_(1.0)
    assert torch.allclose(pool(x), x.mean(dim=(-2, -1), keepdim=True), rtol=0, atol=1e-12)
    with torch.no_grad():
        pool.power.fill_(200.0)
    assert torch.allclose(pool(x), x.amax(dim=(-2, -1), keepdim=True), rtol=0.02)


def test_gem_clamps_negative_activations_and_keeps_bf16_inputs_bf16():
    pool = GeneralizedMeanPooling()
    x = torch.tensor([[[[-4.0, 2.0], [2.0, -1.0]]]])
    # the negatives count as eps, not as their value: (2 * 8 / 4) ** (1/3)
    assert float(pool(x).detach()) == pytest.approx((16 / 4) ** (1 / 3), rel=1e-5)
    maps = torch.rand(2, 8, 6, 4) + 0.5
    half = pool(maps.bfloat16())
    assert half.dtype == torch.bfloat16
    assert torch.allclose(half.float(), pool(maps), rtol=1e-2)


@pytest.mark.parametrize("training", [True, False])
def test_ibn_is_instance_norm_on_the_first_half_and_batch_norm_on_the_rest(training: bool):
    torch.manual_seed(0)
    layer = InstanceBatchNorm2d(6).double().train(training)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.uniform_(0.5, 1.5)
    layer.batch.running_mean.uniform_(-0.2, 0.2)
    running_mean, running_var = layer.batch.running_mean.clone(), layer.batch.running_var.clone()
    x = torch.randn(4, 6, 5, 3, dtype=torch.float64) * 3 + 1
    got = layer(x)
    first = F.instance_norm(x[:, :3], weight=layer.instance.weight, bias=layer.instance.bias, eps=1e-5)
    rest = F.batch_norm(
        x[:, 3:], running_mean, running_var, layer.batch.weight, layer.batch.bias, training, 0.1, 1e-5
    )
    assert layer.instance_channels == 3
    assert torch.allclose(got, torch.cat([first, rest], dim=1), rtol=0, atol=1e-12)
    assert torch.equal(layer.batch.running_mean, running_mean)  # updated alike in training, kept in eval
    # the instance half of one image does not depend on the others in its batch, even in training
    alone = layer(x[:1])
    assert torch.allclose(alone[:, :3], got[:1, :3], rtol=0, atol=1e-12)


def test_ibn_sits_in_the_first_norm_of_every_stage_but_the_last():
    small = build_backbone(ModelConfig(backbone="small_pooled", embedding_size=24, ibn=True), (32, 16))
    placed = {name for name, module in small.named_modules() if isinstance(module, InstanceBatchNorm2d)}
    assert placed == {"stage1.down.1", "stage2.down.1"}
    resnet = build_backbone(ModelConfig(backbone="reid_r50", embedding_size=24, ibn=True), (64, 32))
    placed = {name for name, module in resnet.named_modules() if isinstance(module, InstanceBatchNorm2d)}
    assert placed == {
        f"layer{layer}.{block}.bn1" for layer, blocks in ((1, 3), (2, 4), (3, 6)) for block in range(blocks)
    }
    plain = build_backbone(ModelConfig(backbone="small_pooled", embedding_size=24), (32, 16))
    assert not any(isinstance(module, InstanceBatchNorm2d) for module in plain.modules())
    assert isinstance(plain.output.pool, torch.nn.AdaptiveAvgPool2d)


def test_gem_replaces_the_average_and_is_a_checkpointed_parameter():
    backbone = build_backbone(
        ModelConfig(backbone="small_pooled", embedding_size=24, pooling="gem"), (32, 16)
    )
    assert isinstance(backbone.output.pool, GeneralizedMeanPooling)
    assert float(backbone.state_dict()["output.pool.power"]) == 3.0
    images = torch.rand(4, 3, 32, 16)
    backbone.eval()
    embeddings = backbone(images)
    pooled = backbone.output.pool(backbone.stage3(backbone.stage2(backbone.stage1(backbone.stem(images)))))
    assert torch.allclose(
        embeddings, backbone.output.neck(backbone.output.reduce(pooled.flatten(1))), atol=1e-6
    )


def test_pooling_and_ibn_need_a_pooled_output_and_a_known_pooling():
    with pytest.raises(ValueError, match="pooling=gem needs a backbone with a pooled output, not small"):
        build_backbone(ModelConfig(backbone="small", embedding_size=24, pooling="gem"), (32, 32))
    with pytest.raises(ValueError, match="ibn=True needs a backbone with a pooled output, not r18"):
        build_backbone(ModelConfig(backbone="r18", embedding_size=24, ibn=True), (32, 32))
    with pytest.raises(
        FacetrainError, match="model.pooling = 'gem': needs a backbone with a pooled re-id output"
    ):
        validate(Config(model=ModelConfig(backbone="small", pooling="gem")))
    with pytest.raises(FacetrainError, match="model.ibn = True: needs a backbone with a pooled re-id output"):
        validate(Config(model=ModelConfig(backbone="small", ibn=True)))
    with pytest.raises(FacetrainError, match="pooling"):
        build_backbone(ModelConfig(backbone="small_pooled", pooling="max"), (32, 16))


def test_a_run_with_gem_and_ibn_trains_resumes_and_exports(tmp_path: Path):
    folder = write_cuhk03_style(tmp_path / "train", range(8), size=(32, 16))
    model = {"pooling": "gem", "ibn": True}
    config = reid_config(tmp_path, folder, steps=4, data={"images_per_identity": 2}, model=model,
                         train={"batch_size": 8}, checkpoint={"every": 2})  # fmt: skip
    trained = run_cli("train", "-c", str(config), "--set", "train.steps=2")
    assert trained.returncode == 0, trained.stderr
    resumed = run_cli("train", "-c", str(config), "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert "step 2" in resumed.stdout + resumed.stderr
    out = tmp_path / "export"
    exported = run_cli(
        "export", str(tmp_path / "run"), "-o", str(out), "--formats", "safetensors,onnx", "--quiet"
    )
    assert exported.returncode == 0, exported.stderr
    assert "instance_norm" not in exported.stderr  # the exporter's misleading train-mode warning is not shown
    assert (out / "model.onnx").stat().st_size > 0
    weights = load_file(out / "model.safetensors")
    assert weights["output.pool.power"].item() != 3.0  # the power trained, and travels with the weights
    assert "stage1.down.1.instance.weight" in weights
