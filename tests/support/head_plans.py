"""Head plans for tests that run one check over both modes: no tile is the untiled head."""

from __future__ import annotations

import torch

from facetrain.heads import HeadPlan


def head_plan(
    tile: int | None, fused: bool = False, dtype: torch.dtype = torch.float32, compile_tiles: bool = False
) -> HeadPlan:
    """The untiled head's plan when `tile` is None, else the tiled head's, owning its optimizer when
    `fused`; the weight and the fused optimizer's state in `dtype`."""
    if tile is None:
        return HeadPlan(weight_dtype=dtype)
    return HeadPlan("tiled", tile, dtype, dtype, fused_optimizer=fused, compile_tiles=compile_tiles)
