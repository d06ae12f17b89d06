"""The tiled head's tile work as Triton kernels (`head.kernel: triton`): the logit GEMM fused with the
softmax statistics in the forward, and with the logit gradient in the backward.

Why: the torch tiles write each tile's B x T fp32 logits and pass over them about ten times in the
forward and four in the backward; on a GPU those passes, not the GEMMs, are most of the step. Here the
forward computes x_unit . w on-chip (fp32 accumulation), scales by |w|^-1 x scale (the class norms are
taken from the rows the kernel loads anyway and written out for the backward), masks each row's
target column and writes only a per-(row, class block) max and sum of exponentials, which torch
combines into the same running max and sum the torch tiles carry. The backward recomputes the logits
and writes the tile's logit gradient in the GEMM dtype; dX and the weight gradient stay cuBLAS GEMMs
(fp32 accumulation, deterministic, no atomics); the radial part and FusedSGD's update of fp32 rows
run as one pass (`triton_update.py`), other optimizers and storage in torch as on the torch path. Fusing dX and dW into the recompute would need a D-wide fp32
accumulator per block (D = 512: 128 KiB for 64 rows, past the registers) or one recompute per slice of
D, so the gradient tile goes through memory once, in bf16 under bf16.

The target's margin never enters the kernels: it is applied outside the tiles to the B-vector of
target logits (`margin_softmax.penalise_targets`, `target_gradient`). The forward leaves the target
column out and returns its raw logit; the backward writes the caller's `corrected_target` into that
column. So every margin that is a per-row function of the target cosine and the norm (ArcFace, AdaFace,
MagFace, ElasticFace) works through that hook unchanged. A margin that also modulates the negatives
(CurricularFace) passes its `margins.NegativeModulation` of the scaled logits as three B-vectors
(`MODULATE`): the forward applies it where it forms the logits and keeps the plain logits' block
maximum for the hits, the backward multiplies by its slope.

Operands follow the torch path's GEMM dtype (`margin_softmax.compute_dtype`): bf16 under bf16
autocast, fp32 otherwise, exact (`input_precision="ieee"`) unless torch's own fp32 GEMMs may use TF32
(`fp32_dot_precision`). fp64 runs the torch
tiles. Partial FC's sampled rows are gathered through the index inside the kernel.

Import this module only when the kernel is wanted: triton is optional, and it reads TRITON_INTERPRET
(the CPU interpreter, which the tests use) when the kernels below are decorated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from facetrain.errors import FacetrainError
from facetrain.heads.kernel_choice import interpreting
from facetrain.heads.tile_call import RowGradient, RunningRows, TileCall
from facetrain.heads.triton_bf16 import bf16_nearest_even

INTERPRETED = interpreting()  # as Triton decided when it decorated the kernels below
# Hopper-sized blocks of logits (128 x 128), fixed: the partial statistics' layout and the gradient
# filter's block follow them. The interpreter takes the smallest blocks tl.dot allows, so the tests'
# uneven tiles cross several blocks.
LOGIT_BLOCKS = {"BLOCK_B": 16, "BLOCK_C": 16} if INTERPRETED else {"BLOCK_B": 128, "BLOCK_C": 128}
# What triton.autotune picks per embedding width D and tile width T (and the operands' dtypes): the
# slice of D a step of the dot loop takes, warps and pipeline stages. The first is the former fixed
# choice (64 of D, 8 warps, 3 stages); at most 96 KiB of shared memory a stage with fp32 rows. Unmeasured
# until a GPU run (docs/head.md). The interpreter runs one config, so the tests never benchmark.
CONFIGS = (
    [triton.Config({"BLOCK_D": 16})]
    if INTERPRETED
    else [
        triton.Config({"BLOCK_D": block_d}, num_warps=warps, num_stages=stages)
        for block_d, warps, stages in ((64, 8, 3), (64, 8, 4), (32, 4, 4), (128, 8, 2))
    ]
)
BLOCKS = {**LOGIT_BLOCKS, **CONFIGS[0].all_kwargs()}  # the first config whole (what the tests compile)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # GEMM dtypes the kernels take


@triton.jit
def _tile_logits(x_ptr, w_ptr, index_ptr, b_offs, c_offs, B, T, D, tile_start, stride_x, stride_w,
                 HAS_INDEX: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, SQUARES: tl.constexpr,
                 WIDEN: tl.constexpr = INTERPRETED):  # fmt: skip
    """x_unit . w for a block (fp32), and with SQUARES the block's squared weight norms from the rows read
    (the stored ones: a bf16 copy's would not be the fp32 rows' norms)."""
    b_mask, c_mask = b_offs < B, c_offs < T
    if HAS_INDEX:
        w_rows = tl.load(index_ptr + c_offs, mask=c_mask, other=0)
    else:
        w_rows = tile_start + c_offs
    w_base = w_ptr + w_rows.to(tl.int64)[None, :] * stride_w  # 64-bit: C x D passes 2^31 past 4M x 512
    acc = tl.zeros((BLOCK_B, BLOCK_C), dtype=tl.float32)
    squares = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d_mask = d < D
        x = tl.load(
            x_ptr + b_offs[:, None] * stride_x + d[None, :], mask=b_mask[:, None] & d_mask[None, :], other=0.0
        )
        w = tl.load(w_base + d[:, None], mask=c_mask[None, :] & d_mask[:, None], other=0.0)
        if SQUARES:
            wide = w.to(tl.float32)
            squares += tl.sum(wide * wide, axis=0)
        if w.dtype != x.dtype and x.dtype == tl.float32:
            w = w.to(tl.float32)
        elif w.dtype != x.dtype and WIDEN and x.dtype == tl.bfloat16:  # the interpreter's cast truncates
            w = bf16_nearest_even(w)
        elif w.dtype != x.dtype:  # rounding named: the interpreter's default truncates
            w = w.to(x.dtype, fp_downcast_rounding="rtne")
        if WIDEN:  # the interpreter's bf16 tl.dot is wrong (Triton 3.8); fp32 of bf16 values is exact
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    return acc, squares


@triton.jit
def _program_block(B, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's block of rows and classes. Row blocks vary fastest, so the programs that share a
    block of weight rows run together and read it from L2."""
    pid = tl.program_id(0)
    row_blocks = (B + BLOCK_B - 1) // BLOCK_B
    pid_b, pid_c = pid % row_blocks, pid // row_blocks
    return pid_b, pid_c, pid_b * BLOCK_B + tl.arange(0, BLOCK_B), pid_c * BLOCK_C + tl.arange(0, BLOCK_C)


@triton.jit
def _modulated(logits, b_offs, b_mask, threshold_ptr, linear_ptr, quadratic_ptr):
    """`NegativeModulation.apply` on a block of scaled logits: the values and their slopes."""
    threshold = tl.load(threshold_ptr + b_offs, mask=b_mask, other=float("inf"))[:, None]
    linear = tl.load(linear_ptr + b_offs, mask=b_mask, other=1.0)[:, None]
    quadratic = tl.load(quadratic_ptr + b_offs, mask=b_mask, other=0.0)[:, None]
    hard = logits > threshold
    value = tl.where(hard, logits * (linear + quadratic * logits), logits)
    return value, tl.where(hard, linear + 2.0 * quadratic * logits, 1.0)


@triton.jit
def _softmax_stats_kernel(x_ptr, w_ptr, index_ptr, target_ptr, inv_norm_ptr, part_max_ptr, part_sum_ptr,
                          target_raw_ptr, threshold_ptr, linear_ptr, quadratic_ptr, part_plain_ptr,
                          B, T, D, tile_start, scale, stride_x, stride_w, c_blocks,
                          HAS_INDEX: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr,
                          BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, MODULATE: tl.constexpr,
                          NORMS_GIVEN: tl.constexpr):  # fmt: skip
    pid_b, pid_c, b_offs, c_offs = _program_block(B, BLOCK_B, BLOCK_C)
    b_mask, c_mask = b_offs < B, c_offs < T
    dots, squares = _tile_logits(x_ptr, w_ptr, index_ptr, b_offs, c_offs, B, T, D, tile_start, stride_x,
                                 stride_w, HAS_INDEX, BLOCK_B, BLOCK_C, BLOCK_D, PRECISION,
                                 not NORMS_GIVEN)  # fmt: skip
    if NORMS_GIVEN:  # the rows are the bf16 copy; the inverse norms of the fp32 rows came with it
        inv_norm = tl.load(inv_norm_ptr + c_offs, mask=c_mask, other=0.0)
    else:
        inv_norm = 1.0 / tl.maximum(tl.sqrt(squares), 1e-12)
        if pid_b == 0:
            tl.store(inv_norm_ptr + c_offs, inv_norm, mask=c_mask)
    logits = dots * (inv_norm * scale)[None, :]
    target = tl.load(target_ptr + b_offs, mask=b_mask, other=-1) - tile_start
    is_target = c_offs[None, :] == target[:, None]
    # the target's raw logit: its margin is applied outside, once per step
    in_block = (target >= pid_c * BLOCK_C) & (target < pid_c * BLOCK_C + BLOCK_C) & (target < T)
    tl.store(
        target_raw_ptr + b_offs, tl.sum(tl.where(is_target, logits, 0.0), axis=1), mask=b_mask & in_block
    )
    left_out = is_target | ~c_mask[None, :]
    out = b_offs * c_blocks + pid_c
    if MODULATE:  # the plain maximum for the hits, then the modulated logits (finite ones: no nan)
        tl.store(part_plain_ptr + out, tl.max(tl.where(left_out, float("-inf"), logits), axis=1), mask=b_mask)
        logits = _modulated(logits, b_offs, b_mask, threshold_ptr, linear_ptr, quadratic_ptr)[0]
    logits = tl.where(left_out, float("-inf"), logits)
    block_max = tl.max(logits, axis=1)
    shift = tl.where(block_max == float("-inf"), 0.0, block_max)
    block_sum = tl.sum(tl.exp(logits - shift[:, None]), axis=1)
    tl.store(part_max_ptr + out, block_max, mask=b_mask)
    tl.store(part_sum_ptr + out, block_sum, mask=b_mask)


@triton.jit
def _logit_grad_kernel(x_ptr, w_ptr, index_ptr, target_ptr, inv_norm_ptr, global_max_ptr, corrected_ptr,
                       out_ptr, threshold_ptr, linear_ptr, quadratic_ptr, limit_ptr, kept_ptr, B, T, D,
                       tile_start, scale, stride_x, stride_w, stride_out, c_blocks, HAS_INDEX: tl.constexpr,
                       BLOCK_B: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr, MODULATE: tl.constexpr, FILTER: tl.constexpr):  # fmt: skip
    pid_b, pid_c, b_offs, c_offs = _program_block(B, BLOCK_B, BLOCK_C)
    b_mask, c_mask = b_offs < B, c_offs < T
    dots, _ = _tile_logits(x_ptr, w_ptr, index_ptr, b_offs, c_offs, B, T, D, tile_start, stride_x, stride_w,
                           HAS_INDEX, BLOCK_B, BLOCK_C, BLOCK_D, PRECISION, False)  # fmt: skip
    column_factor = tl.load(inv_norm_ptr + c_offs, mask=c_mask, other=0.0) * scale
    global_max = tl.load(global_max_ptr + b_offs, mask=b_mask, other=0.0)
    if MODULATE:
        value, slope = _modulated(dots * column_factor[None, :], b_offs, b_mask, threshold_ptr, linear_ptr,
                                  quadratic_ptr)  # fmt: skip
        exps = tl.exp(value - global_max[:, None]) * slope
    else:
        exps = tl.exp(dots * column_factor[None, :] - global_max[:, None])
    target = tl.load(target_ptr + b_offs, mask=b_mask, other=-1) - tile_start
    corrected = tl.load(corrected_ptr + b_offs, mask=b_mask, other=0.0)
    grad = tl.where(c_offs[None, :] == target[:, None], corrected[:, None], exps)
    if FILTER:  # the gradient filter (`gradient_filter.py`): a block all below its rows' limits is zeroed
        limit = tl.load(limit_ptr + b_offs, mask=b_mask, other=float("inf"))
        above = (tl.abs(grad) >= limit[:, None]) & c_mask[None, :]
        kept = tl.max(tl.max(above.to(tl.int32), axis=1), axis=0)
        tl.store(kept_ptr + pid_b * c_blocks + pid_c, kept.to(tl.int8))
        grad = grad * (kept > 0).to(tl.float32)
    grad = grad * column_factor[None, :]
    out = out_ptr + b_offs[:, None] * stride_out + c_offs[None, :]
    tl.store(
        out,
        grad.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
        mask=b_mask[:, None] & c_mask[None, :],
    )


_softmax_stats = triton.autotune(CONFIGS, key=["D", "T"])(_softmax_stats_kernel)
_logit_grad = triton.autotune(CONFIGS, key=["D", "T"])(_logit_grad_kernel)


def _launch_args(tile: TileCall) -> tuple:
    """The grid, the pointers, sizes and strides both kernels start with, and whether an index gathers
    the rows. The rows read are the head's bf16 copy where the tile has one (`row_stream.py`)."""
    x_op, rows = tile.x_op, tile.rows
    weight = tile.weight if tile.stream is None else tile.stream.rows
    if x_op.device.type != "cuda" and not INTERPRETED:
        raise FacetrainError(
            f"head.kernel triton needs CUDA inputs (got {x_op.device.type}); use head.kernel auto or torch, "
            "or TRITON_INTERPRET=1 for Triton's CPU interpreter"
        )
    has_index = rows.index is not None
    batch, width = x_op.shape[0], len(rows)
    grid = (triton.cdiv(batch, LOGIT_BLOCKS["BLOCK_B"]) * triton.cdiv(width, LOGIT_BLOCKS["BLOCK_C"]),)
    pointers = (x_op, weight, rows.index if has_index else weight, tile.target_column, tile.inv_norm)
    sizes = (batch, width, x_op.shape[1], rows.start, tile.scale, x_op.stride(0), weight.stride(0))
    return grid, pointers, sizes, has_index


def fp32_dot_precision() -> str:
    """fp32 dots as torch's fp32 GEMMs compute them: exact (ieee) under torch's default "highest", on
    TF32 tensor cores where torch.set_float32_matmul_precision allows it (the trainer's "high" on CUDA),
    so the Triton tiles never do the slower, more exact work beside TF32 torch GEMMs."""
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _modulation_args(negatives, like: torch.Tensor) -> tuple:
    """The modulation's three B-vectors, or placeholders the kernel never reads (MODULATE off)."""
    return tuple(v.contiguous() for v in negatives) if negatives is not None else (like, like, like)


def online_softmax_rows(tile: TileCall, rows: RunningRows) -> RunningRows:
    """One tile's share of the online softmax from the stored rows (`tile_kernel.online_softmax_tile`'s
    result without its B x T logits): writes the tile's inverse norms into `tile.inv_norm` and its
    targets' raw logits into `rows.target_raw`; returns the new running state (no `logit_sum`: label
    smoothing runs on the torch tiles)."""
    grid, pointers, sizes, has_index = _launch_args(tile)
    running_max, negatives = rows.running_max, tile.negatives
    if tile.stream is not None:  # the fp32 rows' inverse norms, kept with the copy
        tile.inv_norm.copy_(tile.rows.read(tile.stream.inv_norms, torch.float32))
    c_blocks = triton.cdiv(len(tile.rows), LOGIT_BLOCKS["BLOCK_C"])
    part_max = running_max.new_empty(tile.x_op.shape[0], c_blocks)
    part_sum = torch.empty_like(part_max)
    part_plain = torch.empty_like(part_max) if negatives is not None else part_max
    _softmax_stats[grid](
        *pointers, part_max, part_sum, rows.target_raw, *_modulation_args(negatives, running_max), part_plain,
        *sizes, c_blocks, HAS_INDEX=has_index, PRECISION=fp32_dot_precision(), MODULATE=negatives is not None,
        NORMS_GIVEN=tile.stream is not None, **LOGIT_BLOCKS,
    )  # fmt: skip
    tile_max = part_max.amax(dim=1)
    new_max = torch.maximum(running_max, tile_max)
    # a row that has seen only its own (left out) target so far stays at -inf: shift by 0
    shift = torch.where(new_max == float("-inf"), 0.0, new_max)
    tile_sum = (part_sum * (part_max - shift[:, None]).exp()).sum(dim=1)
    plain_max = rows.plain_max
    if negatives is not None:
        plain_max = torch.maximum(plain_max, part_plain.amax(dim=1))
    running_sum = rows.running_sum * (running_max - shift).exp() + tile_sum
    return RunningRows(new_max, running_sum, rows.target_raw, plain_max)


def logit_grad_rows(tile: TileCall, rows: RowGradient, out: torch.Tensor):
    """The tile's gradient with respect to its raw dot products (`tile_kernel.logit_grad_tile`'s), from
    the logits recomputed on-chip, into `out` (B x t in the GEMM dtype), and with the gradient filter's
    row `limits` which blocks it kept (row blocks x class blocks, int8; None without the filter).
    Label smoothing's `shift` is the torch tiles' alone."""
    grid, pointers, sizes, has_index = _launch_args(tile)
    c_blocks = triton.cdiv(len(tile.rows), LOGIT_BLOCKS["BLOCK_C"])
    global_max, limits, kept = rows.global_max, rows.limits, None
    if limits is not None:
        row_blocks = triton.cdiv(tile.x_op.shape[0], LOGIT_BLOCKS["BLOCK_B"])
        kept = torch.empty(row_blocks, c_blocks, dtype=torch.int8, device=out.device)
    _logit_grad[grid](
        *pointers, global_max, rows.corrected_target, out, *_modulation_args(tile.negatives, global_max),
        global_max if limits is None else limits, out if kept is None else kept, *sizes, out.stride(0),
        c_blocks, HAS_INDEX=has_index, PRECISION=fp32_dot_precision(), MODULATE=tile.negatives is not None,
        FILTER=limits is not None, **LOGIT_BLOCKS,
    )  # fmt: skip
    return out, kept


class TritonTileOps:
    """`tile_kernel.TileOps`' counterpart for `TiledMarginSoftmax`: the tile's GEMM is inside its ops."""

    fused_gemm = True
    filter_block = (
        LOGIT_BLOCKS["BLOCK_B"],
        LOGIT_BLOCKS["BLOCK_C"],
    )  # the gradient filter skips the kernels' blocks
    compiled = False
    dtypes = DTYPES
    online_softmax_rows = staticmethod(online_softmax_rows)
    logit_grad_rows = staticmethod(logit_grad_rows)


TRITON_TILE_OPS = TritonTileOps()
