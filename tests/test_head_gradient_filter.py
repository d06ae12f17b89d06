"""`head.gradient_filter` (issue #56, item 3): off by default and then exact; on, the loss is unchanged
and dX and dW move by no more than the skipped probabilities allow (`facetrain/heads/gradient_filter.py`
derives the bound); the fused optimizer still updates the rows whose gradient was skipped.

fp64 on the torch tiles, so what differs is the filter and not rounding. The Triton kernels' filter is
checked against these tiles in tests/test_head_triton.py.
"""

from __future__ import annotations

import pytest
import torch

from facetrain.config.validate import field_problems
from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads.config import HeadConfig, storage_problems
from facetrain.heads.fused_optim import FusedSGD
from facetrain.heads.gradient_filter import filter_blocks_
from facetrain.heads.margins import MARGINS
from facetrain.parallel.dims import init_parallel
from facetrain.train.head_plan import describe_plan, resolve_head_plan
from facetrain.train.run_config import Config
from tests.support.head_problems import dense_reference, make_problem

CLASSES, BATCH, TILE = 400, 37, 150  # tiles of 150, 150 and 100 classes over blocks of 16
THRESHOLD = 1e-2
SCALE = 64.0


def run_head(weight, embeddings, labels, gradient_filter, margin="arcface", sample_rate=1.0, fused=False):
    """One tiled step: the loss, dX and the weight's gradient (or, fused, the weight after one SGD step)."""
    plan = HeadPlan("tiled", TILE, fused_optimizer=fused, gradient_filter=gradient_filter)
    head = ShardedMarginHead(CLASSES, weight.shape[1], margin=margin, sample_rate=sample_rate, plan=plan)
    head = head.double()
    with torch.no_grad():
        head.weight.copy_(weight)
    if fused:
        head.fuse_optimizer(FusedSGD([head.weight], lr=0.1, momentum=0.9, weight_decay=5e-4))
    torch.manual_seed(1)  # Partial FC's draws, alike with and without the filter
    x = embeddings.clone().requires_grad_()
    loss = head(x, labels).loss
    loss.backward()
    return loss.detach(), x.grad, head.weight.detach().clone() if fused else head.weight.grad


def test_off_by_default_and_exact():
    assert HeadConfig().gradient_filter == 0.0 and HeadPlan("tiled").gradient_filter == 0.0
    weight, embeddings, labels = make_problem("spread", torch.float64, CLASSES, BATCH)
    loss, grad_x, grad_w = run_head(weight, embeddings, labels, 0.0)
    dense = dense_reference("arcface", weight, embeddings, labels)
    for got, expected in zip((loss, grad_x, grad_w), dense):
        assert torch.allclose(got, expected, rtol=0, atol=1e-10 * float(expected.abs().max()))


@pytest.mark.parametrize("sample_rate", [1.0, 0.6])
@pytest.mark.parametrize("margin", MARGINS.names())
def test_error_is_bounded_by_the_skipped_probabilities(margin, sample_rate):
    """Every skipped entry of d loss / d logit is below t / n (n valid rows) before the class's
    scale / |w|: row i's unit-embedding gradient moves by at most s t k_i / n over its k_i skipped
    entries (k_i <= the step's classes), class j's unit-row gradient by at most s t r_j / n over its r_j
    <= n skipped rows; through the norms, dX_i over |x_i| and dW_j over |w_j|."""
    weight, embeddings, labels = make_problem("spread", torch.float64, CLASSES, BATCH)
    exact = run_head(weight, embeddings, labels, 0.0, margin, sample_rate)
    filtered = run_head(weight, embeddings, labels, THRESHOLD, margin, sample_rate)
    assert torch.equal(filtered[0], exact[0])  # the forward never filters
    step_classes = int(exact[2].abs().sum(1).gt(0).sum())  # the classes this step's softmax holds
    x_bound = SCALE * THRESHOLD * step_classes / BATCH / embeddings.norm(dim=1)
    w_bound = SCALE * THRESHOLD / weight.norm(dim=1)
    x_moved, w_moved = (filtered[1] - exact[1]).norm(dim=1), (filtered[2] - exact[2]).norm(dim=1)
    assert bool((x_moved <= x_bound).all()) and bool((w_moved <= w_bound).all())
    assert float(x_moved.max()) > 0 and float(w_moved.max()) > 0  # the filter skipped something
    assert float(w_moved.max() / exact[2].norm(dim=1).max()) < 0.05


def test_the_fused_optimizer_updates_skipped_rows():
    """A fused SGD step with the filter equals torch's SGD on the filtered gradient: rows whose every
    block was skipped still decay (their gradient is zero, not absent)."""
    weight, embeddings, labels = make_problem("spread", torch.float64, CLASSES, BATCH)
    loss, _, grad_w = run_head(weight, embeddings, labels, 0.2)
    skipped = grad_w.abs().sum(1) == 0
    assert 0 < int(skipped.sum()) < CLASSES  # whole classes were left out of the products
    fused = run_head(weight, embeddings, labels, 0.2, fused=True)[2]
    reference = weight.clone().requires_grad_()
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9, weight_decay=5e-4)
    reference.grad = grad_w.clone()
    optimizer.step()
    assert torch.allclose(fused, reference.detach(), rtol=0, atol=1e-12)
    assert not torch.equal(fused[skipped], weight[skipped])


def test_blocks_are_kept_whole():
    values = torch.tensor([[0.25, -0.5, 0.0], [0.25, 0.25, 0.0], [0.25, 0.25, 0.25]])
    kept = filter_blocks_(values, torch.tensor([0.375, 0.375, float("inf")]), (2, 2))
    assert kept.tolist() == [[True, False], [False, False]]  # a padding row (inf) holds nothing back
    assert values.tolist() == [[0.25, -0.5, 0.0], [0.25, 0.25, 0.0], [0.0, 0.0, 0.0]]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="gradient_filter"):
        HeadPlan("tiled", gradient_filter=1.0)
    with pytest.raises(ValueError, match="tiled"):
        HeadPlan(gradient_filter=1e-3)
    problems = field_problems(HeadConfig(gradient_filter=-1.0), "head.")
    assert [key for key, *_ in problems] == ["head.gradient_filter"]
    head = HeadConfig(gradient_filter=2.0**-12, mode="untiled")
    assert [key for key, *_ in storage_problems(head)] == ["head.gradient_filter"]
    head = HeadConfig(gradient_filter=2.0**-12, sub_centers=3)
    assert "head.sub_centers 3" in next(storage_problems(head))[2]
    assert not list(storage_problems(HeadConfig(gradient_filter=2.0**-12, mode="tiled")))


def test_the_trainer_plans_the_filter_and_logs_it():
    cfg, dims = Config(), init_parallel()
    cfg.head.mode, cfg.head.tile_classes, cfg.head.gradient_filter = "tiled", 5, 2.0**-12
    plan, reasons = resolve_head_plan(cfg, 12, dims)
    assert plan.gradient_filter == 2.0**-12
    assert "head: tiled, 5 classes a tile, gradient filter 0.000244141, fused sgd" in describe_plan(
        plan, reasons, cfg, 12, dims
    )
    cfg.head.mode = "auto"  # 12 classes fit: the exact untiled head, and the line says the filter is off
    plan, reasons = resolve_head_plan(cfg, 12, dims)
    assert plan.mode == "untiled" and plan.gradient_filter == 0.0
    assert "no head.gradient_filter on the untiled head" in reasons
