"""`small`: a backbone of about a million parameters that learns identities in minutes on a CPU.

Strided convolutions shrink the map early (112 -> 56 -> 28 -> 14 -> 7) so most work happens on small
maps, and a 1x1 squeeze before the flattened FC keeps the output layer from dominating the size.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import FlattenedEmbedding, PooledEmbedding, downsampled
from facetrain.models.ibn import InstanceBatchNorm2d
from facetrain.models.registry import BACKBONES, register_pooled

SMALL_INPUT_SIZE = (112, 112)
WIDTHS = (24, 48, 96, 160)
WIDE_WIDTHS = (48, 96, 192, 320)
SQUEEZED = 48


def conv_bn_prelu(
    in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1, ibn: bool = False
) -> nn.Sequential:
    """`ibn`: IBN-a's half-instance normalisation in place of the BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=False),
        InstanceBatchNorm2d(out_channels) if ibn else nn.BatchNorm2d(out_channels),
        nn.PReLU(out_channels),
    )


def small_network(
    embedding_size: int,
    dropout: float,
    input_size: tuple[int, int] | None,
    widths: tuple[int, ...] = WIDTHS,
    pooled: bool = False,
    pooling: str = "avg",
    ibn: bool = False,
) -> Backbone:
    """`pooled` pools the last map over its positions (`pooling`) instead of flattening it: a face that
    sits anywhere in an unaligned crop then gives the same features. `ibn` follows IBN-a: the first
    normalisation of every stage but the last is half instance, half batch."""
    input_size = input_size or SMALL_INPUT_SIZE
    modules: OrderedDict[str, nn.Module] = OrderedDict(
        stem=ConvStage(OrderedDict(conv=conv_bn_prelu(3, widths[0], stride=2)), checkpointable=False)
    )
    last = len(widths) - 1
    for index, (in_channels, width) in enumerate(zip(widths, widths[1:]), start=1):
        down = conv_bn_prelu(in_channels, width, stride=2, ibn=ibn and index < last)
        modules[f"stage{index}"] = ConvStage(OrderedDict(down=down, conv=conv_bn_prelu(width, width)))
    if pooled:
        modules["output"] = PooledEmbedding(widths[-1], embedding_size, dropout, pooling)
        return Backbone(modules, embedding_size, input_size, [(name,) for name in modules])
    modules["squeeze"] = ConvStage(
        OrderedDict(conv=conv_bn_prelu(widths[-1], SQUEEZED, kernel=1)), checkpointable=False
    )
    strides = len(widths)
    spatial = (downsampled(input_size[0], strides), downsampled(input_size[1], strides))
    modules["output"] = FlattenedEmbedding(SQUEEZED, spatial, embedding_size, dropout)
    return Backbone(modules, embedding_size, input_size, [(name,) for name in modules])


@BACKBONES.register("small")
def small(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
    return small_network(embedding_size, dropout, input_size)


@BACKBONES.register("small_wide")
def small_wide(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
    """Twice the channels (four times the compute) of `small`."""
    return small_network(embedding_size, dropout, input_size, widths=WIDE_WIDTHS)


@register_pooled("small_pooled")
def small_pooled(
    embedding_size: int, dropout: float, input_size: tuple[int, int] | None, pooling: str, ibn: bool
) -> Backbone:
    """`small` with a pooled output: for unaligned crops."""
    return small_network(embedding_size, dropout, input_size, pooled=True, pooling=pooling, ibn=ibn)
