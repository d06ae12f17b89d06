"""The tiled head's optional gradient filter (`head.gradient_filter`, as Cut Cross-Entropy's `filter_eps`).

Why: after the first steps most of a row's softmax probabilities are far below bf16's resolution, so
most blocks of the backward's logit gradient add nothing a bf16 GEMM could keep. A block of
`block[0]` rows x `block[1]` classes whose every entry of d loss / d logit, in units of the row's
softmax (p - onehot, times a margin's slopes; before the row's factor 1 / rows and the class's
scale / |w|), is below the threshold in magnitude is skipped: zeroed, and left out of the dX and dW
products where the kernel can leave it out. Padding rows never hold a block back (their gradient is
zero anyway).

The filter is approximate and off by default (threshold 0: exact). What it can cost is bounded by what
it skips: every skipped entry is below the threshold t, so with n valid rows, scale s and unit rows,
row i's gradient of its unit embedding moves by at most s t k_i / n (k_i its skipped entries) and class
j's gradient of its unit weight row by at most s t r_j / n (r_j its skipped rows); through the norms,
dX_i by at most that over |x_i| and dW_j over |w_j|. The loss is untouched (the forward never filters).
"""

from __future__ import annotations

import torch

TORCH_BLOCK = (16, 16)
"""The torch tiles' block (rows, classes): the Triton interpreter's, so the two skip the same blocks."""

CCE_DEFAULT = 2.0**-12
"""Cut Cross-Entropy's default for bf16 inputs: bf16's epsilon (2^-7) / 32."""


def row_limits(threshold: float, row_stats: torch.Tensor) -> torch.Tensor:
    """Each row's threshold in the kernels' unscaled units (the row's sum of exponentials stands for a
    probability of 1); infinite for padding rows (an infinite denominator: `margin_softmax.softmax_loss`)."""
    sum_exp, denominator = row_stats.unbind(0)
    return torch.where(torch.isfinite(denominator), sum_exp * threshold, float("inf"))


def filter_blocks_(values: torch.Tensor, limits: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Zero, in place, each block of `values` (B x t, unscaled units) whose entries are all below their
    row's limit in magnitude; returns which blocks are kept (row blocks x class blocks, bool)."""
    rows, classes = values.shape
    block_rows, block_classes = block
    row_blocks, class_blocks = -(-rows // block_rows), -(-classes // block_classes)
    below = values.abs() < limits[:, None]  # the edges' missing entries count as below
    below = torch.nn.functional.pad(below, (0, class_blocks * block_classes - classes,
                                            0, row_blocks * block_rows - rows), value=True)  # fmt: skip
    kept = ~below.view(row_blocks, block_rows, class_blocks, block_classes).all(dim=3).all(dim=1)
    spread = kept.repeat_interleave(block_rows, 0).repeat_interleave(block_classes, 1)
    values.masked_fill_(~spread[:rows, :classes], 0.0)
    return kept
