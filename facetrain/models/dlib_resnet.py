"""`dlib_resnet`: dlib's face recognition ResNet (`dlib_face_recognition_resnet_model_v1.dat`), layer for layer.

dlib defines the network as C++ types (`anet_type` in dlib's `dnn_face_recognition_ex.cpp`): a 7x7/2
convolution, affine, ReLU and 3x3/2 max pool, then residual levels of 32 (x3), 64 (x4), 128 (x3),
256 (x3) and 256 (x1) channels, global average pooling and a 128-wide FC without bias. A block is
conv3x3 -> affine -> ReLU -> conv3x3 -> affine; the sum with the shortcut is followed by a ReLU.
The first block of a level convolves with stride 2 and no padding (dlib pads only stride-1
convolutions), and its shortcut is a 2x2/2 average pool of the input with no 1x1 projection:
dlib adds tensors of different shapes by zero-filling the smaller one at the far end of each axis,
so the shortcut's missing channels are zeros, and where the pooled map is one row and column
larger than the convolved one (8 -> 4 against 3 at 150x150) the sum keeps the larger size.

dlib's `affine_` layers are its batch norms frozen to a per-channel scale and shift; here they are
`ChannelAffine` parameters, which a fine-tuning run may train. The network reads images as
(pixel - mean) / 256 with dlib's RGB means; `DlibInput` turns facetrain's (pixel - 127.5) / 127.5
into that, inside the model, so every facetrain data path feeds it unchanged. The embedding is the
FC's output, as dlib's `loss_metric` returns it (not L2-normalised).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.registry import BACKBONES
from facetrain.pixels import PIXEL_MEAN, PIXEL_SCALE

DLIB_INPUT_SIZE = (150, 150)
DLIB_RGB_MEAN = (122.782, 117.001, 104.298)
DLIB_PIXEL_SCALE = 256.0
DLIB_EMBEDDING_SIZE = 128
STEM_WIDTH = 32
# (width, blocks) of each level from the stem up; the first block of every level but the first halves
# the map (dlib's alevel4 ... alevel0).
LEVELS = ((32, 3), (64, 4), (128, 3), (256, 3), (256, 1))

DlibLayerSpec = tuple[str, nn.Module | None]
"""One dlib layer as the file lists it: its kind and the module holding its weights and settings."""


class DlibInput(nn.Module):
    """facetrain's normalised pixels to dlib's: (pixel - mean_c) / 256, per RGB channel."""

    def __init__(self, mean: tuple[float, float, float] = DLIB_RGB_MEAN):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pixels = x * PIXEL_SCALE + PIXEL_MEAN
        return (pixels - self.mean.to(x.dtype).view(1, -1, 1, 1)) / DLIB_PIXEL_SCALE

    def dlib_layers(self) -> Iterator[DlibLayerSpec]:
        return iter(())


class ChannelAffine(nn.Module):
    """dlib's `affine_` in conv mode: gamma_c * x + beta_c (a batch norm with its statistics folded in)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


def padded_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """dlib's `add_prev_`: the sum over the larger extent of each axis, the smaller tensor zero-filled
    at the end of the channel, row and column axes."""
    if a.shape == b.shape:
        return a + b
    channels, rows, cols = (max(a.shape[axis], b.shape[axis]) for axis in (1, 2, 3))
    return _zero_fill(a, channels, rows, cols) + _zero_fill(b, channels, rows, cols)


def _zero_fill(x: torch.Tensor, channels: int, rows: int, cols: int) -> torch.Tensor:
    return F.pad(x, (0, cols - x.shape[3], 0, rows - x.shape[2], 0, channels - x.shape[1]))


def dlib_conv(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    """dlib's `con_` defaults: padding kernel // 2 at stride 1, none otherwise; always a bias."""
    return nn.Conv2d(
        in_channels, out_channels, kernel, stride=stride, padding=kernel // 2 if stride == 1 else 0
    )


class DlibResidual(nn.Module):
    """`ares` (stride 1, identity shortcut) or `ares_down` (stride 2, average-pooled shortcut)."""

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        self.conv1 = dlib_conv(in_channels, width, 3, stride)
        self.affine1 = ChannelAffine(width)
        self.conv2 = dlib_conv(width, width, 3, 1)
        self.affine2 = ChannelAffine(width)
        self.shortcut = nn.AvgPool2d(2, stride=2) if stride == 2 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.affine2(self.conv2(F.relu(self.affine1(self.conv1(x)))))
        return F.relu(padded_sum(out, self.shortcut(x)))

    def dlib_layers(self) -> Iterator[DlibLayerSpec]:
        yield from (("mark", None), ("con", self.conv1), ("affine", self.affine1), ("relu", None))
        yield from (("con", self.conv2), ("affine", self.affine2))
        if isinstance(self.shortcut, nn.AvgPool2d):
            yield from (("mark", None), ("mark", None), ("avg_pool", self.shortcut))
        yield from (("add_prev", None), ("relu", None))


class DlibStem(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = dlib_conv(3, STEM_WIDTH, 7, 2)
        self.affine = ChannelAffine(STEM_WIDTH)
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.affine(self.conv(x))))

    def dlib_layers(self) -> Iterator[DlibLayerSpec]:
        yield from (("con", self.conv), ("affine", self.affine), ("relu", None), ("max_pool", self.pool))


class DlibHead(nn.Module):
    """`avg_pool_everything` then `fc_no_bias`: the embedding."""

    def __init__(self, channels: int, embedding_size: int, dropout: float):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, embedding_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.flatten(self.pool(x))))

    def dlib_layers(self) -> Iterator[DlibLayerSpec]:
        yield from (("avg_pool", self.pool), ("fc", self.fc))


def dlib_resnet(embedding_size: int, dropout: float, input_size: tuple[int, int]) -> Backbone:
    _check_input_size(input_size)
    modules: OrderedDict[str, nn.Module] = OrderedDict(input=DlibInput(), stem=DlibStem())
    in_channels = STEM_WIDTH
    for index, (width, blocks) in enumerate(LEVELS, start=1):
        first_stride = 1 if index == 1 else 2
        modules[f"level{index}"] = ConvStage(
            OrderedDict(
                (
                    str(block),
                    DlibResidual(
                        in_channels if block == 0 else width, width, first_stride if block == 0 else 1
                    ),
                )
                for block in range(blocks)
            )
        )
        in_channels = width
    modules["head"] = DlibHead(in_channels, embedding_size, dropout)
    stem = ("input", "stem")  # the input layer holds dlib's mean alone, no parameter
    levels = [(f"level{index}",) for index in range(1, len(LEVELS) + 1)]
    return Backbone(modules, embedding_size, input_size, [stem, *levels, ("head",)])


def dlib_layer_sequence(backbone: Backbone) -> list[DlibLayerSpec]:
    """The layers a dlib file lists for this network, bottom up, with marks where tags and skips are."""
    sequence: list[DlibLayerSpec] = []
    for module in backbone.children():
        parts = module.children() if isinstance(module, ConvStage) else (module,)
        for part in parts:
            sequence.extend(part.dlib_layers())
    return sequence


def _levels_fit(side: int) -> bool:
    """Whether every unpadded stride-2 convolution gets a map of at least 3x3 from `side` pixels."""
    size = ((side - 7) // 2 + 1 - 3) // 2 + 1
    for _ in LEVELS[1:]:
        if size < 3:
            return False
        size = (size - 3) // 2 + 1
    return True


MIN_INPUT_SIDE = next(side for side in range(8, 10_000) if _levels_fit(side))


def _check_input_size(input_size: tuple[int, int]) -> None:
    if min(input_size) < MIN_INPUT_SIDE:
        raise FacetrainError(
            f"data.image_size {input_size[0]}x{input_size[1]} is too small for dlib_resnet (at least "
            f"{MIN_INPUT_SIDE}x{MIN_INPUT_SIDE}); use {DLIB_INPUT_SIZE[0]}x{DLIB_INPUT_SIZE[1]}, "
            "the size dlib's weights were trained at"
        )


@BACKBONES.register("dlib_resnet")
def build(embedding_size: int, dropout: float, input_size: tuple[int, int] | None) -> Backbone:
    return dlib_resnet(embedding_size, dropout, input_size or DLIB_INPUT_SIZE)
