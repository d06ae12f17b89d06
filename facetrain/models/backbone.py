"""The shape every backbone shares: an ordered chain of named top-level modules.

Keeping backbones as plain chains lets the pipeline code cut them into stages from outside (by module
name or by measured cost) without the model knowing, and keeps parameter names identical whether the
model runs whole or split.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class ConvStage(nn.Sequential):
    """A run of blocks that can recompute its activations in backward and accept channels-last input.

    Both switches live on the stage itself rather than on the backbone, so they survive when the
    pipeline code moves the stage (or a slice of it) into another process.
    """

    def __init__(self, blocks: OrderedDict[str, nn.Module], checkpointable: bool = True):
        super().__init__(blocks)
        self.checkpointable = checkpointable
        self.checkpointing = False
        self.channels_last = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(super().forward, x, use_reentrant=False)
        return super().forward(x)

    def subset(self, names: list[str]) -> ConvStage:
        """A stage with only the named blocks (shared, not copied) and the same switches."""
        part = ConvStage(OrderedDict((name, self.get_submodule(name)) for name in names), self.checkpointable)
        part.checkpointing, part.channels_last = self.checkpointing, self.channels_last
        return part


Stages = tuple[tuple[str, ...], ...]
"""A backbone's stages in order, each the module paths it holds: the stem first, the embedding layer
last. Fine-tuning counts them (optim.freeze_stages, optim.layer_decay)."""


class Backbone(nn.Sequential):
    """Images (B, 3, H, W) to embeddings (B, embedding_size) through named top-level modules.

    `stages` groups the modules by depth (see `Stages`): each backbone names its own beside its code,
    since only it knows where its stem ends and which layers make the embedding."""

    def __init__(
        self,
        modules: OrderedDict[str, nn.Module],
        embedding_size: int,
        input_size: tuple[int, int],
        stages: Sequence[Sequence[str]],
    ):
        super().__init__(modules)
        self.embedding_size = embedding_size
        self.input_size = tuple(input_size)
        self.stages: Stages = tuple(tuple(paths) for paths in stages)
        for name, _ in self.named_parameters():
            stage_of(name, self.stages)  # every parameter in exactly one stage, or a ValueError now

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Trade compute for memory: residual stages keep only their inputs and recompute in backward."""
        for module in self.modules():
            if isinstance(module, ConvStage) and module.checkpointable:
                module.checkpointing = enabled

    def set_metric_features(self, enabled: bool) -> bool:
        """Training forwards return `(embeddings, features before the BN neck)` for a metric loss.

        Only pooled re-id outputs have such features; False when this backbone has none."""
        outputs = [module for module in self.modules() if hasattr(module, "metric_features")]
        for module in outputs:
            module.metric_features = enabled
        return bool(outputs)

    def set_channels_last(self, enabled: bool) -> None:
        """NHWC weights and activations, which CPU oneDNN and CUDA tensor cores run faster."""
        self.to(memory_format=torch.channels_last if enabled else torch.contiguous_format)
        for module in self.modules():
            if isinstance(module, ConvStage):
                module.channels_last = enabled


def stage_of(name: str, stages: Stages) -> int:
    """The index of the stage holding the parameter or module `name` (as `named_parameters` names it,
    which a pipeline stage or a compiled backbone keeps)."""
    found = [
        index
        for index, paths in enumerate(stages)
        for path in paths
        if name == path or name.startswith(f"{path}.")
    ]
    if len(found) != 1:
        raise ValueError(f"backbone parameter {name} lies in {len(found)} of the stages {stages}, not one")
    return found[0]
