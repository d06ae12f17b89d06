"""The samplers by name (`data.sampler`): each deals a rank its share of every optimizer step.

Ranks are plain integers here, as in `facetrain.data.samplers`; a training set too small for one step
is refused on every rank alike (`EveryRankError`).
"""

from __future__ import annotations

import torch

from facetrain.data.samplers import IdentitySampler, ResumableDistributedSampler
from facetrain.errors import EveryRankError
from facetrain.registry import Registry

SAMPLERS: Registry[torch.utils.data.Sampler] = Registry("sampler")


@SAMPLERS.register("distributed")
def _distributed(
    dataset,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    accumulation: int = 1,
    images_per_identity: int = 4,
):
    if len(dataset) // world_size < batch_size:
        raise EveryRankError(no_full_batch(len(dataset), world_size, batch_size))
    step_samples = batch_size * world_size * accumulation
    if len(dataset) < step_samples:
        raise EveryRankError(
            f"the training set gives no full step: {len(dataset)} images, fewer than the {step_samples} of "
            f"one step (train.batch_size {batch_size} x {_ranks(world_size)} x {accumulation} accumulated "
            "micro-batches); lower train.global_batch or optim.grad_accumulation, or add images"
        )
    return ResumableDistributedSampler(
        len(dataset), rank, world_size, seed=seed, batch_size=batch_size, step_samples=step_samples
    )


def no_full_batch(images: int, ranks: int, batch_size: int) -> str:
    """Why a training set of `images` split over `ranks` cannot fill one batch a rank, and the fixes."""
    per_rank = images // ranks
    fixes = [f"set train.batch_size={per_rank} or less"] if per_rank else []
    if ranks > 1 and images >= batch_size:
        fixes.append(f"train on at most {_ranks(images // batch_size)}")
    fixes.append("add images")
    return (
        f"the training set gives no full batch per rank: {images} images over {_ranks(ranks)} is "
        f"{per_rank} a rank, fewer than train.batch_size {batch_size}; " + ", or ".join(fixes)
    )


def _ranks(count: int) -> str:
    return f"{count} rank{'s' if count > 1 else ''}"


@SAMPLERS.register("identity")
def _identity(
    dataset,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    accumulation: int = 1,
    images_per_identity: int = 4,
):
    step_samples = batch_size * world_size * accumulation
    return IdentitySampler(
        dataset.labels, batch_size, images_per_identity, rank, world_size, seed, step_samples
    )
