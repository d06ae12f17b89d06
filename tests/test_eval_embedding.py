"""Embedding and verification against plain torch references on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch import nn

from facetrain.data.transforms import build_eval_transform
from facetrain.eval.embedding import EmbedSettings, compute_embeddings, embed_images
from facetrain.eval.metrics import verification_metrics
from facetrain.eval.pairs import load_pairs
from facetrain.eval.verify_pairs import pair_scores, verify
from tests.support.eval_sets import ColourMean, colour_face, tiny_conv_net, write_lfw_style_set

IMAGE_SIZE = (20, 16)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def faces() -> list[np.ndarray]:
    return [colour_face(index % 6, seed=index) for index in range(7)]


def reference_embeddings(module: nn.Module, faces: list[np.ndarray], flip: bool) -> tuple[np.ndarray, float]:
    transform = build_eval_transform(IMAGE_SIZE)
    batch = torch.stack([transform(face) for face in faces])
    module.eval()
    with torch.no_grad():
        raw = module(batch)
        combined = raw + module(batch.flip(3)) if flip else raw
    return (combined / combined.norm(dim=1, keepdim=True)).numpy(), float(raw.norm(dim=1).mean())


@pytest.mark.parametrize("flip", [True, False])
def test_embeddings_match_plain_torch(faces: list[np.ndarray], flip: bool):
    module = tiny_conv_net(IMAGE_SIZE)
    expected, expected_xnorm = reference_embeddings(module, faces, flip)
    result = compute_embeddings(
        module, faces, EmbedSettings(IMAGE_SIZE, batch_size=3, flip=flip, progress=False)
    )
    np.testing.assert_allclose(result.vectors, expected, atol=1e-6)
    assert result.xnorm == pytest.approx(expected_xnorm, rel=1e-6)
    assert result.vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-6)


def test_flip_test_changes_an_asymmetric_model(faces: list[np.ndarray]):
    module = tiny_conv_net(IMAGE_SIZE)
    flipped = embed_images(module, faces, EmbedSettings(IMAGE_SIZE, flip=True, progress=False))
    plain = embed_images(module, faces, EmbedSettings(IMAGE_SIZE, flip=False, progress=False))
    assert not np.allclose(flipped, plain, atol=1e-3)


def test_paths_bytes_and_arrays_embed_alike(tmp_path: Path, faces: list[np.ndarray]):
    paths = []
    for index, face in enumerate(faces):
        paths.append(tmp_path / f"{index}.png")
        cv2.imwrite(str(paths[-1]), cv2.cvtColor(face, cv2.COLOR_RGB2BGR))
    module = tiny_conv_net(IMAGE_SIZE)
    from_arrays = embed_images(module, faces, EmbedSettings(IMAGE_SIZE, progress=False))
    np.testing.assert_allclose(
        embed_images(module, paths, EmbedSettings(IMAGE_SIZE, progress=False)), from_arrays, atol=1e-6
    )
    encoded = [path.read_bytes() for path in paths]
    np.testing.assert_allclose(
        embed_images(module, encoded, EmbedSettings(IMAGE_SIZE, progress=False)), from_arrays, atol=1e-6
    )


def test_training_mode_is_restored_and_no_gradients_flow(faces: list[np.ndarray]):
    module = tiny_conv_net(IMAGE_SIZE).train()
    running_mean = module[1].running_mean.clone()
    embed_images(module, faces, EmbedSettings(IMAGE_SIZE, progress=False))
    assert module.training
    assert torch.equal(module[1].running_mean, running_mean), "BatchNorm must run in eval mode"
    assert all(parameter.grad is None for parameter in module.parameters())


def test_a_model_without_flat_embeddings_is_rejected(faces: list[np.ndarray]):
    with pytest.raises(ValueError, match=r"\(B, D\) embeddings"):
        embed_images(nn.Identity(), faces, EmbedSettings(IMAGE_SIZE, progress=False))


def test_verify_a_perfect_model_on_an_lfw_style_set(tmp_path: Path):
    pairs = load_pairs(write_lfw_style_set(tmp_path))
    result = verify(pairs, ColourMean(), EmbedSettings(IMAGE_SIZE, batch_size=5, progress=False))
    assert result.accuracy == 1.0 and result.metrics.auc == 1.0 and result.metrics.eer == 0.0
    assert len(result.metrics.folds) == 2, "the folds of pairs.txt are used"
    assert result.folds_source == "the file's"
    figures = json.loads(json.dumps(result.as_dict()))
    assert figures["num_pairs"] == 12 and figures["num_matched"] == 6
    assert figures["accuracy"] == 1.0 and figures["flip"] is True
    assert figures["threshold"] == result.metrics.operating_point.threshold
    assert figures["threshold_far"] == 0.0 and figures["threshold_tar"] == 1.0


def test_verify_matches_metrics_of_reference_scores(tmp_path: Path):
    pairs = load_pairs(write_lfw_style_set(tmp_path))
    module = tiny_conv_net(IMAGE_SIZE, seed=3)
    result = verify(pairs, module, EmbedSettings(IMAGE_SIZE, flip=False, progress=False))
    faces = [cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB) for path in pairs.images]
    embeddings, xnorm = reference_embeddings(module, faces, flip=False)
    scores = np.array([embeddings[i] @ embeddings[j] for i, j in zip(pairs.left, pairs.right)])
    np.testing.assert_allclose(pair_scores(embeddings, pairs), scores, atol=1e-6)
    expected = verification_metrics(scores, pairs.issame, pairs.folds)
    assert result.accuracy == pytest.approx(expected.accuracy_mean)
    assert result.metrics.auc == pytest.approx(expected.auc, abs=1e-6)
    assert result.xnorm == pytest.approx(xnorm, rel=1e-6)
