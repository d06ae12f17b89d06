"""Label smoothing in the sharded head equals torch's `cross_entropy(label_smoothing=eps)` on the dense
margin logits.

fp64 to 1e-10: each step's loss and the embeddings' and weight's gradients, untiled and tiled (T = 3,
tiles that split every shard unevenly), at world sizes 1, 2, 3 with uneven shards (23 classes) and
uneven rows; for a classic margin (CosFace), one that sees the norms (AdaFace, with its running
state), one that modulates the negatives (CurricularFace), sub-centers, and Partial FC, whose
smoothing spreads over the classes every rank kept.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from facetrain.errors import FacetrainError
from facetrain.heads import DenseMarginHead, HeadPlan, ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train import head_plan
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config, load_config
from tests.support.distributed import run_distributed
from tests.support.head_problems import local_rows
from tests.support.margin_references import (
    BATCH,
    CLASSES,
    DIM,
    SCALE,
    assert_close,
    batches,
    reference_logits,
)

EPSILON = 0.1
MODES = {"untiled": HeadPlan(), "tiled": HeadPlan("tiled", 3)}
# (margin, mode, sub-centers, Partial FC's sample rate)
CASES = [
    ("cosface", "untiled", 1, 1.0),
    ("cosface", "tiled", 1, 1.0),
    ("adaface", "untiled", 1, 1.0),
    ("adaface", "tiled", 1, 1.0),
    ("curricularface", "untiled", 1, 1.0),
    ("curricularface", "tiled", 1, 1.0),
    ("cosface", "untiled", 2, 1.0),
    ("cosface", "untiled", 1, 0.5),
    ("cosface", "tiled", 1, 0.5),
]


def centres(weight, sub_centers):
    """K centres a class (C x K*D, class-major): the class's row and K - 1 others near it."""
    generator = torch.Generator().manual_seed(5)
    noise = torch.randn(CLASSES, sub_centers - 1, DIM, generator=generator, dtype=torch.float64)
    rows = torch.cat([weight[:, None], weight[:, None] + 0.05 * noise], dim=1)
    return rows.reshape(CLASSES, sub_centers * DIM)


def reference_step(name, cos, norm, labels, state):
    if name == "cosface":
        return torch.where(F.one_hot(labels, cos.shape[1]).bool(), cos - 0.35, cos), state
    logits, _, state = reference_logits(name, cos, norm, labels, state)
    return logits, state


def reference_run(name, weight, steps, sub_centers, kept_per_step):
    """Each step's loss, dX and dW: the dense logits over the step's classes (all, or the union of
    what every rank kept), then torch's smoothed cross-entropy."""
    initial = {"adaface": {"batch_mean": 20.0, "batch_std": 100.0}, "curricularface": {"t": 0.0}}
    state = {key: torch.tensor(value, dtype=torch.float64) for key, value in initial.get(name, {}).items()}
    results = []
    for (embeddings, labels), kept in zip(steps, kept_per_step):
        x, w = embeddings.clone().requires_grad_(), weight.clone().requires_grad_()
        norm = torch.linalg.vector_norm(x, dim=1)
        rows = w.view(CLASSES * sub_centers, DIM)
        cos = (x / norm[:, None]) @ (rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True)).t()
        cos = cos.view(BATCH, CLASSES, sub_centers).amax(dim=2)
        targets = labels
        if kept is not None:
            cos = cos[:, kept]
            targets = torch.searchsorted(kept, labels)
        logits, state = reference_step(name, cos, norm, targets, state)
        loss = F.cross_entropy(SCALE * logits, targets, label_smoothing=EPSILON)
        loss.backward()
        results.append((loss.detach(), x.grad, w.grad))
    return results


def smoothing_worker(rank, world_size):
    base_weight, steps = batches()
    results = {}
    for name, mode, sub_centers, sample_rate in CASES:
        weight = centres(base_weight, sub_centers)
        head = ShardedMarginHead(
            CLASSES, DIM, margin=name, scale=SCALE, plan=MODES[mode], sub_centers=sub_centers,
            sample_rate=sample_rate, gradient_reduction="sum", label_smoothing=EPSILON,
        ).double()  # fmt: skip
        with torch.no_grad():
            head.per_class(head.weight).copy_(weight[head.class_start : head.class_stop])
        sample = head._sample_classes
        kept_here = []

        def recording(local_labels, sample=sample, kept_here=kept_here, shard=head):
            kept, target_column = sample(local_labels)  # None: the whole shard
            rows = torch.arange(shard.class_count) if kept is None else kept
            kept_here.append(rows + shard.class_start)
            return kept, target_column

        head._sample_classes = recording
        torch.manual_seed(11 + rank)  # Partial FC's draw: different on every rank
        run = []
        for embeddings, labels in steps:
            rows = local_rows(world_size, rank, BATCH)
            x = embeddings[rows].clone().requires_grad_()
            head.weight.grad = None
            loss, _ = head(x, labels[rows])
            loss.backward()
            grad_w = head.per_class(head.weight.grad).clone()
            run.append((loss.detach(), x.grad, grad_w))
        results[name, mode, sub_centers, sample_rate] = (run, kept_here)
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_label_smoothing_equals_torch_cross_entropy(world_size):
    per_rank = (
        [smoothing_worker(0, 1)]
        if world_size == 1
        else run_distributed(smoothing_worker, world_size, timeout=240)
    )
    weight, steps = batches()
    assert len(per_rank[0]) == len(CASES)
    for case in CASES:
        name, _, sub_centers, sample_rate = case
        kept_per_step = [None] * len(steps)
        if sample_rate < 1.0:
            kept_per_step = [
                torch.cat([rank_results[case][1][step] for rank_results in per_rank])
                for step in range(len(steps))
            ]
            if world_size < 3:  # 3 shards of 7-8 classes keep all: a step keeps at least its 12 rows' worth
                assert all(len(kept) < CLASSES for kept in kept_per_step)
        expected = reference_run(name, centres(weight, sub_centers), steps, sub_centers, kept_per_step)
        for step, (loss, grad_x, grad_w) in enumerate(expected):
            got = [rank_results[case][0][step] for rank_results in per_rank]
            for rank_loss, _, _ in got:
                assert_close(rank_loss, loss)
            assert_close(torch.cat([r[1] for r in got]), grad_x)
            assert_close(torch.cat([r[2] for r in got]), grad_w.view(CLASSES, -1))


def test_smoothing_moves_the_loss_by_eps_times_the_target_logit_over_the_mean():
    """At eps 0 the head is plain cross-entropy (the dense head's); eps adds eps x (target logit -
    mean logit)."""
    weight, steps = batches()
    embeddings, labels = steps[0]
    losses = []
    for epsilon in (0.0, EPSILON):
        head = ShardedMarginHead(
            CLASSES, DIM, margin="cosface", scale=SCALE, label_smoothing=epsilon
        ).double()
        dense = DenseMarginHead(CLASSES, DIM, margin="cosface", scale=SCALE, label_smoothing=epsilon).double()
        with torch.no_grad():
            head.weight.copy_(weight)
            dense.weight.copy_(weight)
        losses.append(head(embeddings, labels).loss.detach())
        assert_close(losses[-1], dense(embeddings, labels).loss.detach())
    cos = F.normalize(embeddings) @ F.normalize(weight).t()
    logits = SCALE * torch.where(F.one_hot(labels, CLASSES).bool(), cos - 0.35, cos)
    gap = logits.gather(1, labels[:, None]).squeeze(1) - logits.mean(dim=1)
    assert_close(losses[1] - losses[0], EPSILON * gap.mean())


def test_label_smoothing_is_checked():
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\)"):
        ShardedMarginHead(CLASSES, DIM, label_smoothing=1.0)
    with pytest.raises(ValueError, match="torch tiles"):
        ShardedMarginHead(CLASSES, DIM, plan=HeadPlan("tiled", 8, kernel="triton"), label_smoothing=0.1)
    with pytest.raises(FacetrainError, match=r"head.kernel = 'triton': has no label smoothing"):
        validate(load_config(overrides=["head.label_smoothing=0.1", "head.kernel=triton"]))


def test_head_kernel_auto_takes_the_torch_tiles_for_label_smoothing(monkeypatch):
    """Where auto would take Triton (CUDA), label smoothing takes the torch tiles, and the log says why."""
    monkeypatch.setattr(head_plan, "resolve_kernel", lambda requested, device_type: "triton")
    cfg, dims = Config(), init_parallel()
    cfg.head.mode, cfg.head.tile_classes = "tiled", 5
    assert head_plan.resolve_head_plan(cfg, 12, dims)[0].kernel == "triton"
    cfg.head.label_smoothing = 0.1
    plan, reasons = head_plan.resolve_head_plan(cfg, 12, dims)
    assert plan.kernel == "torch"
    assert reasons == "torch tiles for head.label_smoothing"
