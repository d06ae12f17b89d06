"""A pipeline of channels-last stages: activations and their gradients cross ranks unscrambled."""

from __future__ import annotations

import pytest

from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.dims import init_parallel
from tests.support.distributed import run_distributed
from tests.support.pipeline_models import (
    BATCH,
    SIZE,
    TOLERANCE,
    projected_head,
    reference_step,
    replica_batch,
    tiny_backbone,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def channels_last_worker(rank: int, world_size: int, cfg: ParallelConfig) -> dict:
    from facetrain.parallel.pipeline import PipelineRuntime

    reference = tiny_backbone()  # the same channels-last model, whole, in one process
    backbone = tiny_backbone()
    for model in (reference, backbone):
        model.set_channels_last(True)
    dims = init_parallel(pipeline_stages=cfg.pipeline_stages)
    runtime = PipelineRuntime(backbone, cfg, dims, (BATCH, 3, *SIZE))
    images, labels = replica_batch(0)
    loss, _ = runtime.step(images, labels, projected_head)
    expected_losses, expected_grads = reference_step(reference, [(images, labels)], cfg.microbatches)
    result = {"loss_error": abs(loss.item() - expected_losses[0])}
    result["grad_error"] = max(
        (p.grad - expected_grads[name]).abs().max().item() for name, p in runtime.named_parameters()
    )
    return result


@pytest.mark.parametrize("split_point", ["stage2", "stage2.conv"], ids=["between-stages", "inside-a-stage"])
def test_channels_last_pipeline_equals_the_single_process_model(split_point):
    cfg = ParallelConfig(pipeline_stages=2, microbatches=2, schedule="gpipe", split_points=[split_point])
    results = run_distributed(channels_last_worker, 2, cfg)
    for rank, result in enumerate(results):
        for key in ("loss_error", "grad_error"):
            assert result[key] < TOLERANCE, (rank, key, result[key])
