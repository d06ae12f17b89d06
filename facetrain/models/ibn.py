"""IBN-a's normalisation layer (Pan, Luo, Shi and Tang, "Two at once: enhancing learning and
generalization capacities via IBN-Net", ECCV 2018)."""

from __future__ import annotations

import torch
from torch import nn


class InstanceBatchNorm2d(nn.Module):
    """Instance normalisation on the first half of the channels, batch normalisation on the rest.

    Instance normalisation removes each image's own contrast and colour statistics, much of what
    differs between cameras and datasets; batch normalisation keeps the content features
    discriminative. IBN-Net puts this layer in place of the first BatchNorm of each block in all but
    the last stage (appearance varies most in the shallow features) and found it raises accuracy on
    unseen domains at no cost in parameters or time; the authors' layout (IN first, half the channels,
    affine IN) is followed here.
    """

    def __init__(self, channels: int, instance_fraction: float = 0.5):
        super().__init__()
        self.instance_channels = int(channels * instance_fraction)
        self.instance = nn.InstanceNorm2d(self.instance_channels, affine=True)
        self.batch = nn.BatchNorm2d(channels - self.instance_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, rest = torch.split(x, [self.instance_channels, x.shape[1] - self.instance_channels], dim=1)
        return torch.cat([self.instance(first), self.batch(rest)], dim=1)
