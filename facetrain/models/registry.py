"""The backbone registry, apart from `__init__` so that backbone modules can register without cycles."""

from __future__ import annotations

from torch import nn

from facetrain.registry import Registry

BACKBONES: Registry[nn.Module] = Registry("backbone")
