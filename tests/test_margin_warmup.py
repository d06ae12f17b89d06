"""head.margin_warmup_steps: the margin grows from none to its full value, in the sharded head as in the
dense reference."""

from __future__ import annotations

import pytest
import torch

from facetrain.heads import DenseMarginHead, ShardedMarginHead
from facetrain.heads.margins import MARGINS, CosFace, Margin, build_margin, margin_at_step
from tests.support.distributed import run_distributed

COS = torch.linspace(-0.999, 0.999, 201, dtype=torch.float64)


# the margins that are functions of the cosine alone; the others' warmup: tests/test_margins_adaptive.py
CLASSIC = [name for name in sorted(MARGINS) if type(build_margin(name)).__call__ is not Margin.__call__]


def test_the_classic_margins_are_the_five():
    assert set(CLASSIC) == {"arcface", "am_softmax", "cosface", "sphereface", "combined", "softmax"}


@pytest.mark.parametrize("name", CLASSIC)
def test_warmup_runs_from_no_margin_to_the_full_margin(name):
    full = build_margin(name)
    assert torch.equal(margin_at_step(full, 0, 100)(COS), COS)
    assert margin_at_step(full, 100, 100) is full and margin_at_step(full, 500, 100) is full
    previous = COS
    for step in (25, 50, 75):
        warming = margin_at_step(full, step, 100)(COS)
        expected = COS + step / 100 * (full(COS) - COS)
        torch.testing.assert_close(warming, expected, rtol=0, atol=1e-15)
        assert bool((warming <= previous + 1e-15).all())  # a growing penalty on the target logit
        previous = warming
    assert bool((previous >= full(COS) - 1e-15).all())


def test_cosface_warmup_is_cosface_with_a_smaller_margin():
    warming = margin_at_step(CosFace(m=0.4), 30, 120)(COS)
    torch.testing.assert_close(warming, CosFace(m=0.1)(COS), rtol=0, atol=1e-15)


def warming_problem():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(11, 6, generator=generator, dtype=torch.float64) * 0.05
    embeddings = torch.randn(8, 6, generator=generator, dtype=torch.float64) * 2
    labels = torch.randint(0, 11, (8,), generator=generator)
    return weight, embeddings, labels


def sharded_warming_step(rank, world_size, name):
    weight, embeddings, labels = warming_problem()
    head = ShardedMarginHead(11, 6, margin=name, scale=30.0, gradient_reduction="sum").double()
    head.weight.data.copy_(weight[head.class_start : head.class_stop])
    head.margin = margin_at_step(head.margin, 40, 100)  # what the trainer does before each step
    rows = slice(rank * 4, rank * 4 + 4) if world_size == 2 else slice(None)
    x = embeddings[rows].clone().requires_grad_()
    loss, _ = head(x, labels[rows])
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad


@pytest.mark.parametrize("world_size", [1, 2])
def test_sharded_head_with_a_warming_margin_equals_the_dense_reference(world_size):
    for name in ("arcface", "sphereface"):
        weight, embeddings, labels = warming_problem()
        dense = DenseMarginHead(11, 6, margin=name, scale=30.0).double()
        dense.weight.data.copy_(weight)
        dense.margin = margin_at_step(dense.margin, 40, 100)
        x = embeddings.clone().requires_grad_()
        loss, _ = dense(x, labels)
        loss.backward()
        if world_size == 1:
            per_rank = [sharded_warming_step(0, 1, name)]
        else:
            per_rank = run_distributed(sharded_warming_step, 2, name, timeout=120)
        full_loss = DenseMarginHead(11, 6, margin=name, scale=30.0).double()
        full_loss.weight.data.copy_(weight)
        assert float(loss.detach()) < float(
            full_loss(embeddings, labels).loss.detach()
        )  # the warming margin is milder
        for rank_loss, _, _ in per_rank:
            torch.testing.assert_close(rank_loss, loss.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.cat([r[1] for r in per_rank]), x.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.cat([r[2] for r in per_rank]), dense.weight.grad, rtol=0, atol=1e-12)
