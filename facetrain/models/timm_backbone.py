"""`timm:<name>`: any timm model as the backbone, its pooled features turned into the embedding.

timm builds the model with `num_classes=model.embedding_size`, so its own classifier becomes the
embedding layer (after whatever head the model has: mobilenetv3's 1024-wide conv_head, a ViT's
norm), with `model.dropout` as its `drop_rate`; a BatchNorm follows, as in IResNet's output, so the
margin head sees embeddings of an even scale. The model is always built with
`pretrained=False`: facetrain never downloads weights (start from your own with `model.init`).
timm is optional (`pip install timm`, or the `test` extra); the config check names model.backbone in
one line when it is missing or does not know the name.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict

from torch import nn

from facetrain.models.backbone import Backbone
from facetrain.models.embedding import WeightPrecisionBatchNorm1d
from facetrain.models.registry import BACKBONES

PREFIX = "timm:"


def timm_installed() -> bool:
    return importlib.util.find_spec("timm") is not None


def timm_problem(name: str) -> str | None:
    """None when timm is installed and knows `name`; imports timm only when a config names it."""
    if not timm_installed():
        return "needs timm, which is not installed (pip install timm)"
    import timm

    if not timm.is_model(name):
        return f"timm has no model {name!r} (see timm.list_models())"
    return None


@BACKBONES.register_prefix(PREFIX, timm_problem)
def timm_backbone(
    name: str, embedding_size: int, dropout: float, input_size: tuple[int, int] | None
) -> Backbone:
    """`input_size` None: the model's own (e.g. 224x224). Models with a fixed input grid (ViTs) take
    it as `img_size`; convolutional ones take any size and refuse that argument, so it is passed only
    to those that accept it."""
    import timm

    default = timm.get_pretrained_cfg_value(name, "input_size") or (3, 224, 224)
    size = tuple(input_size or default[1:])
    options = {"pretrained": False, "num_classes": embedding_size, "drop_rate": dropout}
    try:
        body = timm.create_model(name, img_size=size, **options)
    except TypeError:
        body = timm.create_model(name, **options)
    output = nn.Sequential(OrderedDict(features=WeightPrecisionBatchNorm1d(embedding_size)))
    # one stage for the whole timm model, whose inner layout facetrain does not know
    return Backbone(OrderedDict(body=body, output=output), embedding_size, size, [("body",), ("output",)])
