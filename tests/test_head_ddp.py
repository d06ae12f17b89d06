"""The head in a stranger's loop: plain DDP or FSDP2 around the backbone, nothing else, is exact.

Each rank trains `DistributedDataParallel(backbone)` (or `fully_shard(backbone)`) with the sharded head
as it comes (`gradient_reduction="mean"`, the default) and torch's SGD, on batches whose row counts
change from step to step (a smaller last batch, a rank with no rows). The reference is one process on
the same global batches: the loss, the backbone's gradients after each step and every weight after the
last step agree to 1e-10 in fp64 (the same arithmetic, summed in another order) and to 1e-5 of their
magnitude in fp32 (measured: up to 1.1e-6 after three steps, fp32 rounding of sums taken in another
order).
"""

from __future__ import annotations

import pytest
import torch

from facetrain.heads import ShardedMarginHead
from tests.support.distributed import run_distributed
from tests.support.head_plans import head_plan

IN, DIM, CLASSES = 6, 8, 13
# rows per rank at each step: equal first, then shrinking, uneven, and one rank without rows
ROWS = {2: [[4, 4], [4, 2], [1, 0]], 3: [[3, 3, 3], [3, 1, 2], [0, 2, 3]]}
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def backbone(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(IN, 16), torch.nn.Tanh(), torch.nn.Linear(16, DIM))
    return layers.to(dtype)


def global_batch(step: int, rows: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    images = torch.randn(rows, IN, generator=generator, dtype=torch.float64).to(dtype)
    return images, torch.randint(0, CLASSES, (rows,), generator=generator)


def head(tile_classes: int | None, dtype=torch.float32, **kwargs) -> ShardedMarginHead:
    module = ShardedMarginHead(
        CLASSES, DIM, margin="arcface", scale=16.0, plan=head_plan(tile_classes), **kwargs
    )
    module.reset_parameters(seed=3)  # the same full weight whatever the world size
    return module.to(dtype)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's parameters and gradients) as the whole tensor; a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def train(model, local_backbone, sharded_head, batches) -> dict:
    optimizer = torch.optim.SGD([*model.parameters(), *sharded_head.parameters()], lr=0.1, momentum=0.9)
    losses, gradients = [], []
    for images, labels in batches:
        loss, _ = sharded_head(model(images), labels)
        loss.backward()
        losses.append(float(loss.detach()))
        gradients.append([full(param.grad).clone() for param in local_backbone.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return {
        "losses": losses,
        "gradients": gradients,
        "backbone": [full(param.detach()).clone() for param in local_backbone.parameters()],
        "head": (sharded_head.class_start, sharded_head.weight.detach().clone()),
    }


def wrapped_worker(rank, world_size, wrapper, tile_classes, dtype):
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    local = backbone(dtype)
    model = DistributedDataParallel(local) if wrapper == "ddp" else fully_shard(local)
    batches = []
    for step, counts in enumerate(ROWS[world_size]):
        images, labels = global_batch(step, sum(counts), dtype)
        start = sum(counts[:rank])
        batches.append((images[start : start + counts[rank]], labels[start : start + counts[rank]]))
    return train(model, local, head(tile_classes, dtype), batches)


def reference(world_size, tile_classes, dtype=torch.float32) -> dict:
    local = backbone(dtype)
    batches = [global_batch(step, sum(counts), dtype) for step, counts in enumerate(ROWS[world_size])]
    return train(local, local, head(tile_classes, dtype), batches)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    scale = max(1.0, float(expected.abs().max()))
    assert float((actual - expected).abs().max()) <= TOLERANCE[expected.dtype] * scale


# DDP on 2 and 3 ranks in both modes; FSDP2 (whose averaging is DDP's) on 3 ranks; fp32 once
CASES = [
    *[("ddp", n, tile, torch.float64) for n in (2, 3) for tile in (None, 4)],
    *[("fsdp", 3, tile, torch.float64) for tile in (None, 4)],
    ("ddp", 3, None, torch.float32),
]


@pytest.mark.parametrize(("wrapper", "world_size", "tile_classes", "dtype"), CASES)
def test_plain_wrappers_give_the_single_process_training(wrapper, world_size, tile_classes, dtype):
    expected = reference(world_size, tile_classes, dtype)
    per_rank = run_distributed(wrapped_worker, world_size, wrapper, tile_classes, dtype, timeout=120)
    weight = torch.cat([shard for _, shard in sorted((r["head"] for r in per_rank), key=lambda h: h[0])])
    assert_close(weight, expected["head"][1])
    tolerance = TOLERANCE[dtype]
    for result in per_rank:
        assert result["losses"] == pytest.approx(expected["losses"], rel=tolerance, abs=tolerance)
        for step_grads, expected_grads in zip(result["gradients"], expected["gradients"]):
            for grad, expected_grad in zip(step_grads, expected_grads):
                assert_close(grad, expected_grad)
        for param, expected_param in zip(result["backbone"], expected["backbone"]):
            assert_close(param, expected_param)


def summed_worker(rank, world_size):
    """A head built with gradient_reduction="sum" gives each rank its share: the ranks' gradients add
    up to the single-process one (for wrappers that sum instead of averaging)."""
    local = backbone()
    images, labels = global_batch(0, 8)
    rows = slice(rank * 4, rank * 4 + 4)
    loss, _ = head(None, gradient_reduction="sum")(local(images[rows]), labels[rows])
    loss.backward()
    return [param.grad.clone() for param in local.parameters()]


def test_sum_convention_hands_each_rank_its_share():
    shares = run_distributed(summed_worker, 2)
    expected = reference(2, None)["gradients"][0]  # the first step has rows [4, 4], as above
    for index, expected_grad in enumerate(expected):
        assert_close(shares[0][index] + shares[1][index], expected_grad)


def test_a_batch_larger_than_the_first_is_a_one_line_error_unless_checked_every_step():
    from facetrain.errors import FacetrainError

    embeddings, labels = torch.randn(6, DIM), torch.arange(6)
    module = head(None)
    module(embeddings[:4], labels[:4])
    with pytest.raises(FacetrainError, match="more than any rank's 4 at the first step.*check_every_step"):
        module(embeddings, labels)
    checked = head(None, check_every_step=True)
    checked(embeddings[:4], labels[:4])
    assert torch.isfinite(checked(embeddings, labels).loss)


def test_unknown_gradient_reduction_is_a_one_line_error():

    with pytest.raises(ValueError, match="gradient_reduction must be one of mean, sum"):
        ShardedMarginHead(CLASSES, DIM, gradient_reduction="average")
