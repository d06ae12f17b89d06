"""`facetrain import insightface MODEL.onnx`: an IResNet exported with insightface's torch2onnx recipe
(opset 11, constant folding, which folds BatchNorms into the convolutions) comes back as a checkpoint
whose embeddings are onnxruntime's, which fine-tunes, and whose bad cases are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.interop.insightface_import import import_insightface
from facetrain.interop.loading import load_model
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from tests.support.small_models import calibrated
from tests.support.train_helpers import run_cli, tiny_config

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

ARCH = "iresnet18"
EMBEDDING_SIZE = 32
SIZE = (112, 112)
# conv1, two convolutions in each of 8 blocks and a shortcut convolution in each of 4 stages
CONVOLUTIONS = 1 + 2 * 8 + 4


def torch2onnx(net: nn.Module, output: Path, seed: int = 0) -> None:
    """insightface's recognition/arcface_torch/torch2onnx.py `convert_onnx`, with torch's legacy exporter
    (what it ran on when the zoo models were made): an (x / 255 - 0.5) / 0.5 random image, opset 11,
    constant folding (torch's default), then the batch dimension renamed 'None'."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, size=(112, 112, 3), dtype=np.int32).astype(np.float32)
    img = ((img / 255.0 - 0.5) / 0.5).transpose((2, 0, 1))
    img = torch.from_numpy(img).unsqueeze(0).float()
    net.eval()
    with pytest.warns(DeprecationWarning):  # the legacy TorchScript exporter insightface's recipe uses
        torch.onnx.export(
            net, img, str(output), input_names=["data"], keep_initializers_as_inputs=False, verbose=False,
            opset_version=11, dynamo=False, do_constant_folding=True,
        )  # fmt: skip
    model = onnx.load(str(output))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "None"
    onnx.save(model, str(output))


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A facetrain iresnet18 with random weights, PReLU slopes and BN statistics, as insightface exports."""
    torch.manual_seed(0)
    net = calibrated(build_backbone(ModelConfig(backbone=ARCH, embedding_size=EMBEDDING_SIZE), SIZE), SIZE)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.PReLU):
                module.weight.uniform_(0.05, 0.4)
    path = tmp_path_factory.mktemp("zoo") / "w600k_r18.onnx"
    torch2onnx(net, path)
    return path


@pytest.fixture(scope="module")
def imported(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "r18"
    result = run_cli("import", "insightface", str(exported), "-o", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    assert f"as {ARCH}" in result.stdout and f"{EMBEDDING_SIZE}-d" in result.stdout
    return out


def test_the_export_folds_every_batchnorm_after_a_convolution(exported):
    ops = [node.op_type for node in onnx.load(str(exported)).graph.node]
    assert ops.count("Conv") == CONVOLUTIONS
    # what is left: each block's first BN, bn2 and the embedding's BN
    assert ops.count("BatchNormalization") == 8 + 2


def test_embeddings_equal_onnxruntimes(exported, imported):
    meta = json.loads((imported / "meta.json").read_text())
    assert meta["imported_from"]["format"].startswith("insightface ONNX")
    assert meta["imported_from"]["folded_batchnorms"] == CONVOLUTIONS
    model = load_model(imported)
    assert model.image_size == SIZE and model.embedding_size == EMBEDDING_SIZE
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    images = torch.rand(3, 3, *SIZE, generator=torch.Generator().manual_seed(1)) * 2 - 1
    (expected,) = session.run(None, {"data": images.numpy()})
    with torch.no_grad():
        actual = model.module(images).numpy()
    assert np.abs(expected).max() > 0.1  # a realistic embedding, not a collapsed one
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_fine_tuning_starts_from_the_import(imported, tmp_path):
    config = tiny_config(
        tmp_path, "tuned",
        data={"image_size": [112, 112], "synth": {
            "identities": 4, "images_per_identity": 2, "heldout_identities": 4,
            "heldout_images_per_identity": 2, "pairs_folds": 2, "pairs_per_fold": 2, "image_size": 112,
        }},
        model={"backbone": ARCH, "embedding_size": EMBEDDING_SIZE},
        train={"steps": 2, "batch_size": 4}, checkpoint={"every": 2},
        eval={"every": 0},
    )  # fmt: skip
    result = run_cli("train", "-c", str(config), "--init", str(imported))
    assert result.returncode == 0, result.stderr
    assert "initialised from" in result.stdout
    start = load_model(imported).module.state_dict()
    tuned = load_model(tmp_path / "tuned").module.state_dict()
    moved = [
        key for key in start if start[key].is_floating_point() and not torch.equal(start[key], tuned[key])
    ]
    assert "conv1.weight" in moved and "fc.weight" in moved


def test_a_wrong_arch_names_the_graphs(exported, tmp_path):
    with pytest.raises(FacetrainError, match=r"\(2, 2, 2, 2\) blocks, which is iresnet18, not iresnet50"):
        import_insightface(exported, "iresnet50", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_onnx_files_are_one_line_errors(exported, tmp_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(exported.read_bytes()[:5000])
    other = tmp_path / "small.onnx"
    torch2onnx(build_backbone(ModelConfig(backbone="small", embedding_size=8), SIZE), other)
    for path, message in {cut: "not a readable ONNX model", other: "an IResNet's has stride 1"}.items():
        with pytest.raises(FacetrainError, match=message) as error:
            import_insightface(path, None, tmp_path / "out", progress=False)
        assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_embed_with_an_onnx_says_to_import_it(exported, tmp_path):
    with pytest.raises(
        FacetrainError, match=r"import it first with `facetrain import insightface .*w600k_r18"
    ):
        load_model(exported)


def test_a_file_torch_cannot_read_never_suggests_weights_only_false(tmp_path):
    for name, content in {"text.pth": b"hello world", "onnx_named.pth": b"PK\x03\x04junk"}.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(FacetrainError, match="not a readable PyTorch weights file") as error:
            import_insightface(tmp_path / name, ARCH, tmp_path / "out", progress=False)
        assert "weights_only" not in str(error.value) and "\n" not in str(error.value)
