"""`mbf`: insightface arcface_torch's MobileFaceNet, weight for weight.

The module tree, parameter and buffer names, shapes and forward are those of insightface's
`recognition/arcface_torch/backbones/mobilefacenet.py` (`get_mbf`: blocks 1, 4, 6, 2 at width scale
2, 512-d), so its `backbone.pth` loads with `load_state_dict(strict=True)`. It is the backbone for
phones and laptops (about 1.1 million parameters in the convolutions, 0.45 GFLOPs at 112x112) and the
one face backbone that trains at a useful speed on a CPU.

Depthwise-separable bottlenecks (1x1 expand, depthwise 3x3, 1x1 project without activation, plus the
input when the shape is kept) shrink 112 to 7; a global depthwise convolution (GDC) over the whole 7x7
map, not pooling, keeps where on the face each feature fired, and a linear layer and BN give the
embedding. insightface's `fp16` flag covers the bottlenecks only: `conv_sep` and the GDC see
`x.float()`, as here under facetrain's autocast. For inputs other than 112x112 the GDC's kernel is the
last map's size (insightface's is 7x7), so the same code trains small test images.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import downsampled
from facetrain.models.registry import BACKBONES

MBF_INPUT_SIZE = (112, 112)
MBF_BLOCKS = (1, 4, 6, 2)
MBF_SCALE = 2
GDC_CHANNELS = 512
STRIDE_2_LAYERS = 4


class ConvBlock(nn.Module):
    """Convolution, BN, PReLU under `layers` (insightface's key prefix)."""

    def __init__(self, in_c: int, out_c: int, kernel=(1, 1), stride=(1, 1), padding=(0, 0), groups: int = 1):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(in_c, out_c, kernel, stride=stride, padding=padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_c),
            nn.PReLU(out_c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class LinearBlock(nn.Module):
    """Convolution and BN without an activation: a bottleneck's projection keeps negative values."""

    def __init__(self, in_c: int, out_c: int, kernel=(1, 1), stride=(1, 1), padding=(0, 0), groups: int = 1):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False), nn.BatchNorm2d(out_c)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class DepthWise(nn.Module):
    """insightface's bottleneck: 1x1 to `groups` channels, depthwise 3x3 with the stride, 1x1 back."""

    def __init__(self, in_c: int, out_c: int, residual: bool, stride: int, groups: int):
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(
            ConvBlock(in_c, groups),
            ConvBlock(groups, groups, (3, 3), (stride, stride), (1, 1), groups=groups),
            LinearBlock(groups, out_c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(x)
        return x + out if self.residual else out


def residual(channels: int, count: int, groups: int) -> ConvStage:
    """insightface's `Residual`: `count` shape-keeping bottlenecks under `layers`, recomputable in
    backward as one stage."""
    blocks = nn.Sequential(*[DepthWise(channels, channels, True, 1, groups) for _ in range(count)])
    return ConvStage(OrderedDict(layers=blocks))


class Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1)


class FullPrecision(nn.Module):
    """Runs `layers` outside autocast on inputs cast to the weights' dtype (insightface's `x.float()`)."""

    def __init__(self, layers: nn.Sequential):
        super().__init__()
        self.layers = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = next(self.parameters()).dtype
        if not torch.amp.is_autocast_available(x.device.type):
            return self.layers(x.to(dtype))
        with torch.autocast(x.device.type, enabled=False):
            return self.layers(x.to(dtype))


def mobilefacenet(
    embedding_size: int,
    dropout: float,
    input_size: tuple[int, int] | None,
    blocks: tuple[int, int, int, int] = MBF_BLOCKS,
    scale: int = MBF_SCALE,
) -> Backbone:
    """`dropout` is accepted for the registry's signature; MobileFaceNet has none, as insightface's."""
    input_size = input_size or MBF_INPUT_SIZE
    narrow, wide = 64 * scale, 128 * scale
    if blocks[0] == 1:
        second = ConvBlock(narrow, narrow, (3, 3), (1, 1), (1, 1), groups=64)
    else:
        second = residual(narrow, blocks[0], 128)
    layers = [
        ConvBlock(3, narrow, (3, 3), (2, 2), (1, 1)),
        second,
        DepthWise(narrow, narrow, False, 2, 128),
        residual(narrow, blocks[1], 128),
        DepthWise(narrow, wide, False, 2, 256),
        residual(wide, blocks[2], 256),
        DepthWise(wide, wide, False, 2, 512),
        residual(wide, blocks[3], 256),
    ]
    map_size = tuple(downsampled(side, STRIDE_2_LAYERS) for side in input_size)
    conv_sep = ConvBlock(wide, GDC_CHANNELS)
    gdc = nn.Sequential(
        LinearBlock(GDC_CHANNELS, GDC_CHANNELS, kernel=map_size, groups=GDC_CHANNELS),
        Flatten(),
        nn.Linear(GDC_CHANNELS, embedding_size, bias=False),
        nn.BatchNorm1d(embedding_size),
    )
    modules: OrderedDict[str, nn.Module] = OrderedDict(
        layers=ConvStage(
            OrderedDict((str(i), layer) for i, layer in enumerate(layers)), checkpointable=False
        ),
        conv_sep=FullPrecision(conv_sep.layers),
        features=FullPrecision(gdc),
    )
    # the stem and each downsampling with the bottlenecks after it; the GDC and its linear embed
    stages = [("layers.0", "layers.1"), ("layers.2", "layers.3"), ("layers.4", "layers.5")]
    stages += [("layers.6", "layers.7"), ("conv_sep",), ("features",)]
    backbone = Backbone(modules, embedding_size, input_size, stages)
    initialize(backbone)
    return backbone


def initialize(backbone: Backbone) -> None:
    """insightface's: Kaiming-normal (fan out, ReLU gain) convolutions and linear layer, unit BN."""
    for module in backbone.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


@BACKBONES.register("mbf")
def mbf(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
    return mobilefacenet(embedding_size, dropout, input_size)
