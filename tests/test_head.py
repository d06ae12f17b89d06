"""The sharded margin head equals the dense single-process head: loss, gradients, training steps."""

from __future__ import annotations

import math

import pytest
import torch

from facetrain.errors import FacetrainError
from facetrain.heads import DenseMarginHead, HeadOptions, ShardedMarginHead
from facetrain.heads.naive_model_parallel import NaiveModelParallelHead
from facetrain.heads.plan import UNTILED
from facetrain.parallel.traffic import count_traffic
from tests.support.distributed import run_distributed
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


def sharded_step(rank, world_size, margin, weight, embeddings, labels, rows=None):
    # "sum": each rank's embeddings get their share of the gradient, which is what the reference's
    # rows hold (the default, "mean", multiplies it by the world size for DDP: tests/test_head_ddp.py)
    head = ShardedMarginHead(weight.shape[0], weight.shape[1], margin=margin, gradient_reduction="sum")
    head = head.to(weight.dtype)
    head.weight.data.copy_(weight[head.class_start : head.class_stop])
    rows = rows or local_rows(world_size, rank, embeddings.shape[0])
    x = embeddings[rows].clone().requires_grad_()
    loss, accuracy = head(x, labels[rows])
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad, accuracy


def parity_worker(rank, world_size):
    results = {}
    for dtype in (torch.float32, torch.float64):
        for pattern in LABEL_PATTERNS:
            weight, embeddings, labels = make_problem(pattern, dtype, world_size=world_size)
            for margin in COSINE_MARGINS:
                results[dtype, pattern, margin] = sharded_step(
                    rank, world_size, margin, weight, embeddings, labels
                )
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_equals_dense_reference(world_size):
    if world_size == 1:
        per_rank = [parity_worker(0, 1)]  # no process group at all
    else:
        per_rank = run_distributed(parity_worker, world_size, timeout=240)
    for (dtype, pattern, margin), _ in per_rank[0].items():
        weight, embeddings, labels = make_problem(pattern, dtype, world_size=world_size)
        loss, grad_x, grad_w, accuracy = dense_reference(margin, weight, embeddings, labels)
        for rank_result in per_rank:
            assert_matches(rank_result[dtype, pattern, margin][0], loss, dtype)
            assert float(rank_result[dtype, pattern, margin][3]) == pytest.approx(float(accuracy))
        assert_matches(torch.cat([r[dtype, pattern, margin][1] for r in per_rank]), grad_x, dtype)
        assert_matches(torch.cat([r[dtype, pattern, margin][2] for r in per_rank]), grad_w, dtype)


@pytest.mark.parametrize("margin, degrees", [("arcface", True), ("cosface", False)])
def test_matches_pytorch_metric_learning(margin, degrees):
    losses = pytest.importorskip("pytorch_metric_learning.losses")
    weight, embeddings, labels = make_problem("spread", torch.float32, num_classes=40, batch=16)
    m = 0.5 if degrees else 0.35
    reference_cls = losses.ArcFaceLoss if degrees else losses.CosFaceLoss
    reference = reference_cls(40, EMBEDDING, margin=math.degrees(m) if degrees else m, scale=64.0)
    reference.W.data.copy_(weight.t())
    x_ref = embeddings.clone().requires_grad_()
    expected = reference(x_ref, labels)
    expected.backward()
    loss, grad_x, grad_w, _ = sharded_step(0, 1, margin, weight, embeddings, labels)
    assert_matches(loss, expected.detach(), torch.float32)
    assert_matches(grad_x, x_ref.grad, torch.float32)
    assert_matches(grad_w, reference.W.grad.t(), torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_keeps_statistics_in_fp32(dtype):
    weight, embeddings, labels = make_problem("spread", torch.float32, num_classes=2000, batch=64)
    head = ShardedMarginHead(2000, EMBEDDING, margin="arcface", scale=64.0)
    head.weight.data.copy_(weight)
    full, _ = head(embeddings, labels)
    with torch.autocast("cpu", dtype=dtype):
        x = embeddings.clone().requires_grad_()
        low, _ = head(x, labels)
    low.backward()
    assert low.dtype == torch.float32
    assert torch.isfinite(low) and torch.isfinite(x.grad).all() and torch.isfinite(head.weight.grad).all()
    assert abs(low.item() - full.item()) <= 1e-2 * full.item()


def traffic_worker(rank, world_size, head_kind):
    counts = {}
    for num_classes in (1_000, 100_000):
        head_cls = ShardedMarginHead if head_kind == "sharded" else NaiveModelParallelHead
        head = head_cls(num_classes, 32, margin="cosface")
        x = torch.randn(8, 32, requires_grad=True)
        labels = torch.randint(0, num_classes, (8,))
        with count_traffic() as traffic:
            head(x, labels).loss.backward()
        counts[num_classes] = traffic.bytes_sent
    return counts


def test_traffic_does_not_grow_with_classes():
    sharded = run_distributed(traffic_worker, 2, "sharded")
    naive = run_distributed(traffic_worker, 2, "naive")
    for counts in sharded:
        assert counts[1_000] == counts[100_000] > 0
    assert naive[1][100_000] > 50 * naive[1][1_000]  # rank 1 ships its logit shard to rank 0


def training_worker(rank, world_size, steps):
    from facetrain.parallel.data_parallel import wrap_data_parallel

    torch.manual_seed(0)
    backbone = torch.nn.Linear(16, EMBEDDING)
    head = ShardedMarginHead(NUM_CLASSES, EMBEDDING, margin="arcface")
    full_weight = torch.randn(NUM_CLASSES, EMBEDDING, generator=torch.Generator().manual_seed(1)) * 0.05
    head.weight.data.copy_(full_weight[head.class_start : head.class_stop])
    model = wrap_data_parallel(backbone, torch.device("cpu"))
    optimizer = torch.optim.SGD(
        [*model.parameters(), *head.parameters()], lr=0.1, momentum=0.9, weight_decay=5e-4
    )
    data = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        images = torch.randn(8, 16, generator=data)
        labels = torch.randint(0, NUM_CLASSES, (8,), generator=data)
        rows = local_rows(world_size, rank, 8)
        loss, _ = head(model(images[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, backbone.weight.detach(), head.weight.detach()


def test_sgd_steps_match_dense_training():
    sharded = run_distributed(training_worker, 2, 4)
    torch.manual_seed(0)
    backbone = torch.nn.Linear(16, EMBEDDING)
    head = DenseMarginHead(NUM_CLASSES, EMBEDDING, margin="arcface")
    head.weight.data.copy_(
        torch.randn(NUM_CLASSES, EMBEDDING, generator=torch.Generator().manual_seed(1)) * 0.05
    )
    optimizer = torch.optim.SGD(
        [*backbone.parameters(), *head.parameters()], lr=0.1, momentum=0.9, weight_decay=5e-4
    )
    data = torch.Generator().manual_seed(2)
    for step in range(4):
        images = torch.randn(8, 16, generator=data)
        labels = torch.randint(0, NUM_CLASSES, (8,), generator=data)
        loss, _ = head(backbone(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert sharded[0][0][step] == pytest.approx(loss.item(), rel=1e-5)
    assert_matches(sharded[0][1], backbone.weight.detach(), torch.float32)
    assert_matches(torch.cat([r[2] for r in sharded]), head.weight.detach(), torch.float32)


def uneven_worker(rank, world_size, sizes):
    weight, embeddings, labels = make_problem("spread", torch.float64)
    start = sum(sizes[:rank])
    return sharded_step(
        rank, world_size, "arcface", weight, embeddings, labels, slice(start, start + sizes[rank])
    )


@pytest.mark.parametrize("sizes", [[7, 3], [10, 0]])
def test_unequal_local_batches(sizes):
    per_rank = run_distributed(uneven_worker, 2, sizes)
    weight, embeddings, labels = make_problem("spread", torch.float64)
    loss, grad_x, grad_w, _ = dense_reference("arcface", weight, embeddings, labels)
    assert_matches(per_rank[1][0], loss, torch.float64)
    assert_matches(torch.cat([r[1] for r in per_rank]), grad_x, torch.float64)
    assert_matches(torch.cat([r[2] for r in per_rank]), grad_w, torch.float64)


def bad_width_worker(rank, world_size):
    head = ShardedMarginHead(10, 8)
    width = 8 if rank == 0 else 6
    try:
        head(torch.randn(4, width), torch.zeros(4, dtype=torch.int64))
    except FacetrainError as error:
        return str(error)
    return None


def test_wrong_width_on_one_rank_fails_everywhere_without_hanging():
    messages = run_distributed(bad_width_worker, 2, timeout=60)
    assert all(m and "rank 1" in m and "6 wide" in m for m in messages)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"margin": "bogus"}, "unknown margin 'bogus'"),
        ({"scale": 0.0}, "scale must be > 0"),
        ({"margin": "cosface", "m1": 0.3}, "takes m, not m1"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(
        FacetrainError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")
    ):
        ShardedMarginHead(10, 8, **kwargs)


def test_rarer_settings_as_one_options_object_or_as_keywords():
    """#59: the rarer settings are one HeadOptions; their old keywords still build the same head, beside the
    margin's parameters, and anything but a HeadOptions as `options` is one line."""
    options = HeadOptions(sub_centers=2, check_every_step=True, gradient_reduction="sum", label_smoothing=0.1)
    by_keywords = ShardedMarginHead(
        10, 8, margin="cosface", sub_centers=2, check_every_step=True, gradient_reduction="sum",
        label_smoothing=0.1, m=0.3,
    )  # fmt: skip
    by_options = ShardedMarginHead(10, 8, margin="cosface", options=options, m=0.3)
    for head in (by_keywords, by_options):
        assert head.options == options and head.margin.m == 0.3
        assert (head.sub_centers, head.check_every_step, head.gradient_reduction) == (2, True, "sum")
        assert head.label_smoothing == 0.1 and head.weight.shape == (20, 8)
    assert ShardedMarginHead(10, 8, options=options, sub_centers=3).sub_centers == 3  # a keyword over options
    with pytest.raises(TypeError, match="^a head's options are a HeadOptions, not int: options=HeadOptions"):
        ShardedMarginHead(10, 8, "arcface", 64.0, 1.0, None, UNTILED, 2)


def test_bad_inputs_are_one_line_errors():
    head = ShardedMarginHead(10, 8)
    with pytest.raises(FacetrainError, match="expects 8"):
        head(torch.randn(4, 6), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(FacetrainError, match=r"label 10 is outside \[0, 10\)"):
        head(torch.randn(2, 8), torch.tensor([3, 10]))


def too_many_ranks_worker(rank, world_size):
    try:
        ShardedMarginHead(2, 8)
    except FacetrainError as error:
        return str(error)
    return None


def test_more_ranks_than_classes_is_an_error():
    messages = run_distributed(too_many_ranks_worker, 3)
    assert all(m == "2 classes cannot be sharded over 3 ranks; use at most 2 ranks" for m in messages)


def partial_fc_worker(rank, world_size):
    torch.manual_seed(rank)
    weight, embeddings, labels = make_problem("spread", torch.float64, num_classes=200, batch=12)
    head = ShardedMarginHead(200, EMBEDDING, margin="cosface", sample_rate=0.25).double()
    head.weight.data.copy_(weight[head.class_start : head.class_stop])
    rows = local_rows(world_size, rank, 12)
    loss, _ = head(embeddings[rows], labels[rows])
    loss.backward()
    return float(loss), head.class_start, head.weight.grad


def test_partial_fc_keeps_positives_and_equals_dense_on_the_sample():
    per_rank = run_distributed(partial_fc_worker, 2)
    weight, embeddings, labels = make_problem("spread", torch.float64, num_classes=200, batch=12)
    kept = torch.cat([start + torch.nonzero(grad.abs().sum(1)).squeeze(1) for _, start, grad in per_rank])
    assert set(labels.tolist()) <= set(kept.tolist())
    assert len(kept) == 2 * 25  # a quarter of each 100-class shard
    remapped = torch.searchsorted(kept, labels)
    loss, _, _, _ = dense_reference("cosface", weight[kept], embeddings, remapped)
    assert per_rank[0][0] == pytest.approx(float(loss), rel=1e-10)
    assert per_rank[1][0] == per_rank[0][0]
