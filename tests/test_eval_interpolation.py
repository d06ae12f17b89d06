"""Inputs of another size are resized as the model expects: facetrain's area interpolation, or
bilinear for a model imported from insightface (its inference.py resizes with cv2's default)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch import nn

from facetrain.data.transforms import RESIZE_LINEAR, build_eval_transform, normalize_hwc
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.interop.card import build_card, card_interpolation
from facetrain.models import build_backbone
from facetrain.train.run_config import Config

PHOTO = np.random.default_rng(0).integers(0, 256, (150, 150, 3), dtype=np.uint8)


def test_linear_resizes_as_insightface_inference_and_area_as_before():
    linear = build_eval_transform((112, 112), RESIZE_LINEAR)(PHOTO)
    assert torch.equal(linear, normalize_hwc(cv2.resize(PHOTO, (112, 112))))
    area = build_eval_transform((112, 112))(PHOTO)
    assert torch.equal(area, normalize_hwc(cv2.resize(PHOTO, (112, 112), interpolation=cv2.INTER_AREA)))
    assert not torch.equal(area, linear)
    with pytest.raises(FacetrainError, match="unknown resize interpolation 'cubic'"):
        build_eval_transform((112, 112), "cubic")(PHOTO)


class Pixels(nn.Module):
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1)


def test_embeddings_follow_the_interpolation():
    linear = compute_embeddings(
        Pixels(), [PHOTO], EmbedSettings((112, 112), flip=False, progress=False, interpolation="linear")
    )
    expected = normalize_hwc(cv2.resize(PHOTO, (112, 112))).flatten()
    np.testing.assert_allclose(linear.vectors[0], (expected / expected.norm()).numpy(), rtol=0, atol=1e-6)
    raw = compute_embeddings(
        Pixels(), [PHOTO], EmbedSettings((112, 112), flip=False, progress=False), normalized=False
    )
    assert raw.xnorm == pytest.approx(float(np.linalg.norm(raw.vectors[0].astype(np.float64))), rel=1e-5)


def card(meta: dict) -> dict:
    config = Config()
    config.model.backbone = "small"
    module = build_backbone(config.model, image_size=(32, 32))
    return build_card(module, config, meta, (32, 32), Path("source"))


def test_the_card_records_the_interpolation():
    imported = card({"imported_from": {"format": "insightface arcface_torch backbone.pth"}})
    assert imported["input"]["interpolation"] == "linear" and card_interpolation(imported) == "linear"
    assert "insightface" in imported["input"]["resize"]
    own = card({"step": 3})
    assert own["input"]["interpolation"] == "area" and card_interpolation(own) == "area"
    dlib = card({"imported_from": {"format": "dlib DNN (loss_metric network, dlib::serialize)"}})
    assert card_interpolation(dlib) == "area"
    del own["input"]["interpolation"]  # a card from before facetrain recorded it
    assert card_interpolation(own) == "area"
    own["input"]["interpolation"] = "cubic"
    with pytest.raises(FacetrainError, match="input.interpolation 'cubic' is not one of area, linear"):
        card_interpolation(own)
