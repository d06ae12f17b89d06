"""The tiled head's fused optimizer is a torch.optim.Optimizer a stranger's loop can use as it is.

LR schedulers drive its learning rate, `step()` is a no-op after the backward's update, and
`state_dict` / `load_state_dict` and torch.distributed.checkpoint's optimizer state dicts round-trip its
state (in its own dtype). The reference for the updates is torch.optim.SGD on the untiled head
(tests/test_head_tiled.py holds the arithmetic to it step for step; here the schedule is what varies).
"""

from __future__ import annotations

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from facetrain.heads import ShardedMarginHead
from facetrain.heads.fused_optim import FusedAdamW, FusedSGD
from tests.support.head_plans import head_plan

CLASSES, DIM, BATCH = 17, 6, 8


def batches(steps: int):
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        yield (
            torch.randn(BATCH, DIM, generator=generator, dtype=torch.float64),
            torch.randint(0, CLASSES, (BATCH,), generator=generator),
        )


def head(tile_classes=None) -> ShardedMarginHead:
    plan = head_plan(tile_classes, fused=tile_classes is not None)
    module = ShardedMarginHead(CLASSES, DIM, margin="cosface", scale=8.0, plan=plan)
    module.reset_parameters(seed=1)
    return module.double()


def schedule(step: int) -> float:
    return 1.0 / (1 + step)


def test_a_scheduled_fused_sgd_equals_torch_sgd_on_the_untiled_head():
    tiled, untiled = head(tile_classes=5), head()
    fused = FusedSGD([tiled.weight], lr=0.2, momentum=0.9, weight_decay=1e-3)
    tiled.fuse_optimizer(fused)
    reference = torch.optim.SGD(untiled.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
    schedulers = [LambdaLR(fused, schedule), LambdaLR(reference, schedule)]
    for embeddings, labels in batches(4):
        tiled(embeddings, labels).loss.backward()
        untiled(embeddings, labels).loss.backward()
        assert tiled.weight.grad is None
        for optimizer in (fused, reference):
            optimizer.step()
            optimizer.zero_grad()
        for scheduler in schedulers:
            scheduler.step()
    assert fused.param_groups[0]["lr"] == pytest.approx(0.2 / 5)
    assert torch.allclose(tiled.weight, untiled.weight, rtol=0, atol=1e-12)


@pytest.mark.parametrize("optimizer_class", [FusedSGD, FusedAdamW])
def test_state_dict_round_trips_in_the_state_dtype(optimizer_class):
    trained = head(tile_classes=5).float()
    optimizer = optimizer_class([trained.weight], lr=0.1, state_dtype=torch.bfloat16)
    trained.fuse_optimizer(optimizer)
    for embeddings, labels in batches(2):
        trained(embeddings.float(), labels).loss.backward()
    saved = optimizer.state_dict()
    fresh = head(tile_classes=5).float()
    restored = optimizer_class([fresh.weight], lr=0.5, state_dtype=torch.bfloat16)
    restored.load_state_dict(saved)
    assert restored.param_groups[0]["lr"] == 0.1
    for name, value in optimizer.state[trained.weight].items():
        loaded = restored.state[fresh.weight][name]
        assert loaded.dtype == value.dtype and torch.equal(loaded, value), name
    if optimizer_class is FusedAdamW:
        assert float(restored.state[fresh.weight]["step"]) == 2


def test_distributed_checkpoint_optimizer_state_dicts_work_unchanged():
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    trained = head(tile_classes=5)
    optimizer = FusedSGD([trained.weight], lr=0.1, momentum=0.9)
    trained.fuse_optimizer(optimizer)
    for embeddings, labels in batches(2):
        trained(embeddings, labels).loss.backward()
    saved = get_optimizer_state_dict(trained, optimizer)
    assert torch.equal(
        saved["state"]["weight"]["momentum_buffer"], optimizer.state[trained.weight]["momentum_buffer"]
    )
    fresh = head(tile_classes=5)
    restored = FusedSGD([fresh.weight], lr=0.3, momentum=0.9)
    fresh.fuse_optimizer(restored)
    set_optimizer_state_dict(fresh, restored, saved)
    assert torch.equal(
        restored.state[fresh.weight]["momentum_buffer"], optimizer.state[trained.weight]["momentum_buffer"]
    )
