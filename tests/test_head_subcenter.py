"""Sub-center heads (head.sub_centers): the sharded head equals the dense one, Partial FC keeps whole
classes, checkpoints reshard, and the untiled-only rule is one line."""

from __future__ import annotations

import pytest
import torch

from facetrain.checkpoint import CheckpointStates, load_full_head
from facetrain.checkpoint.reader import load_checkpoint
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.errors import FacetrainError
from facetrain.heads import DenseMarginHead, HeadPlan, ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train.optim import build_optimizer
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState
from tests.support.distributed import run_distributed
from tests.support.head_problems import local_rows

CLASSES, CENTRES, DIM, BATCH = 13, 3, 8, 10
MARGINS = ["arcface", "cosface", "curricularface"]  # the last modulates the negatives (their max centre)


def make_problem(classes=CLASSES, batch=BATCH):
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(classes * CENTRES, DIM, generator=generator, dtype=torch.float64) * 0.05
    embeddings = torch.randn(batch, DIM, generator=generator, dtype=torch.float64) * 3.0
    labels = torch.randint(0, classes, (batch,), generator=generator)
    return weight, embeddings, labels


def dense_step(margin, weight, embeddings, labels):
    head = DenseMarginHead(weight.shape[0] // CENTRES, DIM, margin=margin, sub_centers=CENTRES).double()
    head.weight.data.copy_(weight)
    x = embeddings.clone().requires_grad_()
    loss, accuracy = head(x, labels)
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad, accuracy


def sharded_worker(rank, world_size):
    weight, embeddings, labels = make_problem()
    results = {}
    for margin in MARGINS:
        head = ShardedMarginHead(CLASSES, DIM, margin=margin, sub_centers=CENTRES, gradient_reduction="sum")
        head = head.double()
        head.weight.data.copy_(weight[head.class_start * CENTRES : head.class_stop * CENTRES])
        rows = local_rows(world_size, rank, BATCH)
        x = embeddings[rows].clone().requires_grad_()
        loss, accuracy = head(x, labels[rows])
        loss.backward()
        results[margin] = loss.detach(), x.grad, head.weight.grad, accuracy
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_sub_centers_equal_the_dense_head(world_size):
    if world_size == 1:
        per_rank = [sharded_worker(0, 1)]
    else:
        per_rank = run_distributed(sharded_worker, world_size)
    weight, embeddings, labels = make_problem()
    for margin in MARGINS:
        loss, grad_x, grad_w, accuracy = dense_step(margin, weight, embeddings, labels)
        for result in per_rank:
            assert torch.allclose(result[margin][0], loss, rtol=0, atol=1e-10)
            assert float(result[margin][3]) == pytest.approx(float(accuracy))
        assert torch.allclose(torch.cat([r[margin][1] for r in per_rank]), grad_x, rtol=0, atol=1e-10)
        assert torch.allclose(torch.cat([r[margin][2] for r in per_rank]), grad_w, rtol=0, atol=1e-10)


def test_the_nearest_centre_decides_the_logit():
    head = DenseMarginHead(2, 2, margin="softmax", scale=1.0, sub_centers=2).double()
    head.weight.data.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]))
    x = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    loss, accuracy = head(x, torch.tensor([0]))
    # class 0's second centre is x itself (cos 1), class 1's nearest is at 90 degrees (cos 0)
    assert float(loss.detach()) == pytest.approx(float(torch.log1p(torch.exp(torch.tensor(-1.0)))))
    assert float(accuracy) == 1.0


def test_partial_fc_keeps_every_centre_of_a_kept_class():
    torch.manual_seed(0)
    weight, embeddings, labels = make_problem(classes=40, batch=6)
    head = ShardedMarginHead(40, DIM, margin="cosface", sample_rate=0.25, sub_centers=CENTRES).double()
    head.weight.data.copy_(weight)
    loss, _ = head(embeddings, labels)
    loss.backward()
    touched = head.weight.grad.view(40, CENTRES, DIM).abs().sum(2) != 0
    kept = torch.nonzero(touched.any(1)).squeeze(1)
    assert set(labels.tolist()) <= set(kept.tolist()) and len(kept) <= 10
    remapped = torch.searchsorted(kept, labels)
    rows = weight.view(40, CENTRES, DIM)[kept].reshape(-1, DIM)
    reference, _, _, _ = dense_step("cosface", rows, embeddings, remapped)
    assert float(loss.detach()) == pytest.approx(float(reference), rel=1e-10)


def build(seed: int, centres: int = CENTRES):
    torch.manual_seed(seed)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, DIM))
    head = ShardedMarginHead(CLASSES, DIM, margin="arcface", sub_centers=centres)
    head.reset_parameters(seed=seed)
    return backbone, head, build_optimizer(Config().optim, backbone, head)


def save_worker(rank, world_size, run_dir):
    backbone, head, optimizer = build(seed=0)
    for _ in range(2):
        loss, _ = head(backbone(torch.randn(4, 4)), torch.randint(0, CLASSES, (4,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    cfg = Config()
    cfg.model.embedding_size, cfg.head.sub_centers = DIM, CENTRES
    state = TrainState(step=2, epoch=0, consumed=8)
    names = list(map(str, range(CLASSES)))
    save_checkpoint(
        run_dir, init_parallel(), CheckpointStates(state, cfg, names, backbone, head, optimizer, None)
    )
    return head.weight.detach(), optimizer.state[head.weight]["momentum_buffer"]


def load_worker(rank, world_size, run_dir, centres=CENTRES):
    backbone, head, optimizer = build(seed=1, centres=centres)
    try:
        load_checkpoint(run_dir, init_parallel(), backbone, head, optimizer, None)
    except FacetrainError as error:
        return str(error)
    return head.weight.detach(), optimizer.state[head.weight]["momentum_buffer"]


def test_sub_center_checkpoints_reshard_and_refuse_another_k(tmp_path):
    saved = run_distributed(save_worker, 2, tmp_path)
    weight, momentum = (torch.cat(parts) for parts in zip(*saved))
    loaded = run_distributed(load_worker, 3, tmp_path)
    assert torch.equal(torch.cat([w for w, _ in loaded]), weight)
    assert torch.equal(torch.cat([m for _, m in loaded]), momentum)
    assert torch.equal(load_full_head(tmp_path), weight.view(CLASSES, CENTRES * DIM))
    message = load_worker(0, 1, tmp_path, centres=1)
    assert "3 sub-centers a class, this run 1; set head.sub_centers to match" in message


def seeded_worker(rank, world_size):
    head = ShardedMarginHead(CLASSES, DIM, sub_centers=CENTRES)
    head.reset_parameters(seed=3)
    return head.weight.detach()


def test_seeded_start_does_not_depend_on_the_world_size():
    whole = seeded_worker(0, 1)
    assert whole.shape == (CLASSES * CENTRES, DIM)
    assert torch.equal(torch.cat(run_distributed(seeded_worker, 2)), whole)
    assert not torch.equal(whole[::CENTRES], whole[1::CENTRES])  # a class's centres start apart


@pytest.mark.parametrize("settings", [{"mode": "tiled"}, {"weight_dtype": "bf16"}])
def test_sub_centers_need_the_untiled_head(settings):
    cfg = Config()
    cfg.head.sub_centers = 2
    for key, value in settings.items():
        setattr(cfg.head, key, value)
    with pytest.raises(FacetrainError, match="head.sub_centers.*needs the untiled head"):
        validate(cfg, world_size=1)
    with pytest.raises(ValueError, match="needs the untiled head"):
        ShardedMarginHead(CLASSES, DIM, plan=HeadPlan("tiled", 4), sub_centers=2)
