"""MobileFaceNet `mbf`: insightface's state-dict keys and shapes, its forward against a plain reference,
its fp16 split, and `facetrain import insightface --arch mbf`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from facetrain.errors import FacetrainError
from facetrain.interop.insightface_import import import_insightface
from facetrain.interop.loading import load_model
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from tests.support.small_models import calibrated

MANIFEST = Path(__file__).parent / "data" / "insightface_mbf_keys.json"
SMALL = (32, 32)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_state_dict_keys_and_shapes_equal_insightface_manifest():
    expected = json.loads(MANIFEST.read_text())["architectures"]["mbf"]
    backbone = build_backbone(ModelConfig(backbone="mbf"))
    actual = {key: list(tensor.shape) for key, tensor in backbone.state_dict().items()}
    assert list(actual) == list(expected["keys"])  # the same keys in the same order
    mismatched = [key for key, shape in expected["keys"].items() if actual[key] != shape]
    assert not mismatched, mismatched[:5]
    assert sum(p.numel() for p in backbone.parameters()) == expected["parameters"]


def reference_forward(state: dict[str, torch.Tensor], images: torch.Tensor, training: bool) -> torch.Tensor:
    """insightface's MobileFaceNet written out with functional ops on the state dict."""
    state = {key: value.clone() for key, value in state.items()}

    def bn(x, prefix):
        return F.batch_norm(
            x, state[f"{prefix}.running_mean"], state[f"{prefix}.running_var"], state[f"{prefix}.weight"],
            state[f"{prefix}.bias"], training, 0.1, 1e-5,
        )  # fmt: skip

    def conv(x, prefix, stride=1, groups=1, act=True):
        weight = state[f"{prefix}.layers.0.weight"]
        x = bn(
            F.conv2d(x, weight, stride=stride, padding=weight.shape[-1] // 2, groups=groups),
            f"{prefix}.layers.1",
        )
        return F.prelu(x, state[f"{prefix}.layers.2.weight"]) if act else x

    def depthwise(x, prefix, stride, residual):
        groups = state[f"{prefix}.layers.1.layers.0.weight"].shape[0]
        out = conv(x, f"{prefix}.layers.0")
        out = conv(out, f"{prefix}.layers.1", stride, groups)
        out = conv(out, f"{prefix}.layers.2", act=False)
        return x + out if residual else out

    x = conv(images, "layers.0", stride=2)
    x = conv(x, "layers.1", groups=64)
    for index, count in ((2, None), (3, 4), (4, None), (5, 6), (6, None), (7, 2)):
        if count is None:
            x = depthwise(x, f"layers.{index}", 2, False)
        for block in range(count or 0):
            x = depthwise(x, f"layers.{index}.layers.{block}", 1, True)
    x = conv(x, "conv_sep")
    x = bn(F.conv2d(x, state["features.layers.0.layers.0.weight"], groups=512), "features.layers.0.layers.1")
    x = F.linear(x.flatten(1), state["features.layers.2.weight"])
    return bn(x, "features.layers.3")


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_forward_equals_the_plain_reference(training):
    torch.manual_seed(0)
    backbone = calibrated(build_backbone(ModelConfig(backbone="mbf", embedding_size=16), SMALL), SMALL)
    images = torch.rand(4, 3, *SMALL) * 2 - 1
    backbone.train(training)
    with torch.no_grad():
        expected = reference_forward(backbone.state_dict(), images, training)
        actual = backbone(images)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_conv_sep_and_gdc_run_in_fp32_under_autocast():
    """insightface's fp16 covers the bottlenecks; conv_sep and the GDC see `x.float()`."""
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="mbf", embedding_size=16), SMALL)
    dtypes = {}
    for name in ("layers", "conv_sep", "features"):
        getattr(backbone, name).register_forward_hook(
            lambda module, inputs, output, name=name: dtypes.__setitem__(name, output.dtype)
        )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = backbone(torch.randn(2, 3, *SMALL))
    assert dtypes == {"layers": torch.bfloat16, "conv_sep": torch.float32, "features": torch.float32}
    embeddings.square().mean().backward()


@pytest.fixture(scope="module")
def mbf_pth(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A 112x112 mbf with moved weights, saved as insightface saves backbone.pth."""
    torch.manual_seed(1)
    backbone = calibrated(build_backbone(ModelConfig(backbone="mbf", embedding_size=64)), (112, 112))
    path = tmp_path_factory.mktemp("mbf") / "backbone.pth"
    torch.save(backbone.state_dict(), path)
    return backbone, path


@pytest.mark.parametrize("architecture", ["mbf", None], ids=["arch", "inferred"])
def test_import_insightface_mbf(mbf_pth, architecture, tmp_path):
    backbone, path = mbf_pth
    result = import_insightface(path, architecture, tmp_path / "out", progress=False)
    assert (result.architecture, result.embedding_size) == ("mbf", 64)
    loaded = load_model(tmp_path / "out")
    images = torch.rand(2, 3, 112, 112) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(loaded.module(images), backbone(images), rtol=0, atol=0)


def test_an_mbf_file_imported_as_an_iresnet_says_pass_arch_mbf(mbf_pth, tmp_path):
    with pytest.raises(FacetrainError, match="its keys are MobileFaceNet's: pass --arch mbf"):
        import_insightface(mbf_pth[1], "iresnet50", tmp_path / "out", progress=False)
