"""The tiled head's per-tile elementwise work after each logit GEMM, eager or compiled (`head.compile_tiles`).

Eagerly, a tile's softmax statistics take about ten passes over its B x T logits (scale, target gather
and mask, row max, shift, exp, sum) and its logit gradient four more: on a GPU each is a kernel launch
and a round trip through memory, so at T = 8192 the tile's GEMM is a fraction of its time. Compiled,
each function becomes one or two fused kernels. The functions work in place on the tile's logit
buffer, which eagerly saves a buffer and compiled costs one fused write-back. GEMMs, the optimizer
update and anything depending on the tile's position stay outside: a Python number that changes from
tile to tile (the tile's start, the learning rate) would make the compiled function recompile.
"""

from __future__ import annotations

import functools

import torch

from facetrain.heads.gradient_filter import TORCH_BLOCK, filter_blocks_
from facetrain.heads.tile_call import RowGradient, RunningRows, TileColumns


def _replace_where(buffer, in_tile, column, values):
    """buffer[i, column[i]] = values[i] for the rows whose target is in the tile, by mask (no host
    synchronisation); returns what those entries held before."""
    kept = buffer.gather(1, column).squeeze(1)
    buffer.scatter_(1, column, torch.where(in_tile, values, kept)[:, None])
    return kept


def online_softmax_tile(logits: torch.Tensor, tile: TileColumns, rows: RunningRows) -> RunningRows:
    """One tile's share of the online softmax: `logits` (B x t raw dot products) become scale * cos,
    then exp(logit - new row max) in place with each row's target column masked out (its margin is
    applied after the last tile). Returns the new running state (`RunningRows`): with the tile's
    `negatives` also the running max of the plain logits, with label smoothing (`rows.logit_sum` not
    None) the tile's (modulated) logits added, each row's own target left out."""
    in_tile, column, negatives = tile.in_tile, tile.column, tile.negatives
    running_max, plain_max, logit_sum = rows.running_max, rows.plain_max, rows.logit_sum
    logits.mul_(tile.column_factor)
    target_raw = torch.where(in_tile, _replace_where(logits, in_tile, column, float("-inf")), rows.target_raw)
    if negatives is not None:
        plain_max = torch.maximum(plain_max, logits.amax(dim=1))
        logits.copy_(negatives.modulated(logits, negatives.hard(logits)))
    if logit_sum is not None:
        _replace_where(logits, in_tile, column, 0.0)
        logit_sum = logit_sum + logits.sum(1)
        _replace_where(logits, in_tile, column, float("-inf"))
    new_max = torch.maximum(running_max, logits.amax(dim=1))
    # a row that has seen only its own (left out) target so far stays at -inf: shift by 0
    shift = torch.where(new_max == float("-inf"), 0.0, new_max)
    tile_sum = logits.sub_(shift[:, None]).exp_().sum(1)
    running_sum = rows.running_sum * (running_max - shift).exp() + tile_sum
    return RunningRows(new_max, running_sum, target_raw, plain_max, logit_sum)


def logit_grad_tile(exps: torch.Tensor, tile: TileColumns, rows: RowGradient):
    """The tile's gradient with respect to its raw dot products, in place of `exps` (B x t raw dot
    products): exp(logit - global max) (less label smoothing's `shift` a row, then times the
    modulation's slope where the margin modulates the negatives), the targets' corrected values, times
    scale / |w|. The row factor grad / (B sum_exp) is left to the B x D operands. With the gradient
    filter's row `limits`, the blocks below them are zeroed (`gradient_filter.filter_blocks_`) before the
    class factor; returns the gradient and which blocks were kept (None without the filter)."""
    column_factor, negatives, global_max, shift = (
        tile.column_factor,
        tile.negatives,
        rows.global_max,
        rows.shift,
    )
    if negatives is None:
        torch.addcmul(-global_max[:, None], exps, column_factor, out=exps).exp_()
        if shift is not None:
            exps.sub_(shift[:, None])
    else:
        modulated, slope = negatives.apply(exps.mul_(column_factor))
        modulated.sub_(global_max[:, None]).exp_()
        if shift is not None:
            modulated.sub_(shift[:, None])
        exps.copy_(modulated.mul_(slope))
    _replace_where(exps, tile.in_tile, tile.column, rows.corrected_target)
    kept = None if rows.limits is None else filter_blocks_(exps, rows.limits, TORCH_BLOCK)
    return exps.mul_(column_factor), kept


class TileOps:
    """The two per-tile functions, as given or compiled once per process (static shapes: a run's tiles
    have at most two widths, the full tile and the shard's remainder). The GEMM stays with the caller
    (`fused_gemm`; `triton_tile.TritonTileOps` fuses it)."""

    fused_gemm = False
    filter_block = TORCH_BLOCK

    def __init__(self, compiled: bool):
        self.compiled = compiled
        wrap = functools.partial(torch.compile, dynamic=False, fullgraph=True) if compiled else (lambda f: f)
        self.online_softmax = wrap(online_softmax_tile)
        self.logit_grad = wrap(logit_grad_tile)


EAGER_TILE_OPS = TileOps(compiled=False)


@functools.cache
def compiled_tile_ops() -> TileOps:
    return TileOps(compiled=True)


def tile_ops(compiled: bool, kernel: str = "torch"):
    """The tile ops of a plan; Triton's are imported only when asked for (triton is optional)."""
    if kernel == "triton":
        from facetrain.heads.triton_tile import TRITON_TILE_OPS

        return TRITON_TILE_OPS
    return compiled_tile_ops() if compiled else EAGER_TILE_OPS
