"""A bf16 copy of the tiled head's fp32 class rows, for the Triton logit kernels under bf16 autocast.

Why: the two logit kernels read every weight row each step (the forward's statistics, the backward's
recompute), and under bf16 autocast their GEMM takes bf16 rows: read from fp32 storage, that is 4 D
bytes a class for 2 D of use, and a conversion inside the dot loop. FusedSGD's single-pass update
(`triton_update.py`) already holds each updated row in registers, so it also writes the row rounded to
bf16 (to nearest even, as torch's cast) and its inverse norm, and the next step's kernels read those:
half the bytes, and the GEMM operands are exactly the torch tiles' (`w.to(torch.bfloat16)`). The
inverse norms are of the fp32 rows, as the torch path takes them.

The copy costs 2 D + 4 bytes a class (`memory.py`'s `row_stream`). It is valid while the weight holds
what the update kernel last wrote: anything else that writes the weight through torch (a checkpoint
load, imprinting, the torch update of a tile) moves the weight's version counter, and the next forward
copies the whole weight again (one pass) before it reads. Kernel writes do not move the counter; that is
what lets the update keep the copy in step.
"""

from __future__ import annotations

import torch

from facetrain.heads.margin_softmax import EPS
from facetrain.heads.plan import HeadPlan


class RowStream:
    """The bf16 copy of a tiled head's fp32 weight (`rows`, the weight's shape) and the inverse norms of
    its fp32 rows (`inv_norms`), made at first use on the weight's device and kept in step by the update
    kernel. Not part of the head's state: a checkpoint holds the weight, and the copy is made again."""

    def __init__(self):
        self.rows: torch.Tensor | None = None
        self.inv_norms: torch.Tensor | None = None
        self._copied_from: tuple | None = None  # the weight's storage and version the copy holds

    def refresh(self, weight: torch.Tensor) -> None:
        """Copy `weight` where it changed since the copy was made or last kept in step (its storage moved or
        torch wrote it: the version counter moved); nothing otherwise."""
        source = (weight.data_ptr(), weight._version, weight.shape, weight.device)
        if source == self._copied_from:
            return
        with torch.no_grad():
            if self.rows is None or self.rows.shape != weight.shape or self.rows.device != weight.device:
                self.rows = torch.empty(weight.shape, dtype=torch.bfloat16, device=weight.device)
                self.inv_norms = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
            self.rows.copy_(weight)  # to nearest even, as the torch tiles' cast of their GEMM operand
            torch.linalg.vector_norm(weight, dim=1, out=self.inv_norms).clamp_min_(EPS).reciprocal_()
        self._copied_from = source


def streams_rows(plan: HeadPlan) -> bool:
    """Whether a head of this plan holds a `RowStream`: Triton tiles updating fp32 rows with their fused
    optimizer. A step uses it under bf16 autocast where the optimizer's single pass keeps it in step
    (`FusedOptimizer.keeps_stream`: FusedSGD with fp32 state)."""
    return plan.kernel == "triton" and plan.fused_optimizer and plan.weight_dtype == torch.float32
