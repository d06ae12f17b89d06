"""An exponential moving average (EMA) of the backbone, verified, checkpointed and exported in its place.

The last step's weights carry the noise of the last few batches; their running average generalises
better, most of all on small sets trained with a high learning rate (docs/accuracy.md). The average
covers parameters and floating-point buffers (batch-norm running statistics), so the averaged network
is complete in eval mode; integer buffers (batch-norm's step count) are copied.

The decay warms up as min(decay, (1 + n) / (10 + n)) after n updates, as timm's and insightface's
EMAs do: a fixed 0.999 would leave three quarters of the random initial weights in the average after
300 steps. The update count lives on the host, so updating never waits on the device.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class WeightEma:
    """`module` is a detached copy of the backbone holding the average; `update` after each step."""

    def __init__(self, backbone: nn.Module, decay: float):
        self.decay = float(decay)
        self.updates = 0  # a resumed run sets the count it had reached
        self.module = copy.deepcopy(backbone).eval().requires_grad_(False)

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, backbone: nn.Module) -> None:
        self.updates += 1
        weight = 1.0 - self.current_decay()
        averaged, live = self.module.state_dict(), backbone.state_dict()
        floating = [key for key, value in averaged.items() if value.is_floating_point()]
        if floating:
            torch._foreach_lerp_([averaged[k] for k in floating], [live[k] for k in floating], weight)
        for key, value in averaged.items():
            if not value.is_floating_point():
                value.copy_(live[key])
