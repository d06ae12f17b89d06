"""Backbones: shapes, options (checkpointing, channels_last, dropout), depths and sizes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.models import BACKBONES, build_backbone
from facetrain.models.config import ModelConfig
from facetrain.models.face_resnet import DEPTHS

SMALL_SIZES = {"reid_r50": (64, 32), "dlib_resnet": (131, 131)}  # dlib_resnet: its smallest input


pytestmark = pytest.mark.usefixtures("one_thread")


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", BACKBONES.names())
def test_every_backbone_maps_images_to_embeddings(name):
    torch.manual_seed(0)
    size = SMALL_SIZES.get(name, (32, 32))
    backbone = build_backbone(ModelConfig(backbone=name, embedding_size=24), size)
    assert backbone.embedding_size == 24
    assert backbone.input_size == size
    embeddings = backbone(torch.randn(3, 3, *size))
    assert embeddings.shape == (3, 24)
    assert torch.isfinite(embeddings).all()
    embeddings.square().mean().backward()
    trainable = [p for p in backbone.parameters() if p.requires_grad]
    assert all(p.grad is not None for p in trainable)


def test_default_input_sizes_follow_the_task():
    assert build_backbone(ModelConfig(backbone="small")).input_size == (112, 112)
    assert build_backbone(ModelConfig(backbone="reid_r50")).input_size == (256, 128)


def test_face_resnet_output_is_bn_dropout_fc_bn_over_the_flattened_7x7_map():
    backbone = build_backbone(ModelConfig(backbone="r18", embedding_size=32, dropout=0.2))
    layers = list(backbone.output.children())
    kinds = [nn.BatchNorm2d, nn.Dropout, nn.Flatten, nn.Linear, nn.BatchNorm1d]
    assert len(layers) == len(kinds) and all(isinstance(layer, kind) for layer, kind in zip(layers, kinds))
    assert layers[1].p == 0.2
    assert layers[3].in_features == 512 * 7 * 7 and layers[3].out_features == 32
    stem_conv = backbone.stem.conv
    assert stem_conv.kernel_size == (3, 3) and stem_conv.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in backbone.modules())


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="small", embedding_size=16, dropout=0.5), (32, 32))
    images = torch.randn(4, 3, 32, 32)
    assert not torch.allclose(backbone(images), backbone(images))
    backbone.eval()
    torch.testing.assert_close(backbone(images), backbone(images))


@pytest.mark.parametrize("name", ["r50", "r100"])
def test_face_resnet_depths_count_basic_blocks(name):
    backbone = build_backbone(ModelConfig(backbone=name, embedding_size=8), (16, 16))
    depths = tuple(len(getattr(backbone, f"layer{i}")) for i in range(1, 5))
    assert depths == DEPTHS[name]
    assert DEPTHS["r100"] == (3, 13, 30, 3)


def test_parameter_counts_are_in_the_expected_ranges():
    with torch.device("meta"):  # the shapes alone, the same counts: iresnet200's 100M+ weights not drawn
        counts = {
            name: parameter_count(build_backbone(ModelConfig(backbone=name))) for name in BACKBONES.names()
        }
    assert counts["r18"] < counts["r34"] < counts["r50"] < counts["r100"]
    assert 40e6 < counts["r50"] < 47e6  # IResNet-50 has 43.6M
    assert 60e6 < counts["r100"] < 70e6  # IResNet-100 has 65.2M
    assert 20e6 < counts["reid_r50"] < 30e6  # torchvision ResNet-50 without its 1000-way FC
    assert 0.5e6 < counts["small"] < 2e6
    assert counts["small_pooled"] < counts["small"] < counts["small_wide"] < 4e6


def run_step(backbone: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    backbone.zero_grad()
    embeddings = backbone(images)
    embeddings.square().mean().backward()
    return embeddings.detach(), {name: p.grad.clone() for name, p in backbone.named_parameters()}


def saved_bytes(backbone: nn.Module, images: torch.Tensor) -> int:
    """Bytes autograd keeps for backward: what activation checkpointing is meant to reduce."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        backbone(images).sum()
    return total


def test_activation_checkpointing_keeps_outputs_and_gradients_and_saves_memory():
    torch.manual_seed(0)
    plain = build_backbone(ModelConfig(backbone="r18", embedding_size=16), (32, 32))
    checkpointed = build_backbone(
        ModelConfig(backbone="r18", embedding_size=16, activation_checkpointing=True), (32, 32)
    )
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(4, 3, 32, 32)
    expected, expected_grads = run_step(plain, images)
    actual, grads = run_step(checkpointed, images)
    torch.testing.assert_close(actual, expected)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=name)
    assert saved_bytes(checkpointed, images) < 0.5 * saved_bytes(plain, images)


@pytest.mark.parametrize("name", ["small", "r18"])
def test_channels_last_gives_the_same_embeddings_and_gradients(name):
    torch.manual_seed(0)
    plain = build_backbone(ModelConfig(backbone=name, embedding_size=16), (32, 32))
    nhwc = build_backbone(ModelConfig(backbone=name, embedding_size=16, channels_last=True), (32, 32))
    nhwc.load_state_dict(plain.state_dict())
    assert all(
        m.weight.is_contiguous(memory_format=torch.channels_last)
        for m in nhwc.modules()
        if isinstance(m, nn.Conv2d) and m.weight.shape[-1] > 1
    )
    images = torch.randn(4, 3, 32, 32)
    expected, expected_grads = run_step(plain, images)
    actual, grads = run_step(nhwc, images)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    for param_name, grad in expected_grads.items():
        torch.testing.assert_close(grads[param_name], grad, rtol=1e-3, atol=1e-4, msg=param_name)


def test_small_backbone_learns_to_tell_identities_apart():
    """A few identities, each a fixed random face-sized pattern under noise, become separable."""
    torch.manual_seed(0)
    identities, size = 6, (32, 32)
    prototypes = torch.randn(identities, 3, *size)
    backbone = build_backbone(ModelConfig(backbone="small", embedding_size=32), size)
    classifier = nn.Linear(32, identities)
    optimizer = torch.optim.SGD([*backbone.parameters(), *classifier.parameters()], lr=0.05, momentum=0.9)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(identities).repeat(4)
        return prototypes[labels] + 1.5 * torch.randn(len(labels), 3, *size), labels

    def accuracy() -> float:
        backbone.eval()
        with torch.no_grad():
            images, labels = batch()
            correct = (classifier(backbone(images)).argmax(1) == labels).float().mean().item()
        backbone.train()
        return correct

    before = accuracy()
    for _ in range(30):
        images, labels = batch()
        loss = nn.functional.cross_entropy(classifier(backbone(images)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert accuracy() >= max(0.9, before + 0.3)


def test_parameter_names_are_stable_for_checkpoints():
    keys = build_backbone(ModelConfig(backbone="r18", embedding_size=8), (16, 16)).state_dict().keys()
    assert {"stem.conv.weight", "layer1.0.conv1.weight", "layer4.1.bn2.weight", "output.fc.weight"} <= set(
        keys
    )


def test_bad_model_settings_are_one_line_errors():
    with pytest.raises(FacetrainError, match="unknown backbone 'r999'"):
        build_backbone(ModelConfig(backbone="r999"))
    with pytest.raises(FacetrainError, match="embedding_size"):
        build_backbone(ModelConfig(backbone="small", embedding_size=0))
    with pytest.raises(FacetrainError, match="dropout"):
        build_backbone(ModelConfig(backbone="small", dropout=1.5))
