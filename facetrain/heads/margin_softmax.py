"""The arithmetic both margin-softmax kernels share (`sharded_softmax.py` untiled, `tiled_softmax.py`):
the unit embeddings, the margin's step (`margins.prepare_step`) and its target logits, the cross-rank
statistics and loss, and the backward's correction at the targets and through the norms. The kernels
differ only in how they walk the class rows.

Only batch-sized statistics cross ranks: an all-reduce MAX of each row's max (done by the kernels, which
need it at different moments), then one all-reduce SUM of [sum of exponentials, target logit, hit] (and
each row's sum of logits, with label smoothing); a margin that needs the target cosines (CurricularFace)
adds one all-reduce SUM of B values first.

Label smoothing (`Smoothing`) is torch's `cross_entropy(label_smoothing=eps)` on the margin's logits:
(1 - eps) x CE + eps x the mean over the C classes of -log softmax, which is CE + eps x (target logit -
mean logit). The mean logit needs each row's sum of logits, one more B-sized statistic; its gradient
is softmax - (1 - eps) x onehot - eps / C, so the kernels subtract one value a row from every column.
Statistics are fp32 (fp64 only when the caller works in fp64, as the exactness tests do).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import facetrain.heads.collectives as collectives
from facetrain.heads.margins import Margin, StepMargin, prepare_step

EPS = 1e-12


def compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the GEMMs: autocast's when it is on, else the embeddings'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def unit_rows(embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The embeddings as unit vectors in the statistics' dtype, and their norms (B x 1)."""
    x = embeddings.to(torch.float64 if embeddings.dtype == torch.float64 else torch.float32)
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(EPS)
    return x / norm, norm


def through_normalization(
    grad_unit: torch.Tensor, unit: torch.Tensor, norm: torch.Tensor, grad_norm: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of x from that of x / |x| (`unit`, with `norm` = |x| per row): the component along
    the unit vector is removed and the rest divided by the norm; a margin's gradient with respect to
    the norm itself (`grad_norm`, B) adds along the unit vector."""
    radial = torch.einsum("bd,bd->b", grad_unit, unit)
    if grad_norm is not None:
        radial = radial - grad_norm * norm.squeeze(1)
    return (grad_unit - unit * radial[:, None]) / norm


class Smoothing(NamedTuple):
    """Label smoothing: `epsilon` of each row's target mass spread over the `classes` of the step's
    softmax (all C, or the classes Partial FC kept on every rank together)."""

    epsilon: float = 0.0
    classes: int = 1

    def shift(self, sum_exp: torch.Tensor) -> torch.Tensor | None:
        """eps / C in the kernels' unscaled units (times the row's sum of exponentials): what each
        column's logit gradient loses; None without smoothing (no pass is spent on it)."""
        return sum_exp * (self.epsilon / self.classes) if self.epsilon else None


NO_SMOOTHING = Smoothing()


class MarginInput(NamedTuple):
    """What the kernels get of the head's margin: the margin, its running state (the head's buffers,
    advanced in place), and whether this step advances it (a training step)."""

    margin: Margin
    buffers: dict[str, torch.Tensor]
    update: bool


class StepInputs(NamedTuple):
    """What both kernels take of a step besides the two tensors autograd differentiates (the embeddings
    and the weight, which must be arguments of `apply`): each row's `target_column` among this rank's
    columns (-1 where another rank owns it), which rows are real (`valid`: padding rows are not), the
    margin, the logit scale, the ranks' group and label smoothing."""

    target_column: torch.Tensor
    valid: torch.Tensor
    margin: MarginInput
    scale: float
    group: object
    smoothing: Smoothing = NO_SMOOTHING


def step_margin(step: StepInputs, x_norm: torch.Tensor, target_cos_here) -> StepMargin:
    """The margin for this step (`margins.prepare_step`). `target_cos_here` is a callable giving this
    rank's target cosines and where it owns them; it is called only for a margin that needs every
    row's, which then cost one all-reduce of B values."""
    margin, target_cos = step.margin, None
    if margin.margin.needs_target_cos:
        cos, owned = target_cos_here()
        target_cos = collectives.all_reduce_(torch.where(owned, cos, 0.0), "sum", step.group)
    return prepare_step(
        margin.margin, margin.buffers, x_norm.squeeze(1), step.valid, target_cos, margin.update
    )


def penalise_targets(
    step: StepMargin, target_raw: torch.Tensor, has_target: torch.Tensor, scale: float, x_norm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's target logit (`target_raw` = scale x cos) with the margin, where this rank owns the
    target (the plain logit elsewhere), and the margin's slopes d margin / d cos and d margin / d |x|.
    The slopes are taken with autograd on B-vectors, so every margin's gradient is exact."""
    with torch.enable_grad():
        cos_leaf = (target_raw / scale).detach().requires_grad_()
        norm_leaf = x_norm.squeeze(1).detach().requires_grad_()
        penalised = step.margin.target(cos_leaf, norm_leaf, step.rows, step.state)
        slope, norm_slope = torch.autograd.grad(penalised.sum(), (cos_leaf, norm_leaf), allow_unused=True)
    if norm_slope is None:
        norm_slope = torch.zeros_like(norm_leaf)
    return torch.where(has_target, penalised.detach() * scale, target_raw), slope, norm_slope


def softmax_loss(
    sum_exp: torch.Tensor,
    target_logit: torch.Tensor,
    target_raw: torch.Tensor,
    has_target: torch.Tensor,
    global_max: torch.Tensor,
    step: StepInputs,
    plain_max: torch.Tensor | None = None,
    logit_sum: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss from this rank's share, in one all-reduce: `sum_exp` of exp(logit - global max) over its
    classes (penalised targets included), the penalised `target_logit` and plain `target_raw` where it
    owns the target, and with `step`'s label smoothing `logit_sum`, the sum of its classes' logits (penalised
    and modulated as in the softmax). Returns the loss (the mean over valid rows), the statistics the
    backward needs (`target_gradient`) and the global top-1 hit count (no gradient). Where the margin
    modulated the negatives, `plain_max` is the global row max of the plain logits, which decides the
    hits."""
    smoothing, zero = step.smoothing, sum_exp.new_zeros(())
    hit_max = global_max if plain_max is None else plain_max
    shares = [
        sum_exp,
        torch.where(has_target, target_logit, zero),
        # top-1 without another pass: margins only lower the target logit, so the plain one
        # reaches the row max exactly when no other class beats it
        torch.where(has_target, (target_raw >= hit_max).to(sum_exp.dtype), zero),
    ]
    if smoothing.epsilon:
        shares.append(logit_sum)
    stats = collectives.all_reduce_(torch.stack(shares), "sum", step.group)
    sum_exp, target_logit, hits = stats[:3]
    row_loss = sum_exp.log() + global_max - target_logit
    if smoothing.epsilon:
        row_loss = row_loss + smoothing.epsilon * (target_logit - stats[3] / smoothing.classes)
    # padding rows of a short batch are not in the mean: their denominator is inf, their factor 0
    n_valid = step.valid.sum().to(row_loss.dtype)
    loss = torch.where(step.valid, row_loss, 0.0).sum() / n_valid
    denominator = torch.where(step.valid, n_valid * sum_exp, float("inf"))
    return loss, torch.stack([sum_exp, denominator]), hits.sum()


def target_gradient(
    row_stats: torch.Tensor,
    grad_loss: torch.Tensor,
    at_target: torch.Tensor,
    margin_slope: torch.Tensor,
    norm_slope: torch.Tensor,
    has_target: torch.Tensor,
    scale: float,
    smoothing: Smoothing = NO_SMOOTHING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """d loss / d logit = (softmax - onehot) x grad / B. The row factor grad / (B x sum_exp) is returned
    for the kernels to apply to their B x D GEMM operands instead of the B x c logits, so the targets
    are corrected in unscaled units: softmax - 1 = (exp - sum_exp) / sum_exp, times the margin's slope.
    `at_target` is exp(target logit - global max); rows without a target here keep it. Also returns
    d loss / d |x| through the margin's target (zero where another rank owns the target: the ranks'
    shares add up in the embeddings' gradient), and with label smoothing the value every column of a
    row loses (`Smoothing.shift`, None without): onehot's 1 becomes 1 - eps, and eps / C leaves every
    class, the target included, so rows without a target here keep `at_target` less it."""
    sum_exp, denominator = row_stats.unbind(0)
    row_factor = grad_loss.to(denominator.dtype) / denominator
    shift = smoothing.shift(sum_exp)
    at_target_less = at_target if shift is None else at_target - shift
    unscaled = at_target_less - (1.0 - smoothing.epsilon) * sum_exp  # d loss / d target logit, unscaled
    grad_norm = torch.where(has_target, unscaled * row_factor * scale * norm_slope, 0.0)
    corrected = torch.where(has_target, unscaled * margin_slope, at_target_less)
    return row_factor, corrected, grad_norm, shift
