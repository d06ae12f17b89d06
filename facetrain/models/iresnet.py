"""IResNet (`iresnet18` ... `iresnet200`): insightface arcface_torch's backbones, weight for weight.

The module tree, parameter and buffer names, shapes and forward are those of insightface's
`recognition/arcface_torch/backbones/iresnet.py`, so `load_state_dict(strict=True)` takes one of its
released `backbone.pth` files as is and results compare with the field's recipes block for block.
Unlike facetrain's `r*` family (torchvision's conv-BN-ReLU-conv-BN block with a ReLU after the sum),
the improved block is pre-activated, BN -> conv3x3 -> BN -> PReLU -> conv3x3(stride) -> BN, with
nothing after the sum (Duta et al., "Improved Residual Networks", 2020).

The backbone stays a facetrain `Backbone`: its top-level modules are insightface's attribute names
(conv1, bn1, prelu, layer1..layer4, bn2, flatten, dropout, fc, features), so the keys are unchanged
and the pipeline code can still cut it. insightface's `fp16` flag is facetrain's `train.precision`:
the trainer's autocast covers the convolutions, while `fc` and `features` always run in the weights'
precision, as insightface's `x.float()` before `fc` makes them.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from facetrain.choices import IRESNET_DEPTHS
from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import WeightPrecisionBatchNorm1d, WeightPrecisionLinear, downsampled
from facetrain.models.registry import BACKBONES

IRESNET_INPUT_SIZE = (112, 112)
STAGE_WIDTHS = (64, 128, 256, 512)
BN_EPS = 1e-5
CONV_INIT_STD = 0.1


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class ImprovedBasicBlock(nn.Module):
    """insightface's `IBasicBlock`: the stride sits on the second convolution, the shortcut is
    identity or a strided 1x1 convolution with BN, and the sum is returned without an activation."""

    def __init__(self, in_channels: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_channels, eps=BN_EPS)
        self.conv1 = conv3x3(in_channels, width)
        self.bn2 = nn.BatchNorm2d(width, eps=BN_EPS)
        self.prelu = nn.PReLU(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn3 = nn.BatchNorm2d(width, eps=BN_EPS)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        shortcut = x if self.downsample is None else self.downsample(x)
        return out + shortcut


def improved_stage(in_channels: int, width: int, depth: int) -> ConvStage:
    """A residual layer that halves the map in its first block, keys `0`, `1`, ... as in nn.Sequential."""
    downsample = nn.Sequential(
        nn.Conv2d(in_channels, width, 1, stride=2, bias=False), nn.BatchNorm2d(width, eps=BN_EPS)
    )
    blocks = [ImprovedBasicBlock(in_channels, width, stride=2, downsample=downsample)]
    blocks += [ImprovedBasicBlock(width, width) for _ in range(depth - 1)]
    return ConvStage(OrderedDict((str(index), block) for index, block in enumerate(blocks)))


def iresnet(
    depths: tuple[int, ...], embedding_size: int, dropout: float, input_size: tuple[int, int]
) -> Backbone:
    modules: OrderedDict[str, nn.Module] = OrderedDict(
        conv1=nn.Conv2d(3, STAGE_WIDTHS[0], 3, stride=1, padding=1, bias=False),
        bn1=nn.BatchNorm2d(STAGE_WIDTHS[0], eps=BN_EPS),
        prelu=nn.PReLU(STAGE_WIDTHS[0]),
    )
    in_channels = STAGE_WIDTHS[0]
    for index, (width, depth) in enumerate(zip(STAGE_WIDTHS, depths), start=1):
        modules[f"layer{index}"] = improved_stage(in_channels, width, depth)
        in_channels = width
    map_height, map_width = (downsampled(side, len(depths)) for side in input_size)
    modules["bn2"] = nn.BatchNorm2d(in_channels, eps=BN_EPS)
    modules["flatten"] = nn.Flatten()
    modules["dropout"] = nn.Dropout(dropout)
    modules["fc"] = WeightPrecisionLinear(in_channels * map_height * map_width, embedding_size)
    modules["features"] = WeightPrecisionBatchNorm1d(embedding_size, eps=BN_EPS)
    stem, embedding = ("conv1", "bn1", "prelu"), ("bn2", "flatten", "dropout", "fc", "features")
    layers = [(f"layer{index}",) for index in range(1, len(depths) + 1)]
    backbone = Backbone(modules, embedding_size, input_size, [stem, *layers, embedding])
    initialize(backbone)
    return backbone


def initialize(backbone: Backbone) -> None:
    """insightface's initialisation: N(0, 0.1) convolutions, unit BN, and the embedding BN's scale
    fixed at 1 (not trained), which leaves the embedding's scale to the FC alone."""
    for module in backbone.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.normal_(module.weight, 0.0, CONV_INIT_STD)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    nn.init.ones_(backbone.features.weight)
    backbone.features.weight.requires_grad_(False)


def _register(name: str) -> None:
    @BACKBONES.register(name)
    def build(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
        return iresnet(IRESNET_DEPTHS[name], embedding_size, dropout, input_size or IRESNET_INPUT_SIZE)


for _name in IRESNET_DEPTHS:
    _register(_name)
