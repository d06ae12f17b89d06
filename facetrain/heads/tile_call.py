"""What a tile call of the tiled head carries, one object each, shared by the torch tiles
(`tile_kernel.py`), the Triton tiles (`triton_tile.py`) and the Function that walks the tiles
(`tiled_softmax.py`): the tile (`TileCall`, or `TileColumns` for the torch twins), the online softmax's
running rows, and the backward's per-row values."""

from __future__ import annotations

from typing import NamedTuple

import torch

from facetrain.heads.class_rows import ClassRows
from facetrain.heads.row_stream import RowStream


class TileCall(NamedTuple):
    """One tile of a pass over the shard, as the Triton launchers take it whole (`triton_tile.py`; the
    torch tiles take its tensors as `TileColumns`): the unit embeddings as the GEMM's operand (`x_op`),
    the stored `weight` and the tile's `rows` of it (`ClassRows`), the tile's slice of the inverse row
    norms (written by the forward, read by the backward), the logit scale, each row's target column
    among the pass's columns (-1 where another rank owns it), the margin's modulation of the negatives
    (None for most margins) and the head's bf16 copy of the rows (`row_stream.RowStream`, None where the
    kernels read the stored rows)."""

    x_op: torch.Tensor
    weight: torch.Tensor
    rows: ClassRows
    inv_norm: torch.Tensor
    scale: float
    target_column: torch.Tensor
    negatives: object = None
    stream: RowStream | None = None


class TileColumns(NamedTuple):
    """A tile as the torch twins see it: tensors only (a Python number that changes from tile to tile
    would make the compiled functions recompile). `column_factor` is scale / |w| a column; `in_tile`
    says which rows have their target in the tile and `column` (B x 1) where; `negatives` is the
    margin's `NegativeModulation` of the scaled logits, or None."""

    column_factor: torch.Tensor
    in_tile: torch.Tensor
    column: torch.Tensor
    negatives: object = None


class RunningRows(NamedTuple):
    """The online softmax's per-row state, carried from tile to tile: the running max of the logits and
    sum of exp(logit - running max), each row's raw target logit, and, with a margin that modulates the
    negatives, the running max of the plain logits (`plain_max`, which decides the hits); with label
    smoothing, each row's sum of (modulated) logits, its own target left out (`logit_sum`)."""

    running_max: torch.Tensor
    running_sum: torch.Tensor
    target_raw: torch.Tensor
    plain_max: torch.Tensor | None = None
    logit_sum: torch.Tensor | None = None


class RowGradient(NamedTuple):
    """What the backward's logit gradient reads a row at a time, the same for every tile: the global
    row max, the targets' corrected values (`margin_softmax.target_gradient`), label smoothing's `shift`
    (None without) and the gradient filter's row `limits` (None without the filter)."""

    global_max: torch.Tensor
    corrected_target: torch.Tensor
    shift: torch.Tensor | None = None
    limits: torch.Tensor | None = None
