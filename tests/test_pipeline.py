"""Pipeline parallelism: splitting backbones from outside, and pipelined steps that equal unsplit ones."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.heads import collectives
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.dims import ParallelDims, init_parallel
from facetrain.parallel.pipeline_split import (
    balanced_boundaries,
    boundaries_from_split_points,
    measure_unit_costs,
    pipeline_units,
    split_backbone,
)
from facetrain.train.config import TrainConfig
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from tests.support.distributed import run_distributed
from tests.support.pipeline_models import (
    BATCH,
    CLASSES,
    EMBEDDING,
    SIZE,
    TOLERANCE,
    projected_head,
    reference_step,
    replica_batch,
    tiny_backbone,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def run_stages(stages: list[nn.Module], images: torch.Tensor) -> torch.Tensor:
    for stage in stages:
        images = stage(images)
    return images


# ---- splitting, in one process ----------------------------------------------------------------


def test_units_open_residual_stages_one_level():
    backbone = build_backbone(ModelConfig(backbone="r18", embedding_size=EMBEDDING), SIZE)
    names = [unit.name for unit in pipeline_units(backbone)]
    assert names[:5] == ["stem.conv", "stem.bn", "stem.act", "layer1.0", "layer1.1"]
    assert "layer4.1" in names and names[-1] == "output.features"


@pytest.mark.parametrize(
    "split_points", [["layer3"], ["layer2.1", "output"], ["layer1.1", "layer3", "layer4.1"]]
)
def test_split_stages_chain_to_the_whole_model_with_the_same_parameter_names(split_points):
    torch.manual_seed(0)
    backbone = build_backbone(
        ModelConfig(backbone="r18", embedding_size=EMBEDDING, activation_checkpointing=True), SIZE
    )
    units = pipeline_units(backbone)
    stages = split_backbone(
        backbone, boundaries_from_split_points(units, split_points, len(split_points) + 1)
    )
    assert len(stages) == len(split_points) + 1
    names = [name for stage in stages for name, _ in stage.named_parameters()]
    assert names == [name for name, _ in backbone.named_parameters()]
    images = torch.randn(2, 3, *SIZE)
    for mode in (False, True):
        backbone.train(mode)
        torch.testing.assert_close(run_stages(stages, images), backbone(images))
    sliced = [m for stage in stages for m in stage.modules() if getattr(m, "checkpointable", False)]
    assert sliced and all(m.checkpointing for m in sliced)


def slowest_stage(costs: list[float], starts: list[int]) -> float:
    edges = [0, *starts, len(costs)]
    return max(sum(costs[a:b]) for a, b in zip(edges, edges[1:]))


def test_balanced_boundaries_minimise_the_slowest_stage():
    rng = random.Random(0)
    for _ in range(30):
        costs = [rng.uniform(0.1, 5.0) for _ in range(rng.randint(3, 9))]
        stages = rng.randint(2, min(4, len(costs)))
        starts = balanced_boundaries(costs, stages)
        best = min(
            slowest_stage(costs, list(cut))
            for cut in itertools.combinations(range(1, len(costs)), stages - 1)
        )
        assert len(starts) == stages - 1 and starts == sorted(set(starts)) and starts[0] > 0
        assert slowest_stage(costs, starts) == pytest.approx(best)


def test_measuring_costs_leaves_weights_statistics_and_random_stream_alone():
    backbone = tiny_backbone()
    state = copy.deepcopy(backbone.state_dict())
    torch.manual_seed(3)
    costs = measure_unit_costs(pipeline_units(backbone), torch.randn(4, 3, *SIZE), repeats=1)
    after = torch.rand(1)
    torch.manual_seed(3)
    torch.randn(4, 3, *SIZE)
    assert torch.equal(after, torch.rand(1))
    assert len(costs) == len(pipeline_units(backbone)) and all(cost > 0 for cost in costs)
    for name, tensor in backbone.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_bad_split_settings_are_one_line_errors():
    units = pipeline_units(tiny_backbone())
    with pytest.raises(FacetrainError, match="no module 'layer9'"):
        boundaries_from_split_points(units, ["layer9"], 2)
    with pytest.raises(FacetrainError, match="need 2"):
        boundaries_from_split_points(units, ["stage2"], 3)
    with pytest.raises(FacetrainError, match="in model order"):
        boundaries_from_split_points(units, ["stage3", "stage2"], 3)
    with pytest.raises(FacetrainError, match="in model order"):
        boundaries_from_split_points(units, ["stem"], 2)
    with pytest.raises(FacetrainError, match="not a chain"):
        pipeline_units(nn.Linear(2, 2))
    with pytest.raises(FacetrainError, match="cannot split"):
        balanced_boundaries([1.0, 2.0], 3)


def test_rank_layout_puts_replicas_of_a_stage_on_consecutive_ranks():
    def layout(world_size: int, pp: int) -> list[tuple[int, int]]:
        cpu = torch.device("cpu")
        grid = [ParallelDims(world_size, rank, rank, cpu, pp) for rank in range(world_size)]
        return [(dims.stage_index, dims.dp_rank) for dims in grid]

    assert layout(4, 2) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert layout(3, 3) == [(0, 0), (1, 0), (2, 0)]


def mesh_groups_worker(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    dims = init_parallel(pipeline_stages=2)
    return {
        "pp": dist.get_process_group_ranks(dims.pp_group),
        "dp": dist.get_process_group_ranks(dims.dp_group),
        "writes_backbone": dims.writes_backbone,
        "last": dims.is_last_stage,
    }


def test_the_device_mesh_builds_pipeline_and_data_parallel_groups_on_the_layout():
    groups = run_distributed(mesh_groups_worker, 4)
    assert [g["pp"] for g in groups] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [g["dp"] for g in groups] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [g["writes_backbone"] for g in groups] == [True, False, True, False]
    assert [g["last"] for g in groups] == [False, False, True, True]


# ---- pipelined steps over spawned gloo ranks ---------------------------------------------------


def pipelined_step_worker(rank: int, world_size: int, cfg: ParallelConfig) -> dict:
    from facetrain.parallel.pipeline import PipelineRuntime

    backbone = tiny_backbone()
    reference = copy.deepcopy(backbone)
    dims = init_parallel(pipeline_stages=cfg.pipeline_stages)
    runtime = PipelineRuntime(backbone, cfg, dims, (BATCH, 3, *SIZE))
    batches = [replica_batch(replica) for replica in range(dims.dp)]
    images, labels = batches[dims.dp_rank]
    result = {"stage": dims.stage_index, "names": [name for name, _ in runtime.named_parameters()]}
    runtime.stage.eval()
    reference.eval()
    # eval mode: BN uses running statistics, so the reference is the plain full-batch model;
    # train mode: BN normalises each micro-batch, so the reference accumulates over micro-batches.
    for mode, reference_microbatches in (("eval", 1), ("train", cfg.microbatches)):
        training = mode == "train"
        runtime.stage.train(training)
        reference.train(training)
        runtime.stage.zero_grad()
        loss, _ = runtime.step(images, labels, projected_head)
        expected_losses, expected_grads = reference_step(reference, batches, reference_microbatches)
        result[f"{mode}_loss_error"] = abs(loss.item() - expected_losses[dims.dp_rank])
        result[f"{mode}_grad_error"] = max(
            (p.grad - expected_grads[name]).abs().max().item() for name, p in runtime.named_parameters()
        )
    max_norm = 0.5  # below the gradient's norm, so clipping scales every stage
    norm = runtime.clip_grad_norm_(max_norm)
    expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    result["clip_norm_error"] = abs(norm.item() - expected_norm.item()) / expected_norm.item()
    result["clip_norm_above_max"] = expected_norm.item() > max_norm
    result["clipped_grad_error"] = max(
        (p.grad - reference.get_parameter(name).grad).abs().max().item()
        for name, p in runtime.named_parameters()
    )
    return result


@pytest.mark.parametrize(
    "stages, replicas, schedule, microbatches, split_points",
    [(2, 1, "gpipe", 4, ["stage2.conv"]), (2, 2, "1f1b", 2, [])],
    ids=["S2-D1-gpipe-explicit-split", "S2-D2-1f1b-balanced"],
)
def test_pipelined_step_equals_the_unsplit_model(stages, replicas, schedule, microbatches, split_points):
    cfg = ParallelConfig(
        pipeline_stages=stages, microbatches=microbatches, schedule=schedule, split_points=split_points
    )
    results = run_distributed(pipelined_step_worker, stages * replicas, cfg)
    assert [r["stage"] for r in results] == [rank // replicas for rank in range(stages * replicas)]
    everything = [name for name, _ in tiny_backbone().named_parameters()]
    assert sorted(sum((results[s * replicas]["names"] for s in range(stages)), [])) == sorted(everything)
    for rank, result in enumerate(results):
        for key in (
            "eval_loss_error",
            "eval_grad_error",
            "train_loss_error",
            "train_grad_error",
        ):
            assert result[key] < TOLERANCE, (rank, key, result[key])


def sharded_head_worker(rank: int, world_size: int, cfg: ParallelConfig) -> dict:
    from facetrain.heads import ShardedMarginHead
    from facetrain.parallel.pipeline import PipelineRuntime

    backbone = tiny_backbone()
    reference = copy.deepcopy(backbone)
    dims = init_parallel(pipeline_stages=cfg.pipeline_stages)
    runtime = PipelineRuntime(backbone, cfg, dims, (BATCH, 3, *SIZE))
    images, labels = replica_batch(dims.dp_rank)
    result: dict = {"stage": dims.stage_index}

    def head() -> ShardedMarginHead:
        torch.manual_seed(11 + dims.dp_rank)
        return ShardedMarginHead(CLASSES, EMBEDDING, margin="arcface", scale=16.0, group=dims.dp_group)

    loss_fn = head() if dims.is_last_stage else None
    loss, accuracy = runtime.step(images, labels, loss_fn)
    result["loss"] = loss.item()
    result["accuracy"] = accuracy.item()
    result["grads"] = {name: p.grad.clone() for name, p in runtime.named_parameters()}
    if dims.is_last_stage:
        reference_head = head()
        # The unsplit model as the trainer runs it: the head's loss is the mean over all replicas'
        # batches, and each rank's embeddings get N times their share, which DDP averages over replicas.
        total, hits = 0.0, 0.0
        for image_mb, label_mb in zip(images.chunk(cfg.microbatches), labels.chunk(cfg.microbatches)):
            part, part_accuracy = reference_head(reference(image_mb), label_mb)
            (part / cfg.microbatches).backward()
            total += part.item() / cfg.microbatches
            hits += part_accuracy.item() / cfg.microbatches
        for p in reference.parameters():
            collectives.all_reduce_(p.grad, "sum", dims.dp_group).div_(dims.dp)
        result["expected_loss"] = total
        result["expected_accuracy"] = hits
        result["expected_grads"] = {name: p.grad for name, p in reference.named_parameters()}
        result["head_grad_error"] = (loss_fn.weight.grad - reference_head.weight.grad).abs().max().item()
    return result


def test_pipelined_step_with_the_sharded_head_on_the_last_stage():
    stages, replicas = 2, 2
    cfg = ParallelConfig(pipeline_stages=stages, microbatches=2, schedule="gpipe", split_points=["stage3"])
    results = run_distributed(sharded_head_worker, stages * replicas, cfg)
    last = results[-1]
    for rank, result in enumerate(results):
        assert abs(result["loss"] - last["expected_loss"]) < TOLERANCE, rank
        assert result["accuracy"] == pytest.approx(last["expected_accuracy"]), rank
        for name, grad in result["grads"].items():
            assert (grad - last["expected_grads"][name]).abs().max().item() < TOLERANCE, (rank, name)
        if result["stage"] == stages - 1:
            assert result["head_grad_error"] < TOLERANCE


def test_bad_pipeline_settings_are_one_line_config_errors():
    def config(**parallel) -> Config:
        return Config(train=TrainConfig(batch_size=BATCH), parallel=ParallelConfig(**parallel))

    cases = [
        (config(pipeline_stages=2, microbatches=3), 2, "parallel.microbatches = 3: must divide"),
        (
            config(pipeline_stages=4, microbatches=2, schedule="1f1b"),
            4,
            "must be >= parallel.pipeline_stages",
        ),
        (config(pipeline_stages=2, microbatches=2, schedule="zigzag"), 2, "parallel.schedule = 'zigzag'"),
        (config(pipeline_stages=2), 3, "must divide the world size 3"),
    ]
    for cfg, world_size, message in cases:
        with pytest.raises(FacetrainError, match=message):
            validate(cfg, world_size=world_size)
