"""Every backbone names its stages (stem first, embedding layer last), which optim.freeze_stages and
optim.layer_decay count: each parameter lies in exactly one, in the order the forward reaches them."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from facetrain.models import BACKBONES, Backbone, ModelConfig, build_backbone
from facetrain.models.backbone import stage_of
from facetrain.models.timm_backbone import timm_installed

# the classifier at the top (resnet18), inside a head (convnext), beside parameters of the model's own (vit)
TIMM = [
    pytest.param(name, marks=pytest.mark.skipif(not timm_installed(), reason="timm is not installed"))
    for name in ("timm:resnet18", "timm:convnext_nano", "timm:vit_tiny_patch16_224")
]


@pytest.mark.parametrize("name", [*BACKBONES.names(), *TIMM])
def test_the_stages_cover_every_parameter_once_from_the_stem_to_the_embedding(name):
    with torch.device("meta"):  # the shapes alone: r100 and iresnet200 build in no time
        backbone = build_backbone(ModelConfig(backbone=name, embedding_size=32))
    indices = [stage_of(param, backbone.stages) for param, _ in backbone.named_parameters()]
    assert len(backbone.stages) >= 2
    assert indices == sorted(indices)  # forward order: the stem's parameters first, the embedding's last
    assert set(indices) == set(range(len(backbone.stages)))  # no stage without a parameter
    if name.startswith("timm:"):  # timm's classifier is the embedding FC: it always trains
        assert len(backbone.stages) == 2 and backbone.stages[-1][0].startswith("body.")


def test_a_backbone_whose_stages_miss_or_repeat_a_parameter_is_refused():
    modules = OrderedDict(stem=nn.Linear(2, 2), output=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="output.weight lies in 0 of the stages"):
        Backbone(modules, 2, (8, 8), [("stem",)])
    with pytest.raises(ValueError, match="stem.weight lies in 2 of the stages"):
        Backbone(modules, 2, (8, 8), [("stem",), ("stem", "output")])
