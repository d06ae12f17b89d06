"""IResNet backbones: insightface's state-dict keys and shapes, and its forward against a plain reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from facetrain.models import BACKBONES, build_backbone
from facetrain.models.config import ModelConfig
from facetrain.models.iresnet import IRESNET_DEPTHS
from facetrain.parallel.pipeline_split import pipeline_units, split_backbone
from tests.support.small_models import calibrated

MANIFEST = Path(__file__).parent / "data" / "insightface_iresnet_keys.json"
SMALL = (32, 32)


pytestmark = pytest.mark.usefixtures("one_thread")


def reference_forward(state: dict[str, torch.Tensor], images: torch.Tensor, depths, training: bool):
    """insightface's IResNet forward written out with functional ops on the state dict.

    Block: BN, conv3x3, BN, PReLU, conv3x3 with the stride, BN, plus the shortcut (identity, or a strided
    1x1 conv and BN on the first block of each layer), with nothing after the sum. Output: BN, flatten,
    FC, BN.
    """
    state = {key: value.clone() for key, value in state.items()}

    def bn(x, prefix):
        return F.batch_norm(
            x,
            state[f"{prefix}.running_mean"],
            state[f"{prefix}.running_var"],
            state[f"{prefix}.weight"],
            state[f"{prefix}.bias"],
            training,
            0.1,
            1e-5,
        )

    x = F.prelu(bn(F.conv2d(images, state["conv1.weight"], padding=1), "bn1"), state["prelu.weight"])
    for layer, depth in enumerate(depths, start=1):
        for block in range(depth):
            p = f"layer{layer}.{block}"
            stride = 2 if block == 0 else 1
            out = F.conv2d(bn(x, f"{p}.bn1"), state[f"{p}.conv1.weight"], padding=1)
            out = F.prelu(bn(out, f"{p}.bn2"), state[f"{p}.prelu.weight"])
            out = bn(F.conv2d(out, state[f"{p}.conv2.weight"], stride=stride, padding=1), f"{p}.bn3")
            if block == 0:
                x = bn(F.conv2d(x, state[f"{p}.downsample.0.weight"], stride=2), f"{p}.downsample.1")
            x = out + x
    x = bn(x, "bn2").flatten(1)
    return bn(F.linear(x, state["fc.weight"], state["fc.bias"]), "features")


@pytest.mark.parametrize("name", ["iresnet50", "iresnet100"])
def test_state_dict_keys_and_shapes_equal_insightface_manifest(name):
    expected = json.loads(MANIFEST.read_text())["architectures"][name]
    backbone = build_backbone(ModelConfig(backbone=name))
    actual = {key: list(tensor.shape) for key, tensor in backbone.state_dict().items()}
    assert set(actual) == set(expected["keys"]), sorted(set(actual) ^ set(expected["keys"]))[:5]
    mismatched = [key for key, shape in expected["keys"].items() if actual[key] != shape]
    assert not mismatched, mismatched[:5]
    assert sum(p.numel() for p in backbone.parameters()) == expected["parameters"]


def test_every_depth_is_registered_with_insightface_block_counts():
    assert {"iresnet18", "iresnet34", "iresnet50", "iresnet100", "iresnet200"} <= set(BACKBONES.names())
    assert IRESNET_DEPTHS["iresnet100"] == (3, 13, 30, 3) and IRESNET_DEPTHS["iresnet200"] == (6, 26, 60, 6)
    backbone = build_backbone(ModelConfig(backbone="iresnet200", embedding_size=8), (16, 16))
    assert tuple(len(getattr(backbone, f"layer{i}")) for i in range(1, 5)) == IRESNET_DEPTHS["iresnet200"]
    top_level = [name for name, _ in backbone.named_children()]
    assert top_level == [
        "conv1", "bn1", "prelu", "layer1", "layer2", "layer3", "layer4",
        "bn2", "flatten", "dropout", "fc", "features",
    ]  # fmt: skip


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_forward_equals_the_plain_reference(training):
    torch.manual_seed(0)
    backbone = calibrated(build_backbone(ModelConfig(backbone="iresnet18", embedding_size=32), SMALL), SMALL)
    state = backbone.state_dict()
    images = torch.rand(4, 3, *SMALL) * 2 - 1
    backbone.train(training)
    with torch.no_grad():
        expected = reference_forward(state, images, IRESNET_DEPTHS["iresnet18"], training)
        actual = backbone(images)
    assert expected.abs().max() > 0.1  # realistic magnitudes, not a collapsed network
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_embedding_scale_is_fixed_at_one_and_untrained():
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="iresnet18", embedding_size=16), SMALL)
    assert not backbone.features.weight.requires_grad
    assert torch.equal(backbone.features.weight, torch.ones(16))
    optimizer = torch.optim.SGD(backbone.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    bias_before = backbone.features.bias.detach().clone()
    for _ in range(2):
        optimizer.zero_grad()
        backbone(torch.randn(4, 3, *SMALL)).square().mean().backward()
        optimizer.step()
    assert backbone.features.weight.grad is None
    assert torch.equal(backbone.features.weight, torch.ones(16))
    assert not torch.equal(backbone.features.bias, bias_before)


def test_fc_and_features_run_in_fp32_under_autocast():
    """insightface's fp16 flag covers the convolutions; its FC and embedding BN see `x.float()`."""
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="iresnet18", embedding_size=16), SMALL)
    dtypes = {}

    def record(name):
        def hook(module, inputs, output):
            dtypes[name] = (inputs[0].dtype, output.dtype)

        return hook

    for name in ("layer4", "fc", "features"):
        getattr(backbone, name).register_forward_hook(record(name))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = backbone(torch.randn(4, 3, *SMALL))
    assert dtypes["layer4"][1] == torch.bfloat16, "the convolutions run in reduced precision"
    assert dtypes["fc"] == (torch.bfloat16, torch.float32), "the FC upcasts its input and runs in fp32"
    assert dtypes["features"] == (torch.float32, torch.float32)
    assert embeddings.dtype == torch.float32
    embeddings.square().mean().backward()
    assert backbone.fc.weight.grad.dtype == torch.float32


def run_step(backbone: nn.Module, images: torch.Tensor):
    backbone.zero_grad()
    embeddings = backbone(images)
    embeddings.square().mean().backward()
    return embeddings.detach(), {
        name: p.grad.clone() for name, p in backbone.named_parameters() if p.requires_grad
    }


@pytest.mark.parametrize("option", ["activation_checkpointing", "channels_last"])
def test_checkpointing_and_channels_last_keep_outputs_and_gradients(option):
    torch.manual_seed(0)
    plain = build_backbone(ModelConfig(backbone="iresnet18", embedding_size=16), SMALL)
    switched = build_backbone(ModelConfig(backbone="iresnet18", embedding_size=16, **{option: True}), SMALL)
    switched.load_state_dict(plain.state_dict())
    assert all(
        getattr(switched, f"layer{i}").checkpointing == (option == "activation_checkpointing") for i in (1, 4)
    )
    images = torch.randn(4, 3, *SMALL)
    expected, expected_grads = run_step(plain, images)
    actual, grads = run_step(switched, images)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-3, atol=1e-4, msg=name)


def test_pipeline_stages_chain_to_the_whole_model_with_the_same_keys():
    torch.manual_seed(0)
    backbone = calibrated(build_backbone(ModelConfig(backbone="iresnet18", embedding_size=16), SMALL), SMALL)
    units = [unit.name for unit in pipeline_units(backbone)]
    assert units[:4] == ["conv1", "bn1", "prelu", "layer1.0"] and units[-5:] == [
        "bn2", "flatten", "dropout", "fc", "features"
    ]  # fmt: skip
    stages = split_backbone(backbone, [units.index("layer3.0")])
    keys = [key for stage in stages for key in stage.state_dict()]
    assert keys == list(backbone.state_dict())
    images = torch.rand(2, 3, *SMALL) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(stages[1](stages[0](images)), backbone(images), rtol=0, atol=0)


def test_initialisation_is_insightfaces():
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="iresnet18", embedding_size=16), SMALL)
    conv = backbone.layer3[1].conv1.weight
    assert abs(conv.std().item() - 0.1) < 0.005 and abs(conv.mean().item()) < 0.005
    norms = [m for m in backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in norms)
    assert all(torch.equal(m.bias, torch.zeros_like(m.bias)) for m in norms)
