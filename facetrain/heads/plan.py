"""How a sharded head computes and stores its classes, decided once before it is built (`HeadPlan`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("untiled", "tiled")
TILE_KERNELS = ("torch", "triton")


@dataclass(frozen=True)
class HeadPlan:
    """Untiled (the fastest: one B x C/N logit buffer) or tiled (B x `tile_classes` logits at a time,
    `compile_tiles` compiling each tile's elementwise work, or `kernel` "triton" running each tile as
    Triton kernels), the weight's storage dtype, and whether the tiled head updates itself with a fused
    optimizer keeping its state in `state_dtype` (docs/head.md). `kernel` is resolved (head.kernel auto:
    `facetrain.heads.kernel_choice.resolve_kernel`). `gradient_filter` > 0 lets the tiled backward skip
    blocks of the logit gradient below that probability (approximate: `facetrain.heads.gradient_filter`).
    `facetrain train` resolves one from the config (`facetrain.train.head_plan`); a library user writes
    it: `HeadPlan()`, or `HeadPlan("tiled", 8192, fused_optimizer=True)`."""

    mode: str = "untiled"
    tile_classes: int = 8192
    weight_dtype: torch.dtype = torch.float32
    state_dtype: torch.dtype = torch.float32
    fused_optimizer: bool = False
    compile_tiles: bool = False
    kernel: str = "torch"
    gradient_filter: float = 0.0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"a head plan's mode is one of {', '.join(MODES)}, not {self.mode!r}")
        if self.tile_classes < 1:
            raise ValueError(f"a head plan's tile_classes must be >= 1, got {self.tile_classes}")
        if self.kernel not in TILE_KERNELS:
            raise ValueError(f"a head plan's kernel is one of {', '.join(TILE_KERNELS)}, not {self.kernel!r}")
        if self.kernel == "triton" and not self.tiled:
            raise ValueError("the triton kernel runs the tiled head's tiles: HeadPlan('tiled', ...)")
        if not 0.0 <= self.gradient_filter < 1.0:
            raise ValueError(f"a head plan's gradient_filter must be in [0, 1), got {self.gradient_filter}")
        if self.gradient_filter and not self.tiled:
            raise ValueError("the gradient filter skips the tiled head's blocks: HeadPlan('tiled', ...)")
        if self.fused_optimizer and not self.tiled:
            raise ValueError("the fused head optimizer needs the tiled head: HeadPlan('tiled', ...)")

    @property
    def tiled(self) -> bool:
        return self.mode == "tiled"


UNTILED = HeadPlan()
