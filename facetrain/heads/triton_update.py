"""FusedSGD's update of a tile's rows as one Triton pass (`head.kernel: triton`), the radial part included.

Why: the torch path forms the radial part (a row-wise dot of the weight gradient with the weight, one
read of each), then d_p, the momentum buffer and the weight in three more elementwise passes, each
reading and writing tile-sized fp32 tensors; at C = 1M, D = 512 that is about 22 GB a step, most of the
tiled Triton step on an H200. Here each program holds a block of whole rows in registers (D padded to
a power of two): it reads the tile's raw weight gradient, the weight and the momentum buffer once,
takes the dot over D on-chip and writes the weight and the buffer once (about 10 GB a step).

The arithmetic is FusedSGD.update's, in fp32: radial = (g . w) / |w|^2, d_p = g - radial w + wd w,
buf = momentum buf + d_p (no buffer at momentum 0), w -= lr buf. Partial FC's rows are gathered and
scattered through the index inside the kernel (its rows are distinct, so no two programs share one).
Only fp32 weight and fp32 momentum storage: bf16 storage needs stochastic rounding and AdamW other
state, so both keep FusedOptimizer's torch update (`takes` says which). Under bf16 autocast the pass
also writes the head's bf16 copy of the rows it updates and their inverse norms (`row_stream.py`).

Import this module only when the kernel is wanted (triton is optional; `triton_tile.py` says why).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from facetrain.heads.class_rows import ClassRows
from facetrain.heads.kernel_choice import interpreting
from facetrain.heads.row_stream import RowStream
from facetrain.heads.triton_bf16 import bf16_nearest_even

INTERPRETED = interpreting()
ROW_ELEMENTS = 2048  # row block x padded D per program: 3 fp32 blocks in registers, 48 values a thread


@triton.jit
def _sgd_rows_kernel(weight_ptr, buffer_ptr, index_ptr, grad_ptr, inv_norm_ptr, stream_ptr, stream_norm_ptr, t, D,
                     start, lr, momentum, weight_decay, stride_w, stride_g, HAS_INDEX: tl.constexpr,
                     HAS_MOMENTUM: tl.constexpr, STREAM: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_D: tl.constexpr):  # fmt: skip
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    r_mask = r < t
    mask = r_mask[:, None] & (d < D)[None, :]
    if HAS_INDEX:
        w_rows = tl.load(index_ptr + r, mask=r_mask, other=0)
    else:
        w_rows = start + r
    w_offsets = w_rows.to(tl.int64)[:, None] * stride_w + d[None, :]  # 64-bit: C x D passes 2^31
    grad = tl.load(grad_ptr + r[:, None] * stride_g + d[None, :], mask=mask, other=0.0)
    w = tl.load(weight_ptr + w_offsets, mask=mask, other=0.0)
    inv_norm = tl.load(inv_norm_ptr + r, mask=r_mask, other=0.0)
    radial = tl.sum(grad * w, axis=1) * (inv_norm * inv_norm)
    step = grad + w * (weight_decay - radial)[:, None]
    if HAS_MOMENTUM:
        step = step + momentum * tl.load(buffer_ptr + w_offsets, mask=mask, other=0.0)
        tl.store(buffer_ptr + w_offsets, step, mask=mask)
    w = w - lr * step
    tl.store(weight_ptr + w_offsets, w, mask=mask)
    if STREAM:  # the bf16 copy and inverse norm the next step's logit kernels read (`row_stream.py`)
        tl.store(stream_ptr + w_offsets, bf16_nearest_even(w), mask=mask)
        squares = tl.sum(w * w, axis=1)
        tl.store(stream_norm_ptr + w_rows, 1.0 / tl.maximum(tl.sqrt(squares), 1e-12), mask=r_mask)


def takes(weight: torch.Tensor, buffer: torch.Tensor | None, raw_grad: torch.Tensor) -> bool:
    """Whether the kernel runs these rows: fp32 weight, buffer and gradient, contiguous (the buffer is
    addressed with the weight's offsets)."""
    tensors = [weight, raw_grad] + ([] if buffer is None else [buffer])
    return all(tensor.dtype == torch.float32 and tensor.is_contiguous() for tensor in tensors)


def sgd_rows(
    weight, buffer, rows: ClassRows, raw_grad, inv_norm, group: dict, stream: RowStream | None = None
):
    """FusedSGD.update of `rows` of `weight` and `buffer` (None at momentum 0) in place, from the tile's
    raw weight gradient (t x D), its rows' inverse norms (t,) and the optimizer's parameter `group` (lr,
    momentum, weight_decay); with a `stream`, also its bf16 copy of the updated rows and their inverse
    norms (the weight's offsets: the copy has the weight's shape)."""
    t, dim = raw_grad.shape
    block_d = triton.next_power_of_2(dim)
    # the interpreter takes few rows a block, so the tests' uneven tiles cross several blocks
    block_r = 4 if INTERPRETED else max(1, ROW_ELEMENTS // block_d)
    has_index = rows.index is not None
    stream_rows, stream_norms = (weight, inv_norm) if stream is None else (stream.rows, stream.inv_norms)
    _sgd_rows_kernel[(triton.cdiv(t, block_r),)](
        weight, weight if buffer is None else buffer, rows.index if has_index else weight, raw_grad,
        inv_norm, stream_rows, stream_norms, t, dim, rows.start, group["lr"], group["momentum"],
        group["weight_decay"], weight.stride(0), raw_grad.stride(0), HAS_INDEX=has_index,
        HAS_MOMENTUM=buffer is not None, STREAM=stream is not None, BLOCK_R=block_r, BLOCK_D=block_d,
        num_warps=max(4, min(16, block_d // 256)),
    )  # fmt: skip
