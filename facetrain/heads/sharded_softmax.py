"""Margin softmax cross-entropy over a class shard, with a hand-written backward (`ShardedMarginSoftmax`).

The forward keeps one (B x c) buffer, turns it in place into exp(logit - row max), and keeps it for
the backward, which turns it in place into the logit gradient. Only batch-sized statistics cross
ranks: the row max, then [sum of exponentials, target logit, hit] in one all-reduce. The three GEMMs
(logits, embedding gradient, weight gradient) dominate; everything else is one or two passes over
the buffer, which is what lets the step stay close to the cost of its GEMMs.

With K sub-centers a class (sub-center ArcFace) the weight holds K rows a class, class-major; the
logit GEMM gives a (B x cK) buffer whose per-class maximum becomes the (B x c) buffer above, and the
backward routes each class's logit gradient to the centre that won.
"""

from __future__ import annotations

import torch

from facetrain.heads.logit_gemm import LogitGemm
from facetrain.heads.margins import Margin
from facetrain.parallel import comm

_EPS = 1e-12


def rowwise_dot(a: torch.Tensor, b: torch.Tensor, block: int = 8192) -> torch.Tensor:
    """sum(a * b, dim=1), a block of rows at a time: einsum's batched GEMM is several times slower on
    CPU, and a whole-shard product would be a second weight-sized buffer.

    One product buffer and the output are allocated up front and written in place: a fresh product and
    a small sum per block would interleave on the heap, and glibc could then not reuse the freed block
    for the next one (the process grew by up to 160 MiB at C = 100k).
    """
    rows = a.shape[0]
    out = torch.empty(rows, dtype=torch.result_type(a, b), device=a.device)
    product = torch.empty(min(block, rows), a.shape[1], dtype=out.dtype, device=a.device)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        piece = product[: stop - start]
        torch.mul(a[start:stop], b[start:stop], out=piece)
        torch.sum(piece, dim=1, out=out[start:stop])
    return out


def through_normalization(grad_unit: torch.Tensor, unit: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """The gradient of x from that of x / |x| (`unit`, with `norm` = |x| per row): the component along
    the unit vector is removed and the rest divided by the norm."""
    radial = torch.einsum("bd,bd->b", grad_unit, unit)
    return (grad_unit - unit * radial[:, None]) / norm


def _wide_mm(
    a: torch.Tensor, b: torch.Tensor, compute_dtype: torch.dtype, out_dtype: torch.dtype
) -> torch.Tensor:
    """a @ b on `compute_dtype` operands, returned in `out_dtype`: written wide by the GEMM itself where
    the device can (CUDA), which saves a rounded result and a pass over it (weight-sized for the weight
    gradient), else rounded to the compute dtype and widened."""
    gemm = LogitGemm(a.device, compute_dtype, out_dtype)
    if gemm.native:
        return gemm.mm(a, b)
    return torch.mm(a.to(compute_dtype), b.to(compute_dtype)).to(out_dtype)


def mean_over_valid_rows(
    row_loss: torch.Tensor, valid: torch.Tensor, sum_exp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss, the mean of `row_loss` over the valid rows (padding rows of a short batch are not),
    and what the backward needs: [sum_exp, n_valid x sum_exp on valid rows and inf on padding, so
    that grad / it is the row factor, 0 on padding].

    With every row valid the loss is bit for bit `row_loss.mean()` and the factor grad / (B sum_exp).
    """
    n_valid = valid.sum().to(row_loss.dtype)
    loss = torch.where(valid, row_loss, 0.0).sum() / n_valid
    denominator = torch.where(valid, n_valid * sum_exp, float("inf"))
    return loss, torch.stack([sum_exp, denominator])


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the GEMMs: autocast's when it is on, else the embeddings'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class ShardedMarginSoftmax(torch.autograd.Function):
    """loss = mean over the global batch of CE(scale * margin(cos), target), computed shard by shard.

    Inputs: `embeddings` (B x D, the global batch), `weight` (cK x D: this rank's c classes, K rows a
    class), `target_column` (B,) the column of each row's target among the c classes, or -1 where
    another rank owns it. Returns the loss (identical on every rank) and the global top-1 hit count
    (no gradient).
    """

    @staticmethod
    def forward(
        ctx, embeddings, weight, target_column, valid, margin: Margin, scale: float, group, sub_centers=1
    ):
        compute_dtype = _compute_dtype(embeddings.device, embeddings.dtype)
        # statistics in fp32 (fp64 only when the caller works in fp64, as exactness tests do)
        stat_dtype = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
        with torch.autocast(embeddings.device.type, enabled=False):
            x = embeddings.to(stat_dtype)
            x_norm = torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(_EPS)
            x_unit = x / x_norm
            w = weight.to(stat_dtype)
            w_inv_norm = torch.linalg.vector_norm(w, dim=1).clamp_min(_EPS).reciprocal()

            # fp32 out of the GEMM: a bf16 output would round the logits before the softmax
            logits = LogitGemm(x.device, compute_dtype, stat_dtype).mm(x_unit, w.t())
            logits.mul_(w_inv_norm * scale)  # now scale * cos(theta)
            nearest_centre = None
            if sub_centers > 1:
                logits, nearest_centre = logits.view(logits.shape[0], -1, sub_centers).max(dim=2)

            # Rows whose target another rank owns (column -1) take part through masks, not indexing,
            # so no step waits on the host for the number of local targets.
            has_target = target_column >= 0
            columns = target_column.clamp_min(0)[:, None]
            target_raw = logits.gather(1, columns).squeeze(1)
            target_cos = target_raw / scale
            with torch.enable_grad():
                cos_leaf = target_cos.detach().requires_grad_()
                penalised = margin(cos_leaf)
                (margin_slope,) = torch.autograd.grad(penalised.sum(), cos_leaf)
            target_logit_local = torch.where(has_target, penalised.detach() * scale, target_raw)
            logits.scatter_(1, columns, target_logit_local[:, None])

            row_max = logits.max(dim=1).values  # every shard has >= 1 class: the head refuses C < N
            comm.all_reduce_(row_max, "max", group)

            exps = logits.sub_(row_max[:, None]).exp_()
            zero = exps.new_zeros(())
            stats = torch.stack(
                [
                    exps.sum(dim=1),
                    torch.where(has_target, target_logit_local, zero),
                    # top-1 without another pass: margins only lower the target logit, so the plain
                    # target logit reaches the row max exactly when no other class beats it.
                    torch.where(has_target, (target_cos * scale >= row_max).to(exps.dtype), zero),
                ]
            )
            comm.all_reduce_(stats, "sum", group)
            sum_exp, target_logit, hits = stats

            loss, row_stats = mean_over_valid_rows(sum_exp.log() + row_max - target_logit, valid, sum_exp)

        ctx.save_for_backward(
            exps, row_stats, x_unit, x_norm, w, w_inv_norm, has_target, columns, margin_slope, nearest_centre
        )
        ctx.scale, ctx.group, ctx.compute_dtype = scale, group, compute_dtype
        ctx.embedding_dtype, ctx.weight_dtype = embeddings.dtype, weight.dtype
        hit_count = hits.sum()
        ctx.mark_non_differentiable(hit_count)
        return loss, hit_count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, _grad_hits):
        exps, row_stats, x_unit, x_norm, w, w_inv_norm, has_target, columns, margin_slope, nearest_centre = (
            ctx.saved_tensors
        )
        scale, compute_dtype = ctx.scale, ctx.compute_dtype
        batch = exps.shape[0]
        with torch.autocast(exps.device.type, enabled=False):
            # d loss / d logit = (softmax - onehot) * grad / B. The row factor grad / (B * sum_exp)
            # is applied to the (B x D) GEMM operands below instead of the (B x c) buffer, so the
            # targets are corrected in unscaled units: softmax - 1 = (exp - sum_exp) / sum_exp.
            sum_exp, denominator = row_stats.unbind(0)
            row_factor = grad_loss.to(denominator.dtype) / denominator
            at_target = exps.gather(1, columns).squeeze(1)
            corrected = torch.where(has_target, (at_target - sum_exp) * margin_slope, at_target)
            exps.scatter_(1, columns, corrected[:, None])
            if nearest_centre is not None:  # each class's gradient goes to its nearest centre's row
                classes, centres = nearest_centre.shape[1], w.shape[0] // nearest_centre.shape[1]
                spread = exps.new_zeros(batch, classes, centres)
                exps = spread.scatter_(2, nearest_centre[..., None], exps[..., None]).view(batch, -1)
            # d logit / d raw dot product = scale / |w|, per column: one pass over the buffer.
            grad_raw = exps.mul_(w_inv_norm * scale).to(compute_dtype)

            grad_x_unit = _wide_mm(grad_raw, w, compute_dtype, w.dtype).mul_(row_factor[:, None])
            grad_w = _wide_mm(grad_raw.t(), x_unit * row_factor[:, None], compute_dtype, w.dtype)
            # through 1/|w|: remove the component along w, per class
            along = rowwise_dot(grad_w, w).mul_(w_inv_norm.square())
            grad_w.addcmul_(w, along[:, None], value=-1.0)

            grad_x = through_normalization(grad_x_unit, x_unit, x_norm)
        return grad_x.to(ctx.embedding_dtype), grad_w.to(ctx.weight_dtype), None, None, None, None, None, None
