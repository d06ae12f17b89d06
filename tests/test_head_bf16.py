"""bf16 storage of the tiled head: stochastic rounding is unbiased, and small updates are not lost."""

from __future__ import annotations

import pytest
import torch

from facetrain.heads import ShardedMarginHead
from facetrain.heads.class_rows import ClassRows
from facetrain.heads.fused_optim import FusedSGD
from facetrain.heads.rounding import stochastic_round_to_bf16
from tests.support.head_plans import head_plan

ULP_AT_ONE = 2.0**-7  # bf16 spacing in [1, 2)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.9])
def test_rounds_away_from_zero_with_the_dropped_fraction(sign, fraction):
    torch.manual_seed(0)
    value = sign * (1.0 + fraction * ULP_AT_ONE)
    rounded = stochastic_round_to_bf16(torch.full((200_000,), value)).float()
    assert set(rounded.abs().unique().tolist()) == {1.0, 1.0 + ULP_AT_ONE}
    away = (rounded.abs() > 1.0).float().mean().item()
    assert away == pytest.approx(fraction, abs=0.005)  # 5 sigma of 200k draws


def test_rounding_is_unbiased_over_magnitudes():
    torch.manual_seed(1)
    values = torch.randn(20_000) * torch.logspace(-6, 3, 20_000)
    means = torch.stack([stochastic_round_to_bf16(values).float() for _ in range(200)]).mean(0)
    spacing = values.abs() * 2.0**-7  # at most one bf16 step
    # each mean of 200 draws lies within 4 standard errors (<= spacing / 2 / sqrt(200)) of the value
    assert ((means - values).abs() <= 4 * spacing / 2 / 200**0.5 + 1e-30).float().mean() >= 0.999
    nearest = values.to(torch.bfloat16).float()
    assert (nearest != values).any()  # the test values are not already bf16


def test_special_values_pass_through():
    special = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1.0])
    assert torch.equal(stochastic_round_to_bf16(special).float(), special)
    assert stochastic_round_to_bf16(torch.tensor([float("nan")])).isnan().all()
    exact = torch.tensor([1.0, -2.5, 3.0e38]).to(torch.bfloat16)
    assert torch.equal(stochastic_round_to_bf16(exact.float()), exact)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_small_updates_are_not_lost(momentum):
    """1000 SGD steps of 1e-4 (1.3% of a bf16 step at 1.0): round-to-nearest would never move the
    weight; stochastic rounding moves it by the expected amount, with a bf16 momentum too."""
    torch.manual_seed(2)
    rows, dim, steps, lr, grad = 64, 64, 1000, 1e-3, 0.1
    weight = torch.nn.Parameter(torch.ones(rows, dim, dtype=torch.bfloat16), requires_grad=False)
    optimizer = FusedSGD([weight], lr=lr, momentum=momentum, state_dtype=torch.bfloat16)
    tile = ClassRows(0, rows)
    for _ in range(steps):
        optimizer.update(weight, tile, tile.read(weight, torch.float32), torch.full((rows, dim), grad),
                         torch.zeros(rows))  # fmt: skip
    buffers = [1.0 - momentum ** (t + 1) for t in range(steps)] if momentum else [1.0] * steps
    expected = 1.0 - lr * grad * sum(b / (1 - momentum) if momentum else b for b in buffers)
    assert weight.float().mean().item() == pytest.approx(expected, abs=3e-3)
    nearest = torch.ones(rows, dim, dtype=torch.bfloat16)
    for _ in range(10):
        nearest = (nearest.float() - lr * grad).to(torch.bfloat16)
    assert torch.equal(nearest, torch.ones_like(nearest))


def test_bf16_head_trains_like_fp32_on_a_toy_problem():
    """Same seed, same batches: the bf16 tiled head learns the classes as the fp32 one does."""
    classes, dim = 50, 16
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(3))
    figures = {}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(4)
        head = ShardedMarginHead(classes, dim, margin="cosface", scale=16.0, plan=head_plan(16, True, dtype))
        head.reset_parameters(seed=0)
        head.fuse_optimizer(FusedSGD([head.weight], lr=0.05, momentum=0.9, state_dtype=dtype))
        data = torch.Generator().manual_seed(5)
        losses, accuracies = [], []
        for _ in range(40):
            labels = torch.randint(0, classes, (64,), generator=data)
            loss, accuracy = head(centres[labels] + 0.3 * torch.randn(64, dim, generator=data), labels)
            loss.backward()
            losses.append(loss.item())
            accuracies.append(accuracy.item())
        figures[dtype] = (losses[0], sum(losses[-10:]) / 10, sum(accuracies[-10:]) / 10)
    first, last, accuracy = figures[torch.float32]
    assert last < first / 3 and accuracy > 0.8  # measured: 13.6 -> about 2, accuracy about 0.9
    assert figures[torch.bfloat16][1] == pytest.approx(last, rel=0.05)
    assert figures[torch.bfloat16][2] == pytest.approx(accuracy, abs=0.02)
