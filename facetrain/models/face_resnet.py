"""Face ResNets (r18, r34, r50, r100) from torchvision's residual blocks, shaped like IResNet.

For 112x112 aligned crops the ImageNet stem (7x7 stride 2 and max-pool) throws away too much
resolution, so the stem is a 3x3 stride-1 convolution and every residual stage halves the map:
112 -> 56 -> 28 -> 14 -> 7. As in IResNet, the depths count basic blocks (r50 is [3, 4, 14, 3] and
r100 [3, 13, 30, 3]), not ImageNet's bottleneck ResNet-50.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn
from torchvision.models.resnet import BasicBlock, conv1x1

from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import FlattenedEmbedding, downsampled
from facetrain.models.registry import BACKBONES

FACE_INPUT_SIZE = (112, 112)
STAGE_WIDTHS = (64, 128, 256, 512)
DEPTHS = {"r18": (2, 2, 2, 2), "r34": (3, 4, 6, 3), "r50": (3, 4, 14, 3), "r100": (3, 13, 30, 3)}


def residual_stage(in_channels: int, width: int, depth: int) -> ConvStage:
    shortcut = nn.Sequential(conv1x1(in_channels, width, stride=2), nn.BatchNorm2d(width))
    blocks = [BasicBlock(in_channels, width, stride=2, downsample=shortcut)]
    blocks += [BasicBlock(width, width) for _ in range(depth - 1)]
    return ConvStage(OrderedDict((str(i), block) for i, block in enumerate(blocks)))


def face_resnet(
    depths: tuple[int, ...], embedding_size: int, dropout: float, input_size: tuple[int, int]
) -> Backbone:
    stem = ConvStage(
        OrderedDict(
            conv=nn.Conv2d(3, STAGE_WIDTHS[0], 3, stride=1, padding=1, bias=False),
            bn=nn.BatchNorm2d(STAGE_WIDTHS[0]),
            act=nn.PReLU(STAGE_WIDTHS[0]),
        ),
        checkpointable=False,
    )
    modules: OrderedDict[str, nn.Module] = OrderedDict(stem=stem)
    in_channels = STAGE_WIDTHS[0]
    for index, (width, depth) in enumerate(zip(STAGE_WIDTHS, depths), start=1):
        modules[f"layer{index}"] = residual_stage(in_channels, width, depth)
        in_channels = width
    spatial = (downsampled(input_size[0], len(depths)), downsampled(input_size[1], len(depths)))
    modules["output"] = FlattenedEmbedding(in_channels, spatial, embedding_size, dropout)
    backbone = Backbone(modules, embedding_size, input_size, [(name,) for name in modules])
    initialize(backbone)
    return backbone


def initialize(backbone: nn.Module) -> None:
    """He init for convolutions and a zero last BN in each block, so every block starts as identity."""
    for module in backbone.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, BasicBlock):
            nn.init.zeros_(module.bn2.weight)


def _register(name: str) -> None:
    @BACKBONES.register(name)
    def build(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
        return face_resnet(DEPTHS[name], embedding_size, dropout, input_size or FACE_INPUT_SIZE)


for _name in DEPTHS:
    _register(_name)
