"""The backbone registry, apart from `__init__` so that backbone modules can register without cycles."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from facetrain.registry import Registry

BACKBONES: Registry[nn.Module] = Registry("backbone")

# Backbones whose output is a `PooledEmbedding`: model.bn_neck (false: no BN neck), model.pooling and
# model.ibn apply to these alone (their factories take `pooling` and `ibn` too), and the config check
# reads this set without building a backbone.
POOLED_OUTPUT_BACKBONES: set[str] = set()


def register_pooled(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """`BACKBONES.register(name)` for a backbone that ends in a `PooledEmbedding`."""
    POOLED_OUTPUT_BACKBONES.add(name)
    return BACKBONES.register(name)
