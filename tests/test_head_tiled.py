"""The tiled head equals the dense single-process head; its fused optimizers equal torch.optim.

Everything in fp64 to 1e-10: loss, embedding gradient and weight gradient for every margin, world sizes
1-3 and tiles that split a rank's classes unevenly (T = 3 divides no shard of 23 classes over 2 or 3
ranks, T = 1 is a tile per class, T = 100 one tile); the weights after k steps of the fused SGD and
AdamW against the untiled head + torch.optim; Partial FC's lazy rows against a plain reference.
"""

from __future__ import annotations

import pytest
import torch

from facetrain.errors import FacetrainError
from facetrain.heads import DenseMarginHead, HeadPlan, ShardedMarginHead
from facetrain.heads.fused_optim import FusedAdamW, FusedSGD
from facetrain.heads.memory import choose_mode, estimate_head_memory
from facetrain.process_memory import PeakRss
from tests.support.distributed import run_distributed
from tests.support.head_plans import head_plan
from tests.support.head_problems import (
    COSINE_MARGINS,
    EMBEDDING,
    LABEL_PATTERNS,
    NUM_CLASSES,
    assert_matches,
    dense_reference,
    local_rows,
    make_problem,
)

TILES = [3, 1, 100]
STEPS = 4
OPTIMIZERS = {
    "sgd": (FusedSGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}),
    "adamw": (FusedAdamW, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.05, "betas": (0.9, 0.99)}),
}


def tiled_step(rank, world_size, margin, tile, weight, embeddings, labels):
    head = ShardedMarginHead(
        weight.shape[0], weight.shape[1], margin=margin, plan=head_plan(tile), gradient_reduction="sum"
    )
    head = head.double()
    head.weight.data.copy_(weight[head.class_start : head.class_stop])
    rows = local_rows(world_size, rank, embeddings.shape[0])
    x = embeddings[rows].clone().requires_grad_()
    loss, accuracy = head(x, labels[rows])
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad, accuracy


def exactness_worker(rank, world_size):
    results = {}
    for pattern in LABEL_PATTERNS:
        weight, embeddings, labels = make_problem(pattern, torch.float64, world_size=world_size)
        for margin in COSINE_MARGINS:
            for tile in TILES:
                results[pattern, margin, tile] = tiled_step(
                    rank, world_size, margin, tile, weight, embeddings, labels
                )
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_tiled_equals_dense_reference(world_size):
    if world_size == 1:
        per_rank = [exactness_worker(0, 1)]
    else:
        per_rank = run_distributed(exactness_worker, world_size, timeout=240)
    assert len(per_rank[0]) == len(LABEL_PATTERNS) * len(COSINE_MARGINS) * len(TILES)
    for pattern, margin, tile in per_rank[0]:
        weight, embeddings, labels = make_problem(pattern, torch.float64, world_size=world_size)
        loss, grad_x, grad_w, accuracy = dense_reference(margin, weight, embeddings, labels)
        results = [rank_results[pattern, margin, tile] for rank_results in per_rank]
        for rank_loss, _, _, rank_accuracy in results:
            assert_matches(rank_loss, loss, torch.float64)
            assert float(rank_accuracy) == pytest.approx(float(accuracy))
        assert_matches(torch.cat([r[1] for r in results]), grad_x, torch.float64)
        assert_matches(torch.cat([r[2] for r in results]), grad_w, torch.float64)


def training_batches(steps, batch=10, num_classes=NUM_CLASSES):
    generator = torch.Generator().manual_seed(5)
    return [
        (
            torch.randn(batch, EMBEDDING, generator=generator, dtype=torch.float64) * 3.0,
            torch.randint(0, num_classes, (batch,), generator=generator),
        )
        for _ in range(steps)
    ]


def fused_worker(rank, world_size, name, tile):
    fused_class, _, settings = OPTIMIZERS[name]
    weight, _, _ = make_problem("spread", torch.float64)
    head = ShardedMarginHead(
        NUM_CLASSES, EMBEDDING, margin="arcface", plan=head_plan(tile, fused=True), gradient_reduction="sum"
    )
    head = head.double()
    head.weight.data.copy_(weight[head.class_start : head.class_stop])
    head.fuse_optimizer(fused_class([head.weight], **settings))
    grads = []
    for embeddings, labels in training_batches(STEPS):
        rows = local_rows(world_size, rank, embeddings.shape[0])
        x = embeddings[rows].clone().requires_grad_()
        head(x, labels[rows]).loss.backward()
        assert head.weight.grad is None  # no weight gradient is ever allocated
        grads.append(x.grad)
    return head.weight.detach(), grads, dict(head.fused_optimizer.state[head.weight])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size", [1, 2])
def test_fused_optimizer_equals_torch_optim(name, world_size):
    """k steps of the tiled head with its fused optimizer = the untiled head + torch.optim, in fp64."""
    _, torch_class, settings = OPTIMIZERS[name]
    if world_size == 1:
        per_rank = [fused_worker(0, 1, name, 3)]
    else:
        per_rank = run_distributed(fused_worker, world_size, name, 3)
    weight, _, _ = make_problem("spread", torch.float64)
    reference = ShardedMarginHead(NUM_CLASSES, EMBEDDING, margin="arcface").double()
    reference.weight.data.copy_(weight)
    optimizer = torch_class(reference.parameters(), **settings)
    for step, (embeddings, labels) in enumerate(training_batches(STEPS)):
        x = embeddings.clone().requires_grad_()
        optimizer.zero_grad()
        reference(x, labels).loss.backward()
        optimizer.step()
        assert_matches(torch.cat([r[1][step] for r in per_rank]), x.grad, torch.float64)
    assert_matches(torch.cat([r[0] for r in per_rank]), reference.weight.detach(), torch.float64)
    torch_state = optimizer.state[reference.weight]
    for key in per_rank[0][2]:
        if key == "step":
            assert all(float(r[2]["step"]) == float(torch_state["step"]) == STEPS for r in per_rank)
        else:
            assert_matches(torch.cat([r[2][key] for r in per_rank]), torch_state[key], torch.float64)


class KeptRows:
    """Records the rows Partial FC keeps, by wrapping the head's sampler."""

    def __init__(self, head):
        self.sample, self.kept = head._sample_classes, []
        head._sample_classes = self

    def __call__(self, local_labels):
        kept, target_column = self.sample(local_labels)
        self.kept.append(kept)
        return kept, target_column


def partial_fc_worker(rank, world_size):
    """The tiled head's lazy Partial FC steps, and a plain reference of the same semantics: the untiled
    head's gradient on the same sampled rows (same RNG), SGD applied to those rows only."""
    num_classes, lr, momentum, decay = 200, 0.1, 0.9, 5e-4
    weight, _, _ = make_problem("spread", torch.float64, num_classes=num_classes)
    heads = [
        ShardedMarginHead(
            num_classes, EMBEDDING, margin="cosface", sample_rate=0.25, plan=head_plan(tile, fused=fused)
        ).double()
        for tile, fused in ((7, True), (None, False))
    ]
    for head in heads:
        head.weight.data.copy_(weight[head.class_start : head.class_stop])
    tiled, reference = heads
    tiled.fuse_optimizer(FusedSGD([tiled.weight], lr, decay, momentum=momentum))
    recorder = KeptRows(reference)
    buffer = torch.zeros_like(reference.weight)
    before = []
    for step, (embeddings, labels) in enumerate(training_batches(STEPS, batch=12, num_classes=num_classes)):
        rows = local_rows(world_size, rank, 12)
        before.append(tiled.weight.detach().clone())
        for head in heads:
            torch.manual_seed(100 * step + rank)  # the same sample for both heads
            head(embeddings[rows], labels[rows]).loss.backward()
        kept = recorder.kept[-1]
        with torch.no_grad():
            direction = reference.weight.grad[kept] + decay * reference.weight[kept]
            buffer[kept] = momentum * buffer[kept] + direction
            reference.weight[kept] -= lr * buffer[kept]
        reference.weight.grad = None
    momentum_buffer = tiled.fused_optimizer.state[tiled.weight]["momentum_buffer"]
    return tiled.weight.detach(), reference.weight.detach(), recorder.kept, before, buffer, momentum_buffer


@pytest.mark.parametrize("world_size", [1, 2])
def test_partial_fc_updates_only_sampled_rows_lazily(world_size):
    if world_size == 1:
        per_rank = [partial_fc_worker(0, 1)]
    else:
        per_rank = run_distributed(partial_fc_worker, world_size)
    for tiled, reference, kept, before, buffer, momentum_buffer in per_rank:
        assert_matches(tiled, reference, torch.float64)
        assert_matches(momentum_buffer, buffer, torch.float64)
        assert all(len(rows) == 50 // world_size for rows in kept)  # a quarter of the shard
        # rows not sampled in the last step kept their weight exactly (no decay, no momentum)
        untouched = torch.ones(tiled.shape[0], dtype=torch.bool)
        untouched[kept[-1]] = False
        assert untouched.any() and torch.equal(tiled[untouched], before[-1][untouched])
        assert not torch.equal(tiled[kept[-1]], before[-1][kept[-1]])


def test_frozen_tiled_head_is_not_updated():
    head = ShardedMarginHead(30, 8, plan=head_plan(4, fused=True))
    head.fuse_optimizer(FusedSGD([head.weight], lr=0.1))
    head.weight.requires_grad_(False)
    start = head.weight.detach().clone()
    x = torch.randn(6, 8, requires_grad=True)
    head(x, torch.randint(0, 30, (6,))).loss.backward()
    assert torch.equal(head.weight, start) and x.grad is not None and not head.fused_optimizer.state


def test_a_step_holds_tiles_not_the_class_count():
    """At the floor: one training step of the fused tiled head peaks at its weight and momentum plus
    tile-sized work; the untiled head's backward alone holds weight, B x C logits and a C x D gradient
    (its momentum comes after the logits are freed)."""
    classes, dim, batch, tile = 200_000, 64, 128, 1024
    x, labels = torch.randn(batch, dim, requires_grad=True), torch.randint(0, classes, (batch,))
    floor = 2 * classes * dim * 4  # weight + momentum, fp32
    with PeakRss() as tiled_peak:
        head = ShardedMarginHead(classes, dim, plan=head_plan(tile, fused=True))
        head.fuse_optimizer(FusedSGD([head.weight], lr=0.1, momentum=0.9))
        head(x, labels).loss.backward()
        del head
    with PeakRss() as untiled_peak:
        head = ShardedMarginHead(classes, dim)
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)
        head(x, labels).loss.backward()
        optimizer.step()
        del head, optimizer
    assert floor <= tiled_peak.growth_bytes <= 1.1 * floor
    assert untiled_peak.growth_bytes >= floor + 0.95 * batch * classes * 4
    with PeakRss() as bf16_peak:
        head = ShardedMarginHead(classes, dim, plan=head_plan(tile, fused=True, dtype=torch.bfloat16))
        head.fuse_optimizer(FusedSGD([head.weight], lr=0.1, momentum=0.9, state_dtype=torch.bfloat16))
        head(x, labels).loss.backward()
        del head
    # the memory model (the training log's, head.mode auto's and the scaling model's) to 10 %
    for peak, storage in ((tiled_peak, torch.float32), (bf16_peak, torch.bfloat16)):
        plan = HeadPlan("tiled", tile, storage, storage, fused_optimizer=True)
        model = estimate_head_memory(classes, dim, batch, plan).total
        assert peak.growth_bytes == pytest.approx(model, rel=0.1), storage


def test_memory_model_and_auto_mode():
    untiled = estimate_head_memory(1_000_000, 512, 256, HeadPlan())
    tiled = estimate_head_memory(1_000_000, 512, 256, HeadPlan("tiled", fused_optimizer=True))
    bf16 = estimate_head_memory(
        1_000_000, 512, 256, HeadPlan("tiled", 8192, torch.bfloat16, torch.bfloat16, fused_optimizer=True)
    )
    assert untiled.persistent == 3 * 4 * 512 * 1_000_000 and untiled.step >= 4 * 256 * 1_000_000
    assert tiled.persistent == 2 * 4 * 512 * 1_000_000 and tiled.gradient == 0
    assert bf16.persistent == tiled.persistent // 2 and tiled.step < 0.05 * tiled.persistent
    assert choose_mode("auto", untiled, 2 * untiled.total, needs_tiles=False) == "untiled"
    assert choose_mode("auto", untiled, untiled.total, needs_tiles=False) == "tiled"
    assert choose_mode("auto", untiled, 10 * untiled.total, needs_tiles=True) == "tiled"
    assert choose_mode("untiled", untiled, 0, needs_tiles=False) == "untiled"


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="tile_classes must be >= 1, got 0"):
        HeadPlan("tiled", 0)
    with pytest.raises(ValueError, match="fused head optimizer needs the tiled head"):
        HeadPlan(fused_optimizer=True)
    with pytest.raises(ValueError, match=r"sample_rate must be in \(0, 1\], got 1.5"):
        ShardedMarginHead(10, 8, sample_rate=1.5)
    untiled = ShardedMarginHead(10, 8)
    with pytest.raises(ValueError, match="plan has no fused optimizer"):
        untiled.fuse_optimizer(FusedSGD([untiled.weight], lr=0.1))
    with pytest.raises(ValueError, match=r"another tensor than this head's weight"):
        ShardedMarginHead(10, 8, plan=head_plan(4, fused=True)).fuse_optimizer(
            FusedSGD([untiled.weight], lr=0.1)
        )
    with pytest.raises(ValueError, match="call head.fuse_optimizer"):
        ShardedMarginHead(10, 8, plan=head_plan(4, fused=True))(torch.randn(2, 8), torch.tensor([0, 1]))
    with pytest.raises(FacetrainError, match="updates one weight, the tiled head's, not 2"):
        FusedSGD([untiled.weight, torch.nn.Parameter(torch.ones(2))], lr=0.1)
    sgd = FusedSGD([untiled.weight], lr=0.1)
    with pytest.raises(FacetrainError, match="exp_avg, exp_avg_sq, which optim.name=sgd does not keep"):
        sgd.load_state_tensors({name: torch.zeros(10, 8) for name in FusedAdamW.state_names})


def test_autocast_keeps_tiled_statistics_in_fp32():
    """Under bf16 autocast the tiles' GEMMs run in bf16, the statistics in fp32."""
    weight, embeddings, labels = make_problem("spread", torch.float32, num_classes=2000, batch=64)
    head = ShardedMarginHead(2000, EMBEDDING, plan=head_plan(300))
    head.weight.data.copy_(weight)
    full, _ = head(embeddings, labels)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = embeddings.clone().requires_grad_()
        low, _ = head(x, labels)
    low.backward()
    assert low.dtype == torch.float32 and torch.isfinite(x.grad).all()
    assert abs(low.item() - full.item()) <= 1e-2 * full.item()
    reference = DenseMarginHead(2000, EMBEDDING)
    reference.weight.data.copy_(weight)
    assert_matches(full.detach(), reference(embeddings, labels).loss.detach(), torch.float32)
