"""Margin softmax cross-entropy over a class shard, with a hand-written backward (`ShardedMarginSoftmax`).

The forward keeps one (B x c) buffer, turns it in place into exp(logit - row max), and keeps it for
the backward, which turns it in place into the logit gradient (where the GEMMs take bf16 rows, those
come scaled by scale / |w|, so the buffer needs no pass for that factor); the statistics, the margin and the
loss are `margin_softmax.py`'s, shared with the tiled kernel. The three GEMMs
(logits, embedding gradient, weight gradient) dominate; everything else is one or two passes over
the buffer, which is what lets the step stay close to the cost of its GEMMs.

With K sub-centers a class (sub-center ArcFace) the weight holds K rows a class, class-major; the
logit GEMM gives a (B x cK) buffer whose per-class maximum becomes the (B x c) buffer above, and the
backward routes each class's logit gradient to the centre that won.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import facetrain.heads.collectives as collectives
import facetrain.heads.margin_softmax as ms
from facetrain.heads.logit_gemm import LogitGemm
from facetrain.heads.margins.base import row_blocks
from facetrain.heads.scratch import Scratch


def _wide_mm(
    a: torch.Tensor, b: torch.Tensor, gemm_dtype: torch.dtype, out_dtype: torch.dtype
) -> torch.Tensor:
    """a @ b on `gemm_dtype` operands, returned in `out_dtype`: written wide by the GEMM itself where
    the device can (CUDA), which saves a rounded result and a pass over it (weight-sized for the weight
    gradient), else rounded to the compute dtype and widened."""
    gemm = LogitGemm(a.device, gemm_dtype, out_dtype)
    if gemm.native:
        return gemm.mm(a, b)
    return torch.mm(a.to(gemm_dtype), b.to(gemm_dtype)).to(out_dtype)


def _scaled_rows(w: torch.Tensor, inv_norm: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """w * scale / |w| per row, written in the GEMM's operand dtype by the pass that casts the rows anyway:
    the logit GEMM then gives scale * cos directly, and the backward's embedding GEMM takes the logit
    gradient as it is, so neither the B x c logits nor their gradient need a pass of their own for the
    column factor (the H100 profile's largest elementwise kernels). Recomputed in the backward, as the
    plain cast was: no memory is kept between forward and backward."""
    out = torch.empty(w.shape, dtype=dtype, device=w.device)
    return torch.mul(w, (inv_norm * scale)[:, None], out=out)


class LogitRows(NamedTuple):
    """The shard's rows as the logit GEMM takes them: `w_op` in the GEMM's operand dtype, already scaled
    by scale / |w| where `folded` (`_scaled_rows`), else scaled after the GEMM through `w_inv_norm`."""

    gemm: LogitGemm
    w_op: torch.Tensor
    w_inv_norm: torch.Tensor
    scale: float
    folded: bool


def _scaled_logits(x_unit: torch.Tensor, rows: LogitRows) -> torch.Tensor:
    """scale * cos of `x_unit`'s rows against every row of the shard (before sub-centers' maximum)."""
    logits = rows.gemm.mm(x_unit, rows.w_op.t())
    return logits if rows.folded else logits.mul_(rows.w_inv_norm * rows.scale)


def _multiply_by_negative_slopes(exps, hard, negatives, x_unit, rows: LogitRows, sub_centers: int) -> None:
    """exps *= the slopes of the negatives' modulation. The forward modulated the logits in place and
    kept only where (`hard`); the plain logits the slopes need are recomputed a block of rows at a
    time: one more logit GEMM, in place of two B x c tensors kept from the forward."""
    for block in row_blocks(exps.shape[0]):
        plain = _scaled_logits(x_unit[block], rows)
        if sub_centers > 1:
            plain = plain.view(plain.shape[0], -1, sub_centers).amax(dim=2)
        exps[block] *= negatives.rows(block).slope(plain, hard[block])


class ShardedMarginSoftmax(torch.autograd.Function):
    """loss = mean over the global batch of CE(scale * margin(cos), target), computed shard by shard.

    Inputs: `embeddings` (B x D, the global batch), `weight` (cK x D: this rank's c classes, K rows a
    class), `step` (`ms.StepInputs`: its `target_column` is the column of each row's target among the c
    classes, or -1 where another rank owns it; its smoothing is over the step's classes), `sub_centers` K.
    Returns the loss (identical on every rank) and the global top-1 hit count (no gradient).
    """

    @staticmethod
    def forward(ctx, embeddings, weight, step: ms.StepInputs, sub_centers: int = 1):
        scale, target_column, smoothing = step.scale, step.target_column, step.smoothing
        gemm_dtype = ms.compute_dtype(embeddings.device, embeddings.dtype)
        with torch.autocast(embeddings.device.type, enabled=False):
            x_unit, x_norm = ms.unit_rows(embeddings)
            w = weight.to(x_unit.dtype)
            w_inv_norm = torch.linalg.vector_norm(w, dim=1).clamp_min(ms.EPS).reciprocal()
            gemm = LogitGemm(x_unit.device, gemm_dtype, x_unit.dtype)

            # Where the GEMM takes the rows in another dtype (bf16 on CUDA), the pass that casts them also
            # scales them by scale / |w|; elsewhere the logits are scaled after the GEMM.
            folded = gemm.operand_dtype != w.dtype
            w_op = _scaled_rows(w, w_inv_norm, scale, gemm.operand_dtype) if folded else w
            # fp32 out of the GEMM: a bf16 output would round the logits before the softmax
            logits = _scaled_logits(x_unit, LogitRows(gemm, w_op, w_inv_norm, scale, folded))
            del w_op
            nearest_centre = None
            if sub_centers > 1:
                logits, nearest_centre = logits.view(logits.shape[0], -1, sub_centers).max(dim=2)

            # Rows whose target another rank owns (column -1) take part through masks, not indexing,
            # so no step waits on the host for the number of local targets.
            has_target = target_column >= 0
            columns = target_column.clamp_min(0)[:, None]
            target_raw = logits.gather(1, columns).squeeze(1)
            margin = ms.step_margin(step, x_norm, lambda: (target_raw / scale, has_target))
            target_logit, margin_slope, norm_slope = ms.penalise_targets(
                margin, target_raw, has_target, scale, x_norm
            )
            negatives, hard, plain_max = None, None, None
            if margin.negatives is not None:  # modulated in place; where, kept for the backward's slopes
                plain_max = logits.max(dim=1).values
                negatives = margin.negatives.scaled(scale)
                hard = negatives.apply_(logits)
                # rows whose target is elsewhere point at column 0: keep its modulated logit
                target_logit = torch.where(has_target, target_logit, logits.gather(1, columns).squeeze(1))
            logits.scatter_(1, columns, target_logit[:, None])
            logit_sum = logits.sum(dim=1) if smoothing.epsilon else None

            row_max = logits.max(dim=1).values  # every shard has >= 1 class: the head refuses C < N
            if plain_max is None:
                collectives.all_reduce_(row_max, "max", step.group)
            else:  # one all-reduce for both maxima
                row_max, plain_max = collectives.all_reduce_(
                    torch.stack([row_max, plain_max]), "max", step.group
                )
            exps = logits.sub_(row_max[:, None]).exp_()
            loss, row_stats, hit_count = ms.softmax_loss(
                exps.sum(dim=1), target_logit, target_raw, has_target, row_max, step, plain_max, logit_sum
            )

        ctx.save_for_backward(
            exps, row_stats, x_unit, x_norm, w, w_inv_norm, has_target, columns, margin_slope, norm_slope,
            hard, nearest_centre,
        )  # fmt: skip
        ctx.scale, ctx.compute_dtype, ctx.folded = scale, gemm_dtype, folded
        ctx.negatives, ctx.sub_centers, ctx.smoothing = negatives, sub_centers, smoothing
        ctx.embedding_dtype, ctx.weight_dtype = embeddings.dtype, weight.dtype
        ctx.mark_non_differentiable(hit_count)
        return loss, hit_count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, _grad_hits):
        (
            exps, row_stats, x_unit, x_norm, w, w_inv_norm, has_target, columns, margin_slope, norm_slope,
            hard, nearest_centre,
        ) = ctx.saved_tensors  # fmt: skip
        scale, gemm_dtype = ctx.scale, ctx.compute_dtype
        batch = exps.shape[0]
        with torch.autocast(exps.device.type, enabled=False):
            at_target = exps.gather(1, columns).squeeze(1)
            row_factor, corrected, grad_norm, shift = ms.target_gradient(
                row_stats, grad_loss, at_target, margin_slope, norm_slope, has_target, scale, ctx.smoothing
            )
            if shift is not None:  # label smoothing: eps / C off every column, before any slope
                exps.sub_(shift[:, None])
            # the folded GEMM operand carries the column factor, cast and scaled in one pass again
            w_op = _scaled_rows(w, w_inv_norm, scale, gemm_dtype) if ctx.folded else w
            if hard is not None:
                gemm = LogitGemm(x_unit.device, gemm_dtype, x_unit.dtype)
                rows = LogitRows(gemm, w_op, w_inv_norm, scale, ctx.folded)
                _multiply_by_negative_slopes(exps, hard, ctx.negatives, x_unit, rows, ctx.sub_centers)
                del rows  # holds w_op, which the GEMMs below free as soon as they are done
                # rows whose target is elsewhere point at column 0: keep its product
                corrected = torch.where(has_target, corrected, exps.gather(1, columns).squeeze(1))
            exps.scatter_(1, columns, corrected[:, None])
            if nearest_centre is not None:  # each class's gradient goes to its nearest centre's row
                classes, centres = nearest_centre.shape[1], w.shape[0] // nearest_centre.shape[1]
                spread = exps.new_zeros(batch, classes, centres)
                exps = spread.scatter_(2, nearest_centre[..., None], exps[..., None]).view(batch, -1)
            column_factor = w_inv_norm * scale  # d logit / d raw dot product, per column
            grad_logits = (exps if ctx.folded else exps.mul_(column_factor)).to(gemm_dtype)
            grad_x_unit = _wide_mm(grad_logits, w_op, gemm_dtype, w.dtype).mul_(row_factor[:, None])
            del w_op
            grad_w = _wide_mm(grad_logits.t(), x_unit * row_factor[:, None], gemm_dtype, w.dtype)
            # through 1/|w|: remove the component along w, per class (folded: then the factor, per class,
            # a pass over the c x D rows instead of one over the B x c logits)
            along = Scratch(w.device).rowwise_dot(grad_w, w).mul_(w_inv_norm.square())
            grad_w.addcmul_(w, along[:, None], value=-1.0)
            if ctx.folded:
                grad_w.mul_(column_factor[:, None])

            grad_x = ms.through_normalization(grad_x_unit, x_unit, x_norm, grad_norm)
        grads = (grad_x.to(ctx.embedding_dtype), grad_w.to(ctx.weight_dtype))
        return *grads, None, None
