"""`small`: a backbone of about a million parameters that learns identities in minutes on a CPU.

Strided convolutions shrink the map early (112 -> 56 -> 28 -> 14 -> 7) so most work happens on small
maps, and a 1x1 squeeze before the flattened FC keeps the output layer from dominating the size.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import FlattenedEmbedding, downsampled
from facetrain.models.registry import BACKBONES

SMALL_INPUT_SIZE = (112, 112)
WIDTHS = (24, 48, 96, 160)
SQUEEZED = 48


def conv_bn_prelu(in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.PReLU(out_channels),
    )


@BACKBONES.register("small")
def small(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
    input_size = input_size or SMALL_INPUT_SIZE
    modules: OrderedDict[str, nn.Module] = OrderedDict(
        stem=ConvStage(OrderedDict(conv=conv_bn_prelu(3, WIDTHS[0], stride=2)), checkpointable=False)
    )
    for index, (in_channels, width) in enumerate(zip(WIDTHS, WIDTHS[1:]), start=1):
        modules[f"stage{index}"] = ConvStage(
            OrderedDict(down=conv_bn_prelu(in_channels, width, stride=2), conv=conv_bn_prelu(width, width))
        )
    modules["squeeze"] = ConvStage(
        OrderedDict(conv=conv_bn_prelu(WIDTHS[-1], SQUEEZED, kernel=1)), checkpointable=False
    )
    strides = len(WIDTHS)
    spatial = (downsampled(input_size[0], strides), downsampled(input_size[1], strides))
    modules["output"] = FlattenedEmbedding(SQUEEZED, spatial, embedding_size, dropout)
    return Backbone(modules, embedding_size, input_size)
