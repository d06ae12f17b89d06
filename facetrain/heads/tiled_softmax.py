"""Margin softmax cross-entropy over a class shard, one tile of classes at a time (`TiledMarginSoftmax`).

The untiled Function keeps a B x C/N buffer from the forward to the backward. This one never holds
more than B x T logits (T = head.tile_classes): the forward walks the tiles with an online row max and
sum of exponentials, and the backward recomputes each tile's logits (one extra GEMM) to produce that
tile's logit gradient, accumulates the embedding gradient, and either updates the tile's rows at once
with the head's fused optimizer or writes its rows of a weight gradient. Activation memory is
O(B x T + B x D), whatever the number of classes; only a per-class norm (one float a class) is kept
between forward and backward.

The cross-rank statistics, the margin and the loss are `margin_softmax.py`'s, shared with the untiled
kernel. Each tile's work is `tile_kernel.py`'s torch ops after a torch GEMM, or (`head.kernel: triton`)
`triton_tile.py`'s kernels, which fuse the GEMM in and never write the B x T logits of the forward;
with them FusedSGD updates fp32 rows in one pass with the radial part (`triton_update.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import facetrain.heads.collectives as collectives
import facetrain.heads.margin_softmax as ms
from facetrain.heads.class_rows import class_tiles
from facetrain.heads.fused_optim import FusedOptimizer
from facetrain.heads.gradient_filter import row_limits
from facetrain.heads.logit_gemm import LogitGemm
from facetrain.heads.row_stream import RowStream
from facetrain.heads.scratch import Scratch
from facetrain.heads.tile_call import RowGradient, RunningRows, TileCall, TileColumns
from facetrain.heads.tile_kernel import EAGER_TILE_OPS, TileOps


def _tile_dots(scratch, gemm, x_op, weight, rows, inv_norm):
    """x_unit . w for the tile (B x t, in `inv_norm`'s dtype); the inverse norms of its weight rows are
    written into `inv_norm`, the tile's slice of the shard's vector.

    Every tile-sized temporary lives in `scratch` (`heads/scratch.py` says why).
    """
    stored = rows.read(weight, weight.dtype)  # a view, or Partial FC's rows: never converted twice
    current = scratch.cast("current", stored, inv_norm.dtype)
    torch.linalg.vector_norm(current, dim=1, out=inv_norm).clamp_min_(ms.EPS).reciprocal_()
    same = gemm.operand_dtype == current.dtype
    w_op = current if same else scratch.cast("operand", stored, gemm.operand_dtype)
    return gemm.mm(x_op, w_op.t(), out=scratch.get("logits", x_op.shape[0], len(rows), inv_norm.dtype))


def _target_cos(x_unit, weight, index, target_column):
    """Each row's plain target cosine where this rank owns the target (any value elsewhere), from the
    B target rows alone: a margin that modulates the negatives needs every row's before the tiles."""
    rows = target_column.clamp_min(0)
    if index is not None:
        rows = index[rows]
    w = weight[rows].to(x_unit.dtype)
    return torch.einsum("bd,bd->b", x_unit, w) / torch.linalg.vector_norm(w, dim=1).clamp_min(ms.EPS)


def _target_in_tile(target_column, rows):
    """Which rows have their target in this tile, and its column within the tile (0 where not)."""
    in_tile = (target_column >= rows.start) & (target_column < rows.stop)
    return in_tile, (target_column - rows.start).clamp(0, len(rows) - 1)[:, None]


def _logit_grad(ctx, scratch: Scratch, gemm: LogitGemm, tile: TileCall, w, w_op, rows: RowGradient):
    """The torch tiles' logit gradient: the recomputed logits, then `tile_kernel.logit_grad_tile`; and
    with the gradient filter's `limits`, which blocks it kept."""
    w_logit_op = w if gemm.operand_dtype == w.dtype else w_op
    logits_out = scratch.get("logits", tile.x_op.shape[0], len(tile.rows), w.dtype)
    dots = gemm.mm(tile.x_op, w_logit_op.t(), out=logits_out)
    in_tile, column = _target_in_tile(tile.target_column, tile.rows)
    columns = TileColumns(tile.inv_norm * tile.scale, in_tile, column, tile.negatives)
    logit_grad, kept = ctx.tile_ops.logit_grad(dots, columns, rows)
    return scratch.cast("grad_raw", logit_grad, ctx.compute_dtype), kept


def _kept_columns(kept: torch.Tensor, block: tuple[int, int], width: int) -> torch.Tensor | None:
    """The tile's columns in a block of classes the gradient filter kept for some row (the others are
    zero in every row), or None when it kept every block of classes. One host synchronisation a tile."""
    blocks = kept.bool().any(dim=0)
    if bool(blocks.all()):
        return None
    return blocks.repeat_interleave(block[1])[:width].nonzero().squeeze(1)


class TiledSettings(NamedTuple):
    """How `TiledMarginSoftmax` walks this rank's shard: `index` None (every row of the shard, in order)
    or the sorted rows Partial FC kept; `tile_classes` columns a tile; `optimizer` the head's
    FusedOptimizer, or None to return a c x D weight gradient instead; the `tile_ops` (torch, compiled or
    Triton: `tile_kernel.tile_ops`); `gradient_filter` the threshold of `gradient_filter.py`'s filter of
    the backward (0: exact); `stream` the head's bf16 copy of its rows (`row_stream.py`), or None."""

    index: torch.Tensor | None
    tile_classes: int
    optimizer: FusedOptimizer | None = None
    tile_ops: TileOps = EAGER_TILE_OPS
    gradient_filter: float = 0.0
    stream: RowStream | None = None


def _row_stream(settings: TiledSettings, tile_ops, gemm_dtype: torch.dtype, weight: torch.Tensor):
    """The head's bf16 copy of its rows, made fresh, where this step's Triton kernels read it: bf16 GEMMs
    over fp32 rows whose fused optimizer keeps the copy in step (`row_stream.py`); else None."""
    stream, optimizer = settings.stream, settings.optimizer
    if (
        stream is None
        or not tile_ops.fused_gemm
        or gemm_dtype != torch.bfloat16
        or weight.dtype != torch.float32
    ):
        return None
    if optimizer is None or not optimizer.keeps_stream(weight):
        return None
    stream.refresh(weight)
    return stream


class TiledMarginSoftmax(torch.autograd.Function):
    """loss = mean over the global batch of CE(scale * margin(cos), target), tile by tile.

    Inputs: `embeddings` (B x D, the global batch); `weight` (c x D, this rank's whole shard, any
    storage dtype); `step` (`ms.StepInputs`: its `target_column` is each row's target among the columns
    `settings.index` keeps, -1 where another rank owns it; label smoothing runs on the torch tiles only);
    `settings` (`TiledSettings`). Returns the loss (identical on every rank) and the global top-1 hit
    count (no gradient).
    """

    @staticmethod
    def forward(ctx, embeddings: torch.Tensor, weight: torch.Tensor, step: ms.StepInputs,
                settings: TiledSettings):  # fmt: skip
        index, tile_ops = settings.index, settings.tile_ops
        target_column, scale, smoothing = step.target_column, step.scale, step.smoothing
        gemm_dtype = ms.compute_dtype(embeddings.device, embeddings.dtype)
        width = weight.shape[0] if index is None else index.shape[0]
        tiles = class_tiles(width, settings.tile_classes, index)
        with torch.autocast(embeddings.device.type, enabled=False):
            x_unit, x_norm = ms.unit_rows(embeddings)
            has_target = target_column >= 0
            margin = ms.step_margin(
                step, x_norm, lambda: (_target_cos(x_unit, weight, index, target_column), has_target)
            )
            negatives = None if margin.negatives is None else margin.negatives.scaled(scale)
            if tile_ops.fused_gemm and gemm_dtype not in tile_ops.dtypes:
                tile_ops = EAGER_TILE_OPS  # fp64 (the exactness tests' dtype) runs the torch tiles
            if tile_ops.fused_gemm and smoothing.epsilon:
                raise ValueError("label smoothing runs on the torch tiles: HeadPlan(kernel='torch')")
            gemm = LogitGemm(x_unit.device, gemm_dtype, x_unit.dtype)
            x_op = x_unit.to(gemm_dtype if tile_ops.fused_gemm else gemm.operand_dtype)
            stream = _row_stream(settings, tile_ops, gemm_dtype, weight)

            # Online softmax over the tiles. A row's own target column is left out (set to -inf) and
            # merged after the loop, once its margin is known: the margin is evaluated once per step.
            no_max = x_unit.new_full((x_unit.shape[0],), float("-inf"))
            running = RunningRows(
                no_max, torch.zeros_like(no_max), torch.zeros_like(no_max),
                None if negatives is None else no_max.clone(),
                torch.zeros_like(no_max) if smoothing.epsilon else None,
            )  # fmt: skip
            inv_norms = x_unit.new_empty(width)
            scratch = Scratch(x_unit.device)
            for rows in tiles:
                tile_norms = inv_norms[rows.start : rows.stop]
                if tile_ops.fused_gemm:
                    tile = TileCall(x_op, weight, rows, tile_norms, scale, target_column, negatives, stream)
                    running = tile_ops.online_softmax_rows(tile, running)
                    continue
                dots = _tile_dots(scratch, gemm, x_op, weight, rows, tile_norms)
                in_tile, column = _target_in_tile(target_column, rows)
                columns = TileColumns(tile_norms * scale, in_tile, column, negatives)
                running = tile_ops.online_softmax(dots, columns, running)
            running_max, running_sum, target_raw, plain_max, logit_sum = running

            target_logit, margin_slope, norm_slope = ms.penalise_targets(
                margin, target_raw, has_target, scale, x_norm
            )
            row_max = torch.where(has_target, torch.maximum(running_max, target_logit), running_max)
            sum_exp = running_sum * (running_max - row_max).exp()
            sum_exp = sum_exp + torch.where(has_target, (target_logit - row_max).exp(), 0.0)
            if plain_max is None:
                global_max = collectives.all_reduce_(row_max.clone(), "max", step.group)
            else:  # one all-reduce for both maxima (the plain one with the targets, for the hits)
                maxima = torch.stack(
                    [row_max, torch.where(has_target, torch.maximum(plain_max, target_raw), plain_max)]
                )
                global_max, plain_max = collectives.all_reduce_(maxima, "max", step.group)
            if logit_sum is not None:  # the tiles left each row's own target out
                logit_sum = logit_sum + torch.where(has_target, target_logit, 0.0)
            loss, row_stats, hit_count = ms.softmax_loss(
                sum_exp * (row_max - global_max).exp(), target_logit, target_raw, has_target, global_max, step,
                plain_max, logit_sum,
            )  # fmt: skip

        ctx.save_for_backward(
            x_unit, x_norm, weight, index, inv_norms, target_column, target_logit,
            margin_slope, norm_slope, row_stats, global_max,
        )  # fmt: skip
        ctx.negatives, ctx.smoothing, ctx.gradient_filter = negatives, smoothing, settings.gradient_filter
        ctx.scale, ctx.tile_classes, ctx.tile_ops = scale, settings.tile_classes, tile_ops
        ctx.optimizer, ctx.stream = settings.optimizer, stream
        ctx.compute_dtype, ctx.embedding_dtype = gemm_dtype, embeddings.dtype
        ctx.mark_non_differentiable(hit_count)
        return loss, hit_count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, _grad_hits):
        (
            x_unit, x_norm, weight, index, inv_norms, target_column, target_logit,
            margin_slope, norm_slope, row_stats, global_max,
        ) = ctx.saved_tensors  # fmt: skip
        scale, optimizer = ctx.scale, ctx.optimizer
        wants_x, wants_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        stat_dtype, batch = x_unit.dtype, x_unit.shape[0]
        width = inv_norms.shape[0]
        with torch.autocast(x_unit.device.type, enabled=False), torch.no_grad():
            gemm = LogitGemm(x_unit.device, ctx.compute_dtype, stat_dtype)
            fused_gemm = ctx.tile_ops.fused_gemm
            x_logit_op = x_unit.to(ctx.compute_dtype if fused_gemm else gemm.operand_dtype)
            at_target = (target_logit - global_max).exp()
            has_target = target_column >= 0
            row_factor, corrected_target, grad_norm, shift = ms.target_gradient(
                row_stats, grad_loss, at_target, margin_slope, norm_slope, has_target, scale, ctx.smoothing
            )
            scaled_x = (x_unit * row_factor[:, None]).to(ctx.compute_dtype)
            limits = row_limits(ctx.gradient_filter, row_stats) if ctx.gradient_filter else None
            gradient_rows = RowGradient(global_max, corrected_target, shift, limits)
            grad_x_unit = torch.zeros_like(x_unit) if wants_x else None
            grad_weight = torch.zeros_like(weight) if wants_weight and optimizer is None else None
            if wants_weight and optimizer is not None:
                optimizer.begin_step()
            single_pass = fused_gemm and optimizer is not None  # offered to Triton's tiles only

            scratch = Scratch(x_unit.device)
            for rows in class_tiles(width, ctx.tile_classes, index):
                stored = rows.read(weight, weight.dtype)
                w = scratch.cast("current", stored, stat_dtype)
                if ctx.stream is not None:  # the copy holds the rows rounded as the cast below would
                    w_op = rows.read(ctx.stream.rows, ctx.compute_dtype)
                else:
                    w_op = scratch.cast("operand", stored, ctx.compute_dtype) if gemm.reduced else w
                inv_norm = inv_norms[rows.start : rows.stop]
                tile = TileCall(
                    x_logit_op, weight, rows, inv_norm, scale, target_column, ctx.negatives, ctx.stream
                )
                if fused_gemm:
                    grad_raw, kept = ctx.tile_ops.logit_grad_rows(
                        tile, gradient_rows, scratch.get("grad_raw", batch, len(rows), ctx.compute_dtype)
                    )
                else:
                    grad_raw, kept = _logit_grad(ctx, scratch, gemm, tile, w, w_op, gradient_rows)
                columns = None if kept is None else _kept_columns(kept, ctx.tile_ops.filter_block, len(rows))
                if columns is not None:  # the gradient filter left these classes out of both products
                    grad_raw, w_op = grad_raw.index_select(1, columns), w_op.index_select(0, columns)
                if wants_x and grad_raw.dtype == stat_dtype:
                    grad_x_unit.addmm_(grad_raw, w_op)
                elif wants_x:
                    grad_x_unit += torch.mm(grad_raw, w_op).to(stat_dtype)
                if not wants_weight:
                    continue
                raw_grad = scratch.mm("weight_grad", grad_raw.t(), scaled_x, stat_dtype)
                if columns is not None:  # the classes left out have no gradient but are still updated
                    all_rows = scratch.get("weight_grad_rows", len(rows), raw_grad.shape[1], stat_dtype)
                    raw_grad = all_rows.zero_().index_copy_(0, columns, raw_grad)
                if single_pass and optimizer.single_pass_update(weight, rows, raw_grad, inv_norm, ctx.stream):
                    continue  # the radial part and the update in one Triton pass
                # through 1/|w|: the component along w is removed, per class
                radial = scratch.rowwise_dot(raw_grad, w, block=len(rows)).mul_(inv_norm.square())
                if optimizer is not None:
                    optimizer.update(weight, rows, w, raw_grad, radial)
                else:
                    rows.write(grad_weight, raw_grad.addcmul_(w, radial[:, None], value=-1.0))

            grad_x = None
            if wants_x:
                grad_x_unit.mul_(row_factor[:, None])
                grad_x = ms.through_normalization(grad_x_unit, x_unit, x_norm, grad_norm).to(
                    ctx.embedding_dtype
                )
        return grad_x, grad_weight, None, None
